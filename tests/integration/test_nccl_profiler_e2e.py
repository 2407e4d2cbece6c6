"""Stock NCCL end to end: the real profiler plugin, a real agent, the real service.

The test process stands in for NCCL: it loads libnccl-profiler-railover.so with
ctypes and calls the exported ncclProfiler_v5 table in NCCL's order: init per
communicator and rank; per collective its startEvent (announcing its channels)
and stopEvent (enqueued), then, as its kernel runs, one KernelCh child per
channel (parent: the collective) started, its stop state recorded and stopped;
finalize. With RAILOVER_NCCL_TRACK_KERNEL=0 the plugin asks for collectives
only, NCCL sends no children, and a collective counts at its stop. The plugin
talks to an in-process agent over its unix socket; the agent reports to the
service over loopback HTTP. The job declared no communicator: it learns it from
the announcements, and the API then shows it, each rank's ops_done and the one
collective left open (with kernel tracking, its kernel never finished one
channel; without, it was never stopped).
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from railover_testing import waiting
from railover_testing.agents import AgentThread, settings_for
from railover_testing.local import local_service
from railover_testing.sysfs_node import build_cluster
from scheduler_svc.config import Settings
from tests.deploy.tools import tool_missing

PLUGIN_DIR = Path(__file__).resolve().parents[2] / "native_plugin"
LIBRARY = PLUGIN_DIR / "build" / "libnccl-profiler-railover.so"
JOB = "nccl-job"
# NCCL's commId is a 64-bit hash; this one is above 2**63, as half of them are.
COMM = 0x9E3779B97F4A7C15
PAIRS = 300
CHANNELS = 2
PROFILE_COLL = 1 << 1
PROFILE_KERNEL_CH = 1 << 6
KERNEL_CH_STOP = 22  # ncclProfilerKernelChStop: recordEventState before a child's stop


class Coll(ctypes.Structure):
    # NCCL's v5 collective member, whole; the plugin reads seqNumber, func and nChannels.
    _fields_ = (
        ("seq_number", ctypes.c_uint64),
        ("func", ctypes.c_char_p),
        ("send_buff", ctypes.c_void_p),
        ("recv_buff", ctypes.c_void_p),
        ("count", ctypes.c_size_t),
        ("root", ctypes.c_int),
        ("datatype", ctypes.c_char_p),
        ("n_channels", ctypes.c_uint8),
        ("n_warps", ctypes.c_uint8),
        ("algo", ctypes.c_char_p),
        ("proto", ctypes.c_char_p),
        ("parent_group", ctypes.c_void_p),
    )


class KernelCh(ctypes.Structure):
    _fields_ = (("channel_id", ctypes.c_uint8), ("p_timer", ctypes.c_uint64))


class DescrUnion(ctypes.Union):
    # The collective is the union's largest member, so this is NCCL's size.
    _fields_ = (("coll", Coll), ("kernel_ch", KernelCh))


class DescrV5(ctypes.Structure):
    # ncclProfilerEventDescr_v5_t: type, parentObj, rank, then the union.
    _fields_ = (
        ("type", ctypes.c_uint64),
        ("parent_obj", ctypes.c_void_p),
        ("rank", ctypes.c_int),
        ("u", DescrUnion),
    )


INIT = ctypes.CFUNCTYPE(
    ctypes.c_int,
    ctypes.POINTER(ctypes.c_void_p),
    ctypes.c_uint64,
    ctypes.POINTER(ctypes.c_int),
    ctypes.c_char_p,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_void_p,
)
START = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(DescrV5)
)
STOP = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
RECORD = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_uint64)
)
FINALIZE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)


class ProfilerV5(ctypes.Structure):
    _fields_ = (
        ("name", ctypes.c_char_p),
        ("init", INIT),
        ("start_event", START),
        ("stop_event", STOP),
        ("record_event_state", RECORD),
        ("finalize", FINALIZE),
    )


@pytest.fixture(scope="module")
def profiler() -> ProfilerV5:
    if not LIBRARY.is_file():
        if shutil.which("make") is None or shutil.which("cc") is None:
            tool_missing("libnccl-profiler-railover.so is not built and there is no C toolchain")
        subprocess.run(["make", "-s", "-C", str(PLUGIN_DIR)], check=True)
    lib = ctypes.CDLL(str(LIBRARY))
    return ProfilerV5.in_dll(lib, "ncclProfiler_v5")


def wait_for(what: str, check: Callable[[], bool], detail: Callable[[], Any]) -> None:
    waiting.wait_for(what, check, 60, detail)


@pytest.fixture
def stack(db_url: str, tmp_path: Path) -> Iterator[tuple[httpx.Client, AgentThread]]:
    (node, rail_map) = build_cluster(tmp_path / "nodes", ["n0"])["n0"]
    with (
        local_service(Settings(db_url=db_url, port=0, allow_anonymous_loopback=True)) as url,
        httpx.Client(base_url=url, timeout=10) as http,
    ):
        agent = AgentThread(
            settings_for(node.root, tmp_path / "agent", url, rail_map, poll_interval_s=0.1)
        ).start()
        try:
            wait_for("the agent to register n0", lambda: bool(agent.agent.registered), dict)
            yield http, agent
        finally:
            agent.stop()


def test_descriptor_is_laid_out_as_nccls() -> None:
    # LP64 numbers from NCCL's headers (native_plugin/tests/nccl_facts.h).
    assert ctypes.sizeof(DescrV5) == 112
    assert DescrV5.u.offset + Coll.n_channels.offset == 80


@pytest.mark.parametrize("track_kernel", [True, False], ids=["kernel-ch", "collectives-only"])
def test_nccl_profiler_reports_communicators_progress_and_a_stall(
    profiler: ProfilerV5,
    stack: tuple[httpx.Client, AgentThread],
    monkeypatch: pytest.MonkeyPatch,
    track_kernel: bool,
) -> None:
    http, agent = stack
    body = {
        "job_id": JOB,
        "ranks": [{"rank": 0, "node": "n0", "gpu": 0}, {"rank": 1, "node": "n0", "gpu": 1}],
        "checkpoint_interval_s": 3600,
        "reload_s": 120,
        "timeout_s": 20,
        "last_checkpoint_at": (datetime.now(UTC) - timedelta(minutes=5)).isoformat(),
        "ccl": {
            "kind": "nccl",
            "version": "2.29.7",
            "port_failover": True,
            "merged_nics": [["mlx5_0", "mlx5_1"]],
        },
    }
    r = http.post("/v1/jobs", json=body)
    assert r.status_code == 201, r.text
    assert r.json()["ccl"]["merged_nics"] == [["mlx5_0", "mlx5_1"]]

    monkeypatch.setenv("RAILOVER_PLUGIN_SOCKET", str(agent.settings.socket))
    monkeypatch.setenv("RAILOVER_NCCL_STALL_MS", "300")
    monkeypatch.setenv("RAILOVER_NCCL_PROGRESS_MS", "20")
    monkeypatch.setenv("RAILOVER_JOB_ID", JOB)
    monkeypatch.setenv("RAILOVER_NCCL_TRACK_KERNEL", "1" if track_kernel else "0")

    # One process, two ranks of one communicator (as ncclCommInitAll makes them).
    contexts = []
    for rank in (0, 1):
        ctx = ctypes.c_void_p()
        mask = ctypes.c_int(0)
        rc = profiler.init(ctypes.byref(ctx), COMM, ctypes.byref(mask), b"world", 1, 2, rank, None)
        assert rc == 0
        assert mask.value == (PROFILE_COLL | PROFILE_KERNEL_CH if track_kernel else PROFILE_COLL)
        contexts.append(ctx)

    def start(rank: int, seq: int) -> ctypes.c_void_p:
        d = DescrV5(type=PROFILE_COLL, rank=rank)
        d.u.coll = Coll(
            seq_number=seq,
            func=b"AllReduce",
            count=1 << 20,
            datatype=b"ncclFloat32",
            n_channels=CHANNELS,
            n_warps=16,
            algo=b"Ring",
            proto=b"Simple",
        )
        handle = ctypes.c_void_p()
        assert profiler.start_event(contexts[rank], ctypes.byref(handle), ctypes.byref(d)) == 0
        assert handle.value
        return handle

    def kernel_start(rank: int, parent: ctypes.c_void_p, channel: int) -> ctypes.c_void_p:
        d = DescrV5(type=PROFILE_KERNEL_CH, parent_obj=parent, rank=rank)
        d.u.kernel_ch = KernelCh(channel_id=channel, p_timer=123456789)
        handle = ctypes.c_void_p()
        assert profiler.start_event(contexts[rank], ctypes.byref(handle), ctypes.byref(d)) == 0
        assert handle.value
        return handle

    def kernel_stop(handle: ctypes.c_void_p) -> None:
        p_timer = ctypes.c_uint64(987654321)
        assert profiler.record_event_state(handle, KERNEL_CH_STOP, ctypes.byref(p_timer)) == 0
        assert profiler.stop_event(handle) == 0

    def collective(rank: int, seq: int, finished: int = CHANNELS) -> list[ctypes.c_void_p]:
        """One collective as NCCL reports it: enqueued (its stop), then, when the
        plugin asked for them, a KernelCh child per channel as the kernel runs,
        `finished` of which stop; returns the children still running."""
        handle = start(rank, seq)
        assert profiler.stop_event(handle) == 0
        if not track_kernel:
            return []
        children = [kernel_start(rank, handle, channel) for channel in range(CHANNELS)]
        for child in children[:finished]:
            kernel_stop(child)
        return children[finished:]

    for seq in range(PAIRS):
        for rank in (0, 1):
            assert collective(rank, seq) == []
    # Left open: with kernel tracking, enqueued but its kernel never finishes
    # one channel; without, never stopped.
    if track_kernel:
        (left_open,) = collective(1, PAIRS, finished=CHANNELS - 1)
    else:
        left_open = start(1, PAIRS)

    def progress() -> dict[str, Any]:
        r = http.get(f"/v1/jobs/{JOB}/progress")
        assert r.status_code == 200, r.text
        out: dict[str, Any] = r.json()
        return out

    wait_for("the stall to reach the service", lambda: bool(progress()["stalls"]), progress)
    if track_kernel:
        kernel_stop(left_open)
    else:
        assert profiler.stop_event(left_open) == 0
    for ctx in contexts:
        assert profiler.finalize(ctx) == 0

    def ops() -> dict[int, int]:
        return {p["rank"]: p["ops_done"] for p in progress()["progress"]}

    wait_for("the last ops_done", lambda: ops() == {0: PAIRS, 1: PAIRS + 1}, progress)
    got = progress()
    # Learned from the ranks: the same comm_id from both, covering the whole job.
    assert got["communicators"] == [{"comm_id": COMM, "channels": 8, "ranks": [], "nranks": 2}]
    assert all(p["comm_id"] == COMM for p in got["progress"])
    (stall,) = got["stalls"]
    assert (stall["node"], stall["comm_id"], stall["rank"], stall["seq_number"]) == (
        "n0",
        COMM,
        1,
        PAIRS,
    )
    assert stall["func"] == "AllReduce"
    assert stall["open_s"] >= 0.3
    # Evidence on the node, not a NIC fault: nothing was decided.
    r = http.get(f"/v1/jobs/{JOB}/decisions")
    assert r.status_code == 200
    assert r.json()["decisions"] == []
    r = http.get(f"/v1/jobs/{JOB}")
    assert r.json()["communicators"] == [{"comm_id": COMM, "channels": 8, "ranks": []}]
