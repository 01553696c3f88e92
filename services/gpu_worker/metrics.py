"""Prometheus metrics of the GPU worker: batches, queue wait, inference time, outcomes by
error code, device memory and Gaussians per job. Definitions only."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram


@dataclass(frozen=True, slots=True)
class GpuMetrics:
    batch_size: Histogram
    queue_wait: Histogram
    inference_seconds: Histogram
    job_errors: Counter
    oom_splits: Counter
    device_memory_bytes: Gauge
    device_memory_peak_bytes: Gauge
    gaussians_per_job: Histogram

    @classmethod
    def create(cls, registry: CollectorRegistry = REGISTRY) -> GpuMetrics:
        q = ["quality"]
        return cls(
            batch_size=Histogram(
                "splatq_gpu_batch_size",
                "Jobs per forward pass",
                q,
                buckets=(1, 2, 4, 8, 16, 32, 64),
                registry=registry,
            ),
            queue_wait=Histogram(
                "splatq_gpu_batch_wait_duration_seconds",
                "Time a job waited in the batcher",
                q,
                buckets=(0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1, 5),
                registry=registry,
            ),
            inference_seconds=Histogram(
                "splatq_gpu_inference_duration_seconds",
                "Forward pass time per batch",
                q,
                buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
                registry=registry,
            ),
            job_errors=Counter(
                "splatq_gpu_job_errors_total",
                "Failed GPU jobs by error code",
                ["code"],
                registry=registry,
            ),
            oom_splits=Counter(
                "splatq_gpu_oom_splits_total",
                "Batches split in halves after a device OOM",
                q,
                registry=registry,
            ),
            device_memory_bytes=Gauge(
                "splatq_gpu_device_memory_bytes", "CUDA memory allocated now", registry=registry
            ),
            device_memory_peak_bytes=Gauge(
                "splatq_gpu_device_memory_peak_bytes",
                "Peak CUDA memory allocated",
                registry=registry,
            ),
            gaussians_per_job=Histogram(
                "splatq_gpu_gaussians_per_job",
                "Gaussians in a job's output",
                q,
                buckets=(1e3, 4e3, 16e3, 33e3, 65e3, 131e3, 262e3, 524e3, 1.05e6),
                registry=registry,
            ),
        )
