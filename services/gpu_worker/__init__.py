"""The GPU worker (batched image-to-Gaussians inference on the engine's worker runtime).

The model and the artifact writer arrive with issue #4; the runtime lives in `shared.worker`.
"""
