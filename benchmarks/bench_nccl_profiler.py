"""NCCL profiler plugin benchmark: builds ``bench_nccl_profiler.c`` against the library.

Prints what the profiler events NCCL sends per collective cost (median / p99 /
p99.9 ns, timer included; without and with a listener; one thread, four threads
on their own communicators, four on one): for a collective on one channel, its
startEvent + stopEvent pair and its KernelCh child's start + record + stop
(where it is done); for one on two channels, the whole set. Every collective
gets its KernelCh children, as from NCCL, so each is done and frees its event
slot; the report says how many the plugin did not track (0 expected). Plus the
machine it ran on. Aim: median < 100 ns per pair, every collective tracked.
``--json`` prints the raw records instead.
Usage: .venv/bin/python -m benchmarks.bench_nccl_profiler [--pairs N] [--json]
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
LIBRARY = PLUGIN / "build" / "libnccl-profiler-railover.so"
SCENARIOS = ("no_agent", "agent_1t", "agent_4t", "agent_4t_1c")
KERNEL_CH = "/kernel_ch"  # suffix of the record timing a scenario's KernelCh child
WITH_CHANNELS = "agent_1t_2ch"


def build(out_dir: Path) -> Path:
    subprocess.run(["make", "-s", "-C", str(PLUGIN), "build/libnccl-profiler-railover.so"],
                   check=True)  # fmt: skip
    exe = out_dir / "bench_nccl_profiler"
    subprocess.run(
        ["cc", "-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-pthread",
         f"-I{PLUGIN / 'include'}", f"-I{PLUGIN / 'tests'}",
         str(Path(__file__).with_suffix(".c")), str(LIBRARY),
         f"-Wl,-rpath,{LIBRARY.parent}", "-o", str(exe)],
        check=True,
    )  # fmt: skip
    return exe


def run(pairs: int) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as tmp:
        exe = build(Path(tmp))
        out = subprocess.run([str(exe), str(pairs)], check=True, capture_output=True, text=True)
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def report(records: list[dict[str, Any]]) -> str:
    by = {r["scenario"]: r for r in records}

    def row(name: str, r: dict[str, Any], note: str = "") -> str:
        return (
            f"{name:<22} {r['pairs']:>9} {r['median_ns']:>7} {r['p99_ns']:>7} "
            f"{r['p999_ns']:>7} {r['max_ns']:>10} {r['pairs_over_10us']:>6} "
            f"{r['untracked']:>9}{note}"
        )

    lines = [
        f"machine: {benchlib.machine()}",
        f"timer pair overhead (median, included below): {by['timer_overhead']['median_ns']} ns",
        f"{'scenario':<22} {'pairs':>9} {'median':>7} {'p99':>7} {'p99.9':>7} {'max':>10} "
        f"{'>10us':>6} {'untracked':>9}  (ns per start+stop pair, timer included)",
    ]
    for name in SCENARIOS:
        lines.append(row(name, by[name], "  (the collective's pair)"))
        lines.append(row(name + KERNEL_CH, by[name + KERNEL_CH], "  (its KernelCh child)"))
    lines.append(
        row(
            WITH_CHANNELS,
            by[WITH_CHANNELS],
            "  (a collective on 2 channels: its pair and 2 KernelCh)",
        )
    )
    pairs = [*SCENARIOS, *(n + KERNEL_CH for n in SCENARIOS)]
    worst = max(by[n]["median_ns"] for n in pairs)
    untracked = sum(by[n]["untracked"] for n in [*SCENARIOS, WITH_CHANNELS])
    lines.append(f"aim median < 100 ns: {'met' if worst < 100 else 'NOT met'} (worst {worst} ns)")
    lines.append(
        f"every collective tracked: {'yes' if untracked == 0 else f'NO ({untracked} untracked)'}"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--pairs", type=int, default=1_000_000, help="collectives per thread")
    parser.add_argument("--json", action="store_true", help="print raw records")
    args = parser.parse_args()
    records = run(args.pairs)
    if args.json:
        print(json.dumps({"machine": benchlib.machine(), "records": records}, indent=2))
    else:
        print(report(records))


if __name__ == "__main__":
    main()
