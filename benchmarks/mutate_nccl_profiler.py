"""Hand-made mutants of the NCCL profiler's completion counting (issue 32).

mutmut mutates Python only, so this changes one condition or constant at a time in
native_plugin/src/nccl_profiler.c, builds the library from the mutant into a scratch
folder and runs the two C harnesses against it (test_nccl_profiler, linked by
$ORIGIN, and test_nccl_loader, which dlopens the path it is given). A mutant the
harnesses pass "survives". Results go under "Test strength" in benchmarks/RESULTS.md
(by hand).

    .venv/bin/python -m benchmarks.mutate_nccl_profiler          # every mutant
    .venv/bin/python -m benchmarks.mutate_nccl_profiler M5 M13   # some of them

Needs `make -C native_plugin build/test_nccl_profiler build/test_nccl_loader` first.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = ROOT / "native_plugin"
SOURCE = PLUGIN / "src" / "nccl_profiler.c"
LIB = "libnccl-profiler-railover.so"
TIMEOUT_S = 300
# A mutant that never reports fails after this many seconds of waiting, not 120.
ENV = {**os.environ, "RAILOVER_TEST_WAIT_S": "15"}

# name -> (text in nccl_profiler.c, its replacement, what the change means)
MUTANTS: dict[str, tuple[str, str, str]] = {
    "M1": (
        "n_channels ? n_channels : 1u",
        "n_channels ? n_channels : 0u",
        "no child reserved for a collective announced with no channels",
    ),
    "M2": (
        "!c->track_kernel ? 0u",
        "!c->track_kernel ? 1u",
        "a child reserved when KernelCh events were not asked for",
    ),
    "M3": (
        "if (s & (ST_OPEN | ST_BUSY)) continue;",
        "if (s & ST_OPEN) continue;",
        "a slot being claimed looks free",
    ),
    "M4": (
        "ST_OPEN | (1u + expect)",
        "ST_OPEN | (expect)",
        "the collective's own stop not counted",
    ),
    "M5": (
        "return (s & ST_OPEN) && (ST_GEN(s) & TAG_MASK) ==",
        "return (s & ST_OPEN) && 1 ? 1 : (ST_GEN(s) & TAG_MASK) ==",
        "handles' generation not checked",
    ),
    "M6": (
        "return (s & ST_OPEN) && (ST_GEN(s) & TAG_MASK) ==",
        "return (ST_GEN(s) & TAG_MASK) ==",
        "a closed slot's handle still matches",
    ),
    "M7": (
        "if (ST_KIDS(s) >= atomic_load_explicit(&e->expect, memory_order_relaxed)) next += 1;",
        "if (ST_KIDS(s) > atomic_load_explicit(&e->expect, memory_order_relaxed)) next += 1;",
        "the first unannounced child takes a reserved stop",
    ),
    "M8": (
        "memory_order_relaxed)) next += 1;",
        "memory_order_relaxed)) next += 0;",
        "unannounced children take no stop",
    ),
    "M9": (
        "if (ST_KIDS(s) < ST_KIDS_MAX) next += UINT64_C(1) << ST_KIDS_SHIFT;",
        "",
        "children started not counted",
    ),
    "M10": (
        "if (ST_PENDING(s) > 1) {",
        "if (ST_PENDING(s) > 0) {",
        "the last stop does not complete",
    ),
    "M11": ("if (ST_PENDING(s) > 1) {", "if (ST_PENDING(s) > 2) {", "the last two stops complete"),
    "M12": (
        "if (!handle_matches(s, handle) || ST_PENDING(s) == 0) {",
        "if (!handle_matches(s, handle)) {",
        "no floor on the pending stops",
    ),
    "M13": (
        "atomic_max(&c->done_ticket, ticket + 1);",
        "atomic_max(&c->done_ticket, ticket);",
        "a collective's completion does not vouch for the one before it",
    ),
    "M14": (
        "if (ticket < atomic_load_explicit(&c->done_ticket",
        "if (ticket <= atomic_load_explicit(&c->done_ticket",
        "the newest open collective closed by the last one done",
    ),
    "M15": (
        "if (ticket < atomic_load_explicit(&c->done_ticket",
        "if (0 && ticket < atomic_load_explicit(&c->done_ticket",
        "no collective closed by a later one's completion",
    ),
    "M16": (
        "if (parent == NULL || ((uintptr_t)parent & CHILD_TAG)) return RVN_SUCCESS;",
        "if (parent == NULL) return RVN_SUCCESS;",
        "a child handle taken as a parent",
    ),
    "M17": (
        "| ((gen & TAG_MASK) << TAG_SHIFT) |",
        "| ((gen & 0) << TAG_SHIFT) |",
        "no generation in handles",
    ),
    "M18": (
        "if (r->stall_ns <= 0) continue;",
        "if (r->stall_ns < 0) continue;",
        "stall reports with RAILOVER_NCCL_STALL_MS=0 (off)",
    ),
    "M19": (
        "ST_PENDING(s) == ST_PENDING_MAX)) {",
        "0)) {",
        "no cap on children (65,535 pending stops)",
    ),
    "M20": (
        "atomic_fetch_add_explicit(&c->implied_done, 1, memory_order_relaxed);",
        "",
        "closed collectives not counted for the finalize log",
    ),
    "M21": (
        "uint32_t expect = !c->track_kernel",
        "uint32_t expect = 1 || !c->track_kernel",
        "children reserved whatever was asked for",
    ),
}


def build(source: str, out: Path) -> None:
    """The library from `source` at out/build/LIB, where test_nccl_profiler looks."""
    src = out / "nccl_profiler.c"
    src.write_text(source)
    (out / "build").mkdir()
    subprocess.run(
        [
            "gcc",
            "-std=c11",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-fPIC",
            "-pthread",
            "-O2",
            f"-I{PLUGIN / 'include'}",
            f"-I{PLUGIN / 'src'}",
            "-shared",
            "-fvisibility=hidden",
            "-Wl,-z,nodelete",
            "-o",
            str(out / "build" / LIB),
            str(src),
            str(PLUGIN / "src" / "ring.c"),
        ],
        check=True,
        capture_output=True,
    )


def killed(out: Path) -> str | None:
    """Which harness failed on the library in `out`, or None if both passed."""
    # test_nccl_profiler names the library by the relative path it was linked with.
    runs = {
        "test_nccl_profiler": [str(PLUGIN / "build" / "test_nccl_profiler"), "2000"],
        "test_nccl_loader": [str(PLUGIN / "build" / "test_nccl_loader"), str(out / "build" / LIB)],
    }
    for name, cmd in runs.items():
        try:
            done = subprocess.run(
                cmd, cwd=out, env=ENV, capture_output=True, timeout=TIMEOUT_S, check=False
            )
        except subprocess.TimeoutExpired:
            return f"{name} (timed out)"
        if done.returncode != 0:
            return name
    return None


def main(argv: list[str]) -> int:
    original = SOURCE.read_text()
    with tempfile.TemporaryDirectory(prefix="rvn-mutant-") as tmp:
        build(original, Path(tmp))
        if (by := killed(Path(tmp))) is not None:
            print(f"the unmutated library fails {by}: fix that first")
            return 2
    names = argv or list(MUTANTS)
    survivors = []
    for name in names:
        old, new, meaning = MUTANTS[name]
        if original.count(old) != 1:
            print(f"{name}: the text to change is not in the source once", flush=True)
            return 2
        with tempfile.TemporaryDirectory(prefix="rvn-mutant-") as tmp:
            build(original.replace(old, new), Path(tmp))
            by = killed(Path(tmp))
        print(f"{name}: {'killed by ' + by if by else 'SURVIVED'}  ({meaning})", flush=True)
        if by is None:
            survivors.append(name)
    print(f"{len(names) - len(survivors)} of {len(names)} killed; survivors: {survivors}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
