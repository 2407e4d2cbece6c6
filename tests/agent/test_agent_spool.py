"""The on-disk spool: durable, bounded, faults never dropped silently."""

from __future__ import annotations

import json
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


def _cqe(dev: str = "mlx5_0", status: int = 12) -> dict[str, object]:
    return new_event("n0", "cqe_error", device=dev, port=1, wc_status=status, detail={"qp": 1})


def _count(ev: dict[str, object]) -> int:
    detail = ev.get("detail")
    return int(detail.get("coalesced", 1)) if isinstance(detail, dict) else 1


def test_lanes_state_then_faults_then_samples(tmp_path: Path) -> None:
    s = Spool(tmp_path, 100)
    p = new_event("n0", "progress", comm_id=1, ops_done=1)
    c1, c2 = _cqe(), _cqe("mlx5_1")
    down = new_event("n0", "port_down", device="mlx5_0", port=1)
    s.put([p, c1])
    s.put([c2, down])
    assert [e["event_id"] for _, e in s.peek(10)] == [
        down["event_id"], c1["event_id"], c2["event_id"], p["event_id"]
    ]  # fmt: skip
    assert [e["event_id"] for _, e in s.peek(2)] == [down["event_id"], c1["event_id"]]
    s.close()


def test_full_folds_noise_into_its_component(tmp_path: Path) -> None:
    s = Spool(tmp_path, 100)
    first = _cqe()
    s.put([first] + [_cqe("mlx5_1") for _ in range(99)])
    late = _cqe() | {"detail": {"qp": 9}}
    assert s.put([late]) == 1
    assert s.depth() == 100
    rows = {e["event_id"]: e for _, e in s.peek(1000)}
    folded = rows[first["event_id"]]
    assert folded["detail"] == {"qp": 9, "coalesced": 2, "first_observed_at": first["observed_at"]}
    assert folded["observed_at"] == late["observed_at"]
    # A counter's deltas add up.
    s2 = Spool(tmp_path / "c", 100)
    rise = new_event("n0", "counter", device="mlx5_0", port=1, counter="symbol_error", delta=3)
    s2.put([rise] + [_cqe(f"mlx5_{i}", i) for i in range(99)])
    s2.put([rise | {"event_id": "x", "delta": 4}])
    (c,) = [e for _, e in s2.peek(1000) if e["kind"] == "counter"]
    assert (c["delta"], c["event_id"], _count(c)) == (7, rise["event_id"], 2)
    s.close()
    s2.close()


def test_full_folds_every_component_to_make_room_for_a_fault(tmp_path: Path) -> None:
    s = Spool(tmp_path, 100)
    s.put([_cqe("mlx5_0") for _ in range(60)] + [_cqe("mlx5_1") for _ in range(40)])
    down = new_event("n0", "port_down", device="mlx5_2", port=1)
    assert s.put([down]) == 1
    assert s.depth() == 3
    kept = [e for _, e in s.peek(10)]
    assert kept[0]["event_id"] == down["event_id"]
    assert sorted((e["device"], _count(e)) for e in kept[1:]) == [("mlx5_0", 60), ("mlx5_1", 40)]
    s.close()


