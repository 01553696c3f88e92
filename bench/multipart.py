"""Same-run benchmark of the gateway's multipart/form-data parsing: its hand-written framing
(services/gateway/multipart.py, what the gateway runs) against the `multipart` package's push
parser with the same part policy on top (bench/multipart_library.py), on the bodies a
submission sends: params JSON plus an image of each size, laid out as aiohttp's client
writes them. Both sides parse every body alternately, in several rounds; the table shows the
best round's microseconds per body (the least disturbed by other load) and the median.

Usage: python -m bench.multipart [--rounds 7] [--min-time 0.2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import multipart as mp

from bench import multipart_library
from splatq.services.gateway import multipart

Parser = Callable[[bytes, bytes], list[multipart.FormPart]]
PARSERS: dict[str, Parser] = {
    "hand-written (gateway)": multipart.parse_form,
    f"multipart {mp.__version__}": multipart_library.parse_form,
}
BOUNDARY = b"----splatqbench7c1f0e"
SIZES = {"small (1 KiB image)": 1024, "medium (64 KiB)": 64 * 1024,
         "large (2 MiB)": 2 * 1024 * 1024, "max (20 MiB)": 20 * 1024 * 1024}  # fmt: skip


def body(image_size: int) -> bytes:
    image = os.urandom(image_size)
    return (
        b"--" + BOUNDARY + b"\r\n"
        b'Content-Type: application/json\r\nContent-Disposition: form-data; name="params"\r\n'
        b"\r\n" + b'{"quality":"preview","metadata":{"scene":"bench"}}' + b"\r\n"
        b"--" + BOUNDARY + b"\r\n"
        b"Content-Type: image/png\r\n"
        b'Content-Disposition: form-data; name="image"; filename="scene-1.png"\r\n'
        b"\r\n" + image + b"\r\n--" + BOUNDARY + b"--\r\n"
    )


def per_call_us(parse: Parser, data: bytes, min_time: float) -> float:
    n, elapsed = 1, 0.0
    while True:
        started = time.perf_counter()
        for _ in range(n):
            parse(data, BOUNDARY)
        elapsed = time.perf_counter() - started
        if elapsed >= min_time:
            return elapsed / n * 1e6
        n *= 2


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--min-time", type=float, default=0.2)
    args = ap.parse_args()
    names = list(PARSERS)
    print(f"| body | {' | '.join(f'{p} best / median µs' for p in names)} | ratio |")
    print(f"|---|{'---|' * len(PARSERS)}---|")
    for label, size in SIZES.items():
        data = body(size)
        expected = multipart.parse_form(data, BOUNDARY)
        assert all(p(data, BOUNDARY) == expected for p in PARSERS.values())
        samples: dict[str, list[float]] = {name: [] for name in PARSERS}
        for _ in range(args.rounds):
            for name, parse in PARSERS.items():
                samples[name].append(per_call_us(parse, data, args.min_time))
        best = {name: min(s) for name, s in samples.items()}
        cells = " | ".join(
            f"{best[n]:,.1f} / {statistics.median(samples[n]):,.1f}" for n in PARSERS
        )
        print(f"| {label} | {cells} | {best[names[1]] / best[names[0]]:.2f} |")


if __name__ == "__main__":
    main()
