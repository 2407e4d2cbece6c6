"""The spool's edges: its files, transactions, refusals and what they log and count."""

from __future__ import annotations

import logging
import sqlite3
import stat
import threading
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from agent.events import new_event
from agent.spool import Spool


def sample(name: str, labels: dict[str, str]) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def dropped(kind: str, reason: str) -> float:
    return sample("railover_agent_events_dropped_total", {"kind": kind, "reason": reason})


def fault(device: str = "mlx5_0") -> dict[str, object]:
    return new_event("n0", "port_down", device=device, port=1)


def progress(ops: int) -> dict[str, object]:
    return new_event("n0", "progress", comm_id=1, rank=0, ops_done=ops)


def test_files_permissions_and_nested_directory(tmp_path: Path) -> None:
    directory = tmp_path / "var" / "spool" / "railover"  # none of it exists yet
    s = Spool(directory, 10)
    try:
        assert stat.S_IMODE(directory.stat().st_mode) == 0o750
        lock = directory / "lock"
        assert lock.is_file()
        assert stat.S_IMODE(lock.stat().st_mode) == 0o640
        assert s.path == directory / "spool.sqlite3"
        assert s.path.is_file()
        # WAL mode, so the agent's reader and writer do not block each other.
        with sqlite3.connect(s.path) as other:
            assert other.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert sorted(
            p.name for p in directory.iterdir() if not p.name.endswith(("-wal", "-shm"))
        ) == [
            "lock",
            "spool.sqlite3",
        ]
    finally:
        s.close()


def test_state_outside_a_batch_is_committed(tmp_path: Path) -> None:
    """set_state alone (no put) must not leave a transaction open that blocks the next put."""
    s = Spool(tmp_path, 10)
    assert s.get_state("ports") is None
    s.set_state("ports", {"mlx5_0/1": "ACTIVE"})
    s.set_state("ports", {"mlx5_0/1": "DOWN"})
    assert s.get_state("ports") == {"mlx5_0/1": "DOWN"}
    assert s.put([fault()], {"counters": {"mlx5_0/1/symbol_error": 3}}) == 1
    s.close()
    s = Spool(tmp_path, 10)
    assert s.get_state("ports") == {"mlx5_0/1": "DOWN"}
    assert s.get_state("counters") == {"mlx5_0/1/symbol_error": 3}
    assert s.get_state("missing") is None
    s.close()


def test_used_from_another_thread(tmp_path: Path) -> None:
    """The agent's collectors and its sender run on different threads."""
    s = Spool(tmp_path, 10)
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            s.put([fault()])
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=writer)
    t.start()
    t.join()
    assert errors == []
    assert s.depth() == 1
    s.close()


def test_spooled_events_are_counted_by_kind(tmp_path: Path) -> None:
    s = Spool(tmp_path, 10)
    before = sample("railover_agent_events_spooled_total", {"kind": "port_down"})
    ev = fault()
    assert s.put([ev, ev, fault()]) == 2  # the same id twice is stored once
    assert sample("railover_agent_events_spooled_total", {"kind": "port_down"}) - before == 2
    assert sample("railover_agent_spool_events", {}) == 2.0
    s.close()


def test_making_room_keeps_depth_at_the_bound(tmp_path: Path) -> None:
    s = Spool(tmp_path, 3)
    s.put([progress(0), progress(1), fault()])
    before = dropped("progress", "spool_full")
    assert s.put([fault("mlx5_1"), fault("mlx5_2")]) == 2
    assert s.depth() == 3
    assert sample("railover_agent_spool_events", {}) == 3.0
    assert dropped("progress", "spool_full") - before == 2
    assert [e.get("device") for _, e in s.peek(10)] == ["mlx5_0", "mlx5_1", "mlx5_2"]
    s.close()
    assert Spool(tmp_path, 3).depth() == 3


