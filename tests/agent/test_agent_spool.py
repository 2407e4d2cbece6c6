"""The on-disk spool: durable, bounded, faults never dropped silently."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from agent.events import new_event
from agent.spool import Spool


def _dropped(kind: str) -> float:
    v = REGISTRY.get_sample_value(
        "railover_agent_events_dropped_total", {"kind": kind, "reason": "spool_full"}
    )
    return v or 0.0


def test_survives_reopen_and_keeps_order(tmp_path: Path) -> None:
    s = Spool(tmp_path, 1000)
    evs = [new_event("n0", "port_down", device="mlx5_0", port=1) for _ in range(5)]
    assert s.put(evs, {"ports": {"mlx5_0/1": "DOWN"}}) == 5
    assert s.put(evs[:2]) == 0  # same ids: stored once
    s.close()
    s = Spool(tmp_path, 1000)
    assert s.depth() == 5
    got = s.peek(10)
    assert [e["event_id"] for _, e in got] == [e["event_id"] for e in evs]
    assert s.get_state("ports") == {"mlx5_0/1": "DOWN"}
    s.remove([seq for seq, _ in got[:3]])
    assert s.depth() == 2
    assert REGISTRY.get_sample_value("railover_agent_spool_events") == 2.0
    s.close()


def test_full_drops_oldest_progress_first(tmp_path: Path) -> None:
    s = Spool(tmp_path, 100)
    progress = [new_event("n0", "progress", comm_id=1, rank=0, ops_done=i) for i in range(60)]
    faults = [new_event("n0", "cqe_error", device="mlx5_0", wc_status=12) for _ in range(40)]
    s.put(progress[:30])
    s.put(faults)
    s.put(progress[30:])
    assert s.depth() == 100
    before = _dropped("progress")
    more_faults = [new_event("n0", "port_down", device="mlx5_1", port=1) for _ in range(50)]
    assert s.put(more_faults) == 50
    assert _dropped("progress") - before == 50
    kept = [e for _, e in s.peek(1000)]
    kinds = [e["kind"] for e in kept]
    assert kinds.count("cqe_error") == 40 and kinds.count("port_down") == 50
    # The newest progress samples are the ones left.
    assert [e["ops_done"] for e in kept if e["kind"] == "progress"] == list(range(50, 60))
    s.close()


def test_full_of_state_events_refuses_loudly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Only port state waits (nothing droppable, nothing to fold): a new fault is refused."""
    s = Spool(tmp_path, 100)
    s.put([new_event("n0", "port_up", device=f"mlx5_{i}", port=1) for i in range(100)])
    before = _dropped("port_down")
    with caplog.at_level(logging.ERROR, logger="agent.spool"):
        assert s.put([new_event("n0", "port_down", device="mlx5_0", port=1)]) == 0
    assert _dropped("port_down") - before == 1
    assert "SPOOL FULL" in caplog.text
    # A progress sample into a spool full of faults is dropped, not a fault.
    assert s.put([new_event("n0", "progress", comm_id=1, ops_done=1)]) == 0
    assert [e["kind"] for _, e in s.peek(1000)].count("port_up") == 100
    s.close()


def test_dead_letter(tmp_path: Path) -> None:
    s = Spool(tmp_path, 100)
    ev = new_event("n0", "counter", device="mlx5_0", counter="x", delta=1)
    s.put([ev])
    ((seq, _),) = s.peek(1)
    s.dead_letter(seq, ev, "HTTP 422: bad")
    assert s.depth() == 0
    assert s.dead_letters() == [(ev, "HTTP 422: bad")]
    s.close()


def test_unknown_kind_is_a_bug() -> None:
    with pytest.raises(ValueError, match="unknown event kind"):
        new_event("n0", "bogus")


def test_one_agent_per_spool(tmp_path: Path) -> None:
    s = Spool(tmp_path, 100)
    with pytest.raises(RuntimeError, match="another agent is using the spool"):
        Spool(tmp_path, 100)
    s.close()
    Spool(tmp_path, 100).close()
