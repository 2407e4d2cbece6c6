"""Native plugin benchmark: builds ``bench_plugin.c`` against the library and runs it.

Prints the cost of one report call (median / p99 / p99.9 ns, with and without a
listener, 1 and 4 producer threads) and the sustained delivered message rate, plus
the machine it ran on. ``--json`` prints the raw records instead.
Usage: .venv/bin/python -m benchmarks.bench_plugin [--calls N] [--json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from benchmarks import benchlib

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = ROOT / "native_plugin"


def build(out_dir: Path) -> Path:
    subprocess.run(["make", "-s", "-C", str(PLUGIN)], check=True)
    exe = out_dir / "bench_plugin"
    lib_dir = PLUGIN / "build"
    subprocess.run(
        ["cc", "-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-pthread",
         f"-I{PLUGIN / 'include'}", str(Path(__file__).with_suffix(".c")),
         f"-L{lib_dir}", "-lrailover_plugin", f"-Wl,-rpath,{lib_dir}", "-o", str(exe)],
        check=True,
    )  # fmt: skip
    return exe


def run(calls: int) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as tmp:
        exe = build(Path(tmp))
        out = subprocess.run([str(exe), str(calls)], check=True, capture_output=True, text=True)
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def report(records: list[dict[str, Any]]) -> str:
    by = {r["scenario"]: r for r in records}
    timer = by["timer_overhead"]["median_ns"]
    lines = [
        f"machine: {benchlib.machine()}",
        f"timer pair overhead (median, included below): {timer} ns",
        f"{'scenario':<12} {'calls':>9} {'median':>7} {'p99':>7} {'p99.9':>7} {'max':>10} "
        f"{'>10us':>6}  (ns per call, timer included)",
    ]
    for name in ("no_agent", "agent_1t", "agent_4t"):
        r = by[name]
        lines.append(
            f"{name:<12} {r['calls']:>9} {r['median_ns']:>7} {r['p99_ns']:>7} "
            f"{r['p999_ns']:>7} {r['max_ns']:>10} {r['calls_over_10us']:>6}"
        )
    for name in ("agent_1t_delivery", "agent_4t_delivery"):
        r = by[name]
        total = r["sent"] + r["dropped_ring_full"]
        lines.append(f"{name}: {r['sent']} sent, {r['dropped_ring_full'] / total:.1%} ring-full")
    s = by["sustained"]
    lines.append(
        f"sustained (1 producer flat out): {s['calls_per_s'] / 1e6:.1f} M calls/s, "
        f"{s['delivered_per_s'] / 1e6:.2f} M frames/s delivered "
        f"({s['delivered_MB_per_s']:.0f} MB/s), "
        f"{s['dropped_ring_full'] / s['calls']:.1%} dropped ring-full"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--calls", type=int, default=1_000_000, help="calls per scenario")
    parser.add_argument("--json", action="store_true", help="print raw records")
    args = parser.parse_args()
    records = run(args.calls)
    if args.json:
        print(json.dumps({"machine": benchlib.machine(), "records": records}, indent=2))
    else:
        print(report(records))


if __name__ == "__main__":
    main()