def test_every_refused_fault_is_counted_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    s = Spool(tmp_path, 1)
    s.put([fault()])
    before = dropped("port_down", "spool_full")
    refused = [fault(f"mlx5_{i}") for i in (1, 2, 3)]
    with caplog.at_level(logging.WARNING, logger="agent.spool"):
        assert s.put(refused) == 0
    assert dropped("port_down", "spool_full") - before == 3
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert [r.getMessage() for r in errors] == [
        f"SPOOL FULL (1 fault events waiting for the service): refusing port_down event "
        f"{ev['event_id']} for {ev['device']}; raise RAILOVER_AGENT_SPOOL_MAX_EVENTS or "
        "restore the service link"
        for ev in refused
    ]
    s.close()


def test_refused_event_without_a_device_logs_a_dash(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    s = Spool(tmp_path, 1)
    s.put([fault()])
    ev = new_event("n0", "path_switch", comm_id=3)
    with caplog.at_level(logging.ERROR, logger="agent.spool"):
        s.put([ev])
    assert (
        caplog.records[-1]
        .getMessage()
        .endswith(
            f"refusing path_switch event {ev['event_id']} for -; "
            "raise RAILOVER_AGENT_SPOOL_MAX_EVENTS or restore the service link"
        )
    )
    s.close()


def test_sample_into_a_spool_of_faults_is_only_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    s = Spool(tmp_path, 1)
    s.put([fault()])
    before = dropped("progress", "spool_full")
    with caplog.at_level(logging.DEBUG, logger="agent.spool"):
        assert s.put([progress(1)]) == 0
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.WARNING, "spool full of fault events; dropping new progress sample")
    ]
    assert dropped("progress", "spool_full") - before == 1
    assert s.depth() == 1
    s.close()


def test_a_failing_batch_stores_nothing_and_the_spool_stays_usable(tmp_path: Path) -> None:
    s = Spool(tmp_path, 10)
    s.put([fault()])
    bad = fault("mlx5_1") | {"payload": object()}  # not JSON: fails inside the transaction
    with pytest.raises(TypeError):
        s.put([fault("mlx5_2"), bad], {"ports": {"x": 1}})
    assert s.depth() == 1
    assert sample("railover_agent_spool_events", {}) == 1.0
    assert s.get_state("ports") is None
    assert s.put([fault("mlx5_3")]) == 1
    assert [e["device"] for _, e in s.peek(10)] == ["mlx5_0", "mlx5_3"]
    s.close()


def test_peek_limit_and_remove(tmp_path: Path) -> None:
    s = Spool(tmp_path, 10)
    evs = [fault(f"mlx5_{i}") for i in range(4)]
    s.put(evs)
    got = s.peek(2)
    assert [e for _, e in got] == evs[:2]
    assert [seq for seq, _ in got] == [1, 2]
    s.remove([])
    assert s.depth() == 4
    s.remove([1, 3])
    assert s.depth() == 2
    assert sample("railover_agent_spool_events", {}) == 2.0
    assert [e for _, e in s.peek(10)] == [evs[1], evs[3]]
    s.close()
    s = Spool(tmp_path, 10)
    assert s.depth() == 2  # the removal was committed
    s.close()


def test_dead_letters_are_committed_counted_logged_and_bounded(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    s = Spool(tmp_path, 10)
    first, second = fault("mlx5_0"), fault("mlx5_1")
    s.put([first, second])
    before = dropped("port_down", "rejected")
    with caplog.at_level(logging.ERROR, logger="agent.spool"):
        s.dead_letter(1, first, "x" * 2500)
        s.dead_letter(2, second, "HTTP 422: port must be >= 1")
    assert dropped("port_down", "rejected") - before == 2
    assert [r.getMessage() for r in caplog.records] == [
        f"dead-lettered event {first['event_id']} (port_down, device mlx5_0): the service "
        f"rejected it: {'x' * 2500}",
        f"dead-lettered event {second['event_id']} (port_down, device mlx5_1): the service "
        "rejected it: HTTP 422: port must be >= 1",
    ]
    assert s.depth() == 0
    assert sample("railover_agent_spool_events", {}) == 0.0
    s.close()
    s = Spool(tmp_path, 10)
    letters = s.dead_letters()
    assert letters == [(first, "x" * 2000), (second, "HTTP 422: port must be >= 1")]
    assert s.depth() == 0
    s.close()
