"""The GPU worker (batched image-to-Gaussians inference on the engine's worker runtime).

The model and the artifact writer live here; the runtime lives in
`splatq.shared.engine.worker`.
"""
