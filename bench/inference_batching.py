"""Batched inference throughput of the reconstruction model on the current device: jobs/s and
p50/p99 batch latency at batch sizes 1..32, preview and full, and the batched/unbatched ratio.

Usage: python -m bench.inference_batching [--device auto|cpu|cuda] [--sizes 1,2,4,8,16,32]
       [--qualities preview,full] [--min-seconds 2] [--model builtin] [--with-artifacts]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

from splatq.services.gpu_worker.artifacts import encode_artifacts
from splatq.services.gpu_worker.handler import select_device
from splatq.services.gpu_worker.images import decode_image
from splatq.services.gpu_worker.model import ReconstructionModel, load_model
from splatq.services.gpu_worker.samples import sample_image


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _inputs(resolution: int, n: int) -> torch.Tensor:
    """n distinct images (different seeds), decoded the way jobs are."""
    import io  # noqa: PLC0415

    images = []
    for i in range(n):
        buf = io.BytesIO()
        sample_image(256, seed=i).save(buf, format="PNG")
        images.append(decode_image(buf.getvalue(), resolution))
    return torch.stack(images)


def measure(
    model: ReconstructionModel,
    device: torch.device,
    quality: str,
    batch: int,
    min_seconds: float,
    with_artifacts: bool,
) -> tuple[float, float, float]:
    """(jobs/s, p50 batch latency s, p99 batch latency s) over at least `min_seconds`."""
    res = model.input_resolution(quality)
    images = _inputs(res, batch).to(device)
    camera = model.input_camera(res)
    with torch.inference_mode():
        model.infer(images)  # warm-up (kernels, allocator)
        _sync(device)
        times: list[float] = []
        start = time.perf_counter()
        while time.perf_counter() - start < min_seconds or len(times) < 3:
            t0 = time.perf_counter()
            out = model.infer(images)
            if with_artifacts:
                for g in out:
                    encode_artifacts(g, camera)
            _sync(device)
            times.append(time.perf_counter() - t0)
    times.sort()
    p99 = times[min(len(times) - 1, round(0.99 * (len(times) - 1)))]
    return batch / statistics.mean(times), statistics.median(times), p99


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="auto")
    p.add_argument("--sizes", default="1,2,4,8,16,32")
    p.add_argument("--qualities", default="preview,full")
    p.add_argument("--min-seconds", type=float, default=2.0)
    p.add_argument("--model", default="builtin")
    p.add_argument(
        "--with-artifacts",
        action="store_true",
        help="include PLY/.splat encoding and the preview render per job",
    )
    args = p.parse_args()
    device = select_device(args.device)
    model = load_model(args.model)
    model.load(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()
    print(
        f"model {model.version} on {device} ({name}), torch {torch.__version__}, "
        f"{torch.get_num_threads()} CPU threads"
        + (", with artifacts" if args.with_artifacts else ", forward pass only")
    )
    sizes = [int(s) for s in args.sizes.split(",")]
    for quality in args.qualities.split(","):
        print(f"\n{quality} ({model.input_resolution(quality)}²)\n")
        print("| batch | jobs/s | p50 batch ms | p99 batch ms | vs batch 1 |")
        print("|---:|---:|---:|---:|---:|")
        base = 0.0
        for b in sizes:
            try:
                rate, p50, p99 = measure(
                    model, device, quality, b, args.min_seconds, args.with_artifacts
                )
            except torch.cuda.OutOfMemoryError:
                print(f"| {b} | OOM | | | |")
                break
            base = base or rate
            print(
                f"| {b} | {rate:,.1f} | {p50 * 1000:,.1f} | {p99 * 1000:,.1f} | "
                f"{rate / base:.2f}x |",
                flush=True,
            )


if __name__ == "__main__":
    main()