def test_full_of_distinct_noise_evicts_the_oldest_for_a_fault(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    s = Spool(tmp_path, 100)
    noise = [_cqe("mlx5_0", status) for status in range(100)]
    s.put(noise)
    evicted = (
        REGISTRY.get_sample_value(
            "railover_agent_events_dropped_total", {"kind": "cqe_error", "reason": "spool_full"}
        )
        or 0.0
    )
    down = new_event("n0", "port_down", device="mlx5_2", port=1)
    assert s.put([down]) == 1
    ids = [e["event_id"] for _, e in s.peek(1000)]
    assert noise[0]["event_id"] not in ids and noise[1]["event_id"] in ids
    assert down["event_id"] in ids and s.depth() == 100
    # New noise of a component with nothing waiting is what is refused now.
    with caplog.at_level(logging.WARNING, logger="agent.spool"):
        assert s.put([_cqe("mlx5_3", 200)]) == 0
    assert "nothing of its component waits to fold into" in caplog.text
    assert _dropped("cqe_error") - evicted == 2
    s.close()


def test_rows_being_sent_are_neither_folded_into_nor_evicted(tmp_path: Path) -> None:
    s = Spool(tmp_path, 100)
    s.put([_cqe("mlx5_0")] + [_cqe("mlx5_1", i) for i in range(99)])
    sending = s.peek(100, sending=True)
    assert len(sending) == 100
    # Everything waits on the wire: nothing to fold into, nothing to evict.
    assert s.put([_cqe("mlx5_0")]) == 0
    assert s.put([new_event("n0", "port_down", device="mlx5_2", port=1)]) == 0
    s.remove([seq for seq, _ in sending[:1]])
    assert s.put([new_event("n0", "port_down", device="mlx5_2", port=1)]) == 1
    # The next round's batch is what is held back now; a look from elsewhere holds nothing.
    assert [e["kind"] for _, e in s.peek(1, sending=True)] == ["port_down"]
    s.peek(1000)
    assert s.put([_cqe("mlx5_1", 98)]) == 1
    s.close()


def test_dead_letters_and_quarantine_keep_the_newest(tmp_path: Path) -> None:
    s = Spool(tmp_path, 1000, max_dead_letters=10, max_quarantined=10)
    evs = [_cqe(f"mlx5_{i}", i) for i in range(15)]
    s.put(evs)
    for seq, ev in s.peek(15):
        s.dead_letter(seq, ev, "HTTP 422")
    assert [e["event_id"] for e, _ in s.dead_letters()] == [e["event_id"] for e in evs[5:]]
    import sqlite3

    with sqlite3.connect(s.path) as db:
        db.executemany(
            "INSERT INTO events (event_id, kind, droppable, body, lane) VALUES (?, 'x', 0, '{', 0)",
            [(f"bad{i}",) for i in range(15)],
        )
    assert s.peek(5) == []
    assert [seq for seq, _, _ in s.quarantined()] == list(range(21, 31))
    assert s.depth() == 0
    s.close()


def test_an_older_spool_file_gains_lanes(tmp_path: Path) -> None:
    import sqlite3

    progress = new_event("n0", "progress", comm_id=1, ops_done=1)
    down = new_event("n0", "port_down", device="mlx5_0", port=1)
    with sqlite3.connect(tmp_path / "spool.sqlite3") as db:
        db.execute(
            "CREATE TABLE events (seq INTEGER PRIMARY KEY AUTOINCREMENT, event_id TEXT NOT NULL "
            "UNIQUE, kind TEXT NOT NULL, droppable INTEGER NOT NULL, body TEXT NOT NULL)"
        )
        for ev in (progress, down):
            db.execute(
                "INSERT INTO events (event_id, kind, droppable, body) VALUES (?, ?, ?, ?)",
                (ev["event_id"], ev["kind"], int(ev["kind"] == "progress"), json.dumps(ev)),
            )
    s = Spool(tmp_path, 100)
    assert [e["kind"] for _, e in s.peek(10)] == ["port_down", "progress"]
    s.close()


def test_unreadable_state_is_dropped_not_fatal(tmp_path: Path) -> None:
    s = Spool(tmp_path, 100)
    s.set_state("ports", {"a": 1})
    s._db.execute("UPDATE state SET value = '{' WHERE key = 'ports'")  # a torn row
    assert s.get_state("ports") is None
    assert s.get_state("ports") is None
    s.close()


def test_why_a_row_is_quarantined(tmp_path: Path) -> None:
    import sqlite3

    s = Spool(tmp_path, 100)
    bodies = [
        b"{not json",
        b"[1, 2]",
        b'{"kind": "port_down"}',
        b'{"event_id": "", "kind": "port_down"}',
        b'{"event_id": 7, "kind": "port_down"}',
        b'{"event_id": "a", "kind": "bogus\\n"}',
        b'{"event_id": "b"}',
    ]
    with sqlite3.connect(s.path) as db:
        db.executemany(
            "INSERT INTO events (event_id, kind, droppable, body, lane) VALUES (?, 'x', 0, ?, 0)",
            [(f"bad{i}", b) for i, b in enumerate(bodies)],
        )
    good = new_event("n0", "port_down", device="mlx5_0", port=1)
    s.put([good])
    assert [e for _, e in s.peek(10)] == [good]
    reasons = [why for _, _, why in s.quarantined()]
    assert reasons[0].startswith("not JSON: Expecting property name")
    assert reasons[1:] == [
        "not an object but list",
        "no event_id",
        "no event_id",
        "no event_id",
        "unknown kind bogus\\n",
        "unknown kind None",
    ]
    s.close()


def test_coalesce_keys_name_the_component() -> None:
    from agent.events import LANE_FAULT, coalesce_key, lane_of

    a = new_event("n0", "cqe_error", device="mlx5_0", port=1, wc_status=12, comm_id=5, rank=2)
    assert coalesce_key(a) == "cqe_error|mlx5_0|1|12|5|2"
    assert coalesce_key(new_event("n0", "cqe_error", device="mlx5_0", wc_status=12)) == (
        "cqe_error|mlx5_0||12||"
    )
    assert coalesce_key(new_event("n0", "stall", comm_id=5, rank=2)) == "stall|5|2"
    rise = new_event("n0", "counter", device="mlx5_0", port=1, counter="symbol_error", delta=1)
    assert coalesce_key(rise) == "counter|mlx5_0|1|symbol_error"
    assert coalesce_key(new_event("n0", "port_down", device="mlx5_0", port=1)) is None
    assert lane_of("not_a_kind") == LANE_FAULT


def test_coalesce_keeps_counts_and_the_first_time() -> None:
    from agent.events import coalesce

    older = {"event_id": "o", "kind": "stall", "observed_at": "t1", "detail": "x"}
    newer = {"event_id": "n", "kind": "stall", "observed_at": "t2", "detail": None}
    once = coalesce(older, newer)
    assert once == {
        "event_id": "o",
        "kind": "stall",
        "observed_at": "t2",
        "detail": {"coalesced": 2, "first_observed_at": "t1"},
    }
    third = {"event_id": "m", "kind": "stall", "observed_at": "t3", "detail": {"coalesced": 3}}
    assert coalesce(once, third)["detail"] == {"coalesced": 5, "first_observed_at": "t1"}
    assert newer["detail"] is None and older["detail"] == "x"  # neither changed
    rise = {"event_id": "c", "kind": "counter", "observed_at": "t1", "delta": None}
    assert coalesce(rise, rise | {"delta": 2})["delta"] == 2
    assert coalesce(rise | {"delta": 2}, rise)["delta"] == 2
    assert "delta" not in coalesce(older, newer)
