"""Same-run A/B of splatq's engine and gateway benchmarks between two checkouts.

Usage: python -m bench.ab --base /path/to/other/checkout [--rounds 3] [--jobs 10000]
                          [--concurrency 32] [--gateway-duration 8] [--skip-gateway]
                          [--skip-engine]

Each checkout runs its own code with its own virtual environment (`<checkout>/.venv`, made by
`make install` there). Rounds alternate A, B, A, B, ... so machine noise hits both alike; each
run is `python -m bench.engine_throughput --only splatq --rounds 1` (splatq's no-op jobs: steady
jobs/s and Redis CPU µs per job from Redis's own INFO cpu) and `python -m bench.gateway_submit
--rounds 1` (submissions/s and their share of a bare aiohttp hello in the same run). The table
gives each side's median and the ratio this checkout / base: what a change costs, measured
rather than asserted (docs/benchmarks.md records the runs).
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
_ENGINE_ROW = re.compile(r"^\| (splatq\S*)\s.*?\|\s+([\d,]+) \|", re.M)
_CPU_ROW = re.compile(r"^\s+(splatq\S*)\s+.*?([\d,]+) µs", re.M)
# The engine benchmark's per-round line since it splits enqueue and drain (the default,
# fair-scheduled splatq row, not the "(arrival order)" one); older checkouts print the two
# tables above instead.
_ROUND_ROW = re.compile(
    r"^round \d+ c=\d+: (splatq [^(\n]*?)\s+([\d,]+) jobs/s\s+redis\s+([\d,]+) µs/job$", re.M
)
_SUBMIT_ROW = re.compile(r"^\| median submit\s+\|\s+([\d,.]+) \|", re.M)
_SHARE = re.compile(r"^submit / hello \(medians\):\s+([\d.]+)%", re.M)


@dataclass
class Side:
    name: str
    root: Path
    jobs_per_s: list[float] = field(default_factory=list)
    cpu_us: list[float] = field(default_factory=list)
    submits_per_s: list[float] = field(default_factory=list)
    share: list[float] = field(default_factory=list)

    @property
    def python(self) -> str:
        return str(self.root / ".venv" / "bin" / "python")


def _number(raw: str) -> float:
    return float(raw.replace(",", ""))


def _run(side: Side, args: list[str]) -> str:
    out = subprocess.run(
        [side.python, "-m", *args], cwd=side.root, capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        raise SystemExit(f"{side.name}: {' '.join(args)} failed:\n{out.stdout}\n{out.stderr}")
    return out.stdout


def engine_round(side: Side, jobs: int, concurrency: int) -> None:
    text = _run(
        side,
        ["bench.engine_throughput", "--only", "splatq", "--rounds", "1", "--jobs", str(jobs),
         "--concurrency", str(concurrency)],
    )  # fmt: skip
    row = _ROUND_ROW.search(text)
    if row is not None:
        side.jobs_per_s.append(_number(row.group(2)))
        side.cpu_us.append(_number(row.group(3)))
        return
    rate = _ENGINE_ROW.search(text)
    cpu = _CPU_ROW.search(text)
    if rate is None or cpu is None:
        raise SystemExit(f"{side.name}: cannot read the engine benchmark's table:\n{text}")
    side.jobs_per_s.append(_number(rate.group(2)))
    side.cpu_us.append(_number(cpu.group(2)))


def gateway_round(side: Side, duration: int) -> None:
    text = _run(side, ["bench.gateway_submit", "--rounds", "1", "--duration", str(duration)])
    rate, share = _SUBMIT_ROW.search(text), _SHARE.search(text)
    if rate is None or share is None:
        raise SystemExit(f"{side.name}: cannot read the gateway benchmark's table:\n{text}")
    side.submits_per_s.append(_number(rate.group(1)))
    side.share.append(float(share.group(1)) / 100)


def _line(label: str, a: list[float], b: list[float], fmt: str) -> str:
    if not a or not b:
        return ""
    ma, mb = statistics.median(a), statistics.median(b)
    return f"| {label:<28} | {format(mb, fmt):>12} | {format(ma, fmt):>12} | {ma / mb:>6.3f} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--base", type=Path, required=True, help="the other checkout")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--gateway-duration", type=int, default=8)
    parser.add_argument("--skip-gateway", action="store_true")
    parser.add_argument("--skip-engine", action="store_true")
    args = parser.parse_args()
    head, base = Side("this checkout", HERE), Side("base", args.base.resolve())
    for r in range(args.rounds):
        for side in (base, head) if r % 2 == 0 else (head, base):
            if not args.skip_engine:
                engine_round(side, args.jobs, args.concurrency)
                print(f"round {r + 1} engine  {side.name:<14} {side.jobs_per_s[-1]:>8,.0f} "
                      f"jobs/s {side.cpu_us[-1]:>6,.0f} µs Redis CPU/job", flush=True)  # fmt: skip
            if not args.skip_gateway:
                gateway_round(side, args.gateway_duration)
                print(f"round {r + 1} gateway {side.name:<14} {side.submits_per_s[-1]:>8,.0f} "
                      f"submits/s ({side.share[-1]:.1%} of hello)", flush=True)  # fmt: skip
    print(
        f"\nA/B, {args.rounds} interleaved rounds; engine: {args.jobs} no-op jobs at "
        f"concurrency {args.concurrency}; gateway: {args.gateway_duration} s per run\n"
    )
    print(f"| {'measure':<28} | {'base':>12} | {'this':>12} | {'ratio':>6} |")
    print(f"|{'-' * 30}|{'-' * 14}|{'-' * 14}|{'-' * 8}|")
    rows = [
        _line("engine jobs/s", head.jobs_per_s, base.jobs_per_s, ",.0f"),
        _line("engine Redis CPU µs/job", head.cpu_us, base.cpu_us, ",.0f"),
        _line("gateway submits/s", head.submits_per_s, base.submits_per_s, ",.0f"),
        _line("gateway share of hello", head.share, base.share, ".3f"),
    ]
    print("\n".join(r for r in rows if r))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
