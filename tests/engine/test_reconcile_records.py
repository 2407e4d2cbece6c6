"""What reconcile stores: the desired state's JSON and the inputs records, exactly."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from scheduler_svc.engine import decision as cost
from scheduler_svc.engine.records import inputs_now, inputs_record
from scheduler_svc.engine.state import Desired, JobState, MirrorFailureSeen, Mode, Options

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def full() -> Desired:
    """A desired state with every field set, keys given out of order."""
    return Desired(
        mode=Mode.FAILED_OVER,
        moved={9: "mlx5_3/1", 2: "mlx5_1/1"},
        disabled={7: (1, 3), 4: (0,), 5: ()},
        weights={3: (0.25, 0.75), 1: (0.5, 0.5), 6: ()},
        split={8: 0.3, 2: 0.125, 9: 0.0},
        transit={5: {4: 1, 0: 3}, 2: {1: 2}, 6: {}},
        evidence=frozenset({"switch:s1", "fault:3", "flag:2"}),
        k=1.25,
        checkpoint_id=17,
        verdict="keep",
        mitigation={3: "balance", 1: "dcr"},
        checkpoint_after=420,
    )


FULL_JSON = {
    "mode": "failed_over",
    "moved": {"2": "mlx5_1/1", "9": "mlx5_3/1"},
    "disabled": {"4": [0], "7": [1, 3]},
    "evidence": ["fault:3", "flag:2", "switch:s1"],
    "k": 1.25,
    "checkpoint_id": 17,
    "verdict": "keep",
    "mitigation": {"1": "dcr", "3": "balance"},
    "weights": {"1": [0.5, 0.5], "3": [0.25, 0.75]},
    "split": {"2": 0.125, "8": 0.3},
    "transit": {"2": {"1": 2}, "5": {"0": 3, "4": 1}},
    "checkpoint_after": 420,
}


def test_to_json_is_the_exact_document_in_sorted_order() -> None:
    doc = full().to_json()
    assert doc == FULL_JSON
    # Key order is part of the stored text: sorted by number, fields in this order.
    assert json.dumps(doc) == json.dumps(FULL_JSON)
    assert list(doc["moved"]) == ["2", "9"]
    assert list(doc["disabled"]) == ["4", "7"]
    assert list(doc["mitigation"]) == ["1", "3"]
    assert list(doc["weights"]) == ["1", "3"]
    assert list(doc["split"]) == ["2", "8"]
    assert list(doc["transit"]) == ["2", "5"]
    assert list(doc["transit"]["5"]) == ["0", "4"]


def test_default_desired_json() -> None:
    assert Desired().to_json() == {
        "mode": "normal",
        "moved": {},
        "disabled": {},
        "evidence": [],
        "k": None,
        "checkpoint_id": None,
        "verdict": None,
        "mitigation": {},
        "weights": {},
        "split": {},
        "transit": {},
        "checkpoint_after": None,
    }


def test_from_json_reads_every_field_with_its_type() -> None:
    d = Desired.from_json(FULL_JSON)
    assert d.mode is Mode.FAILED_OVER
    assert d.moved == {2: "mlx5_1/1", 9: "mlx5_3/1"}
    assert d.disabled == {4: (0,), 7: (1, 3)}
    assert d.evidence == frozenset({"fault:3", "flag:2", "switch:s1"})
    assert d.k == 1.25
    assert d.checkpoint_id == 17
    assert d.verdict == "keep"
    assert d.mitigation == {1: "dcr", 3: "balance"}
    assert d.weights == {1: (0.5, 0.5), 3: (0.25, 0.75)}
    assert d.split == {2: 0.125, 8: 0.3}
    assert d.transit == {2: {1: 2}, 5: {0: 3, 4: 1}}
    assert d.checkpoint_after == 420
    for c in d.disabled.values():
        assert type(c) is tuple
    for comm, w in d.weights.items():
        assert type(comm) is int and type(w) is tuple
    for comm, t in d.transit.items():
        assert type(comm) is int
        assert all(type(r) is int and type(g) is int for r, g in t.items())
    assert all(type(r) is int for r in d.moved)
    assert all(type(c) is int for c in d.mitigation)
    assert all(type(c) is int for c in d.split)
    assert all(type(c) is int for c in d.disabled)


def test_round_trip_keeps_everything() -> None:
    d = Desired.from_json(full().to_json())
    assert d.to_json() == FULL_JSON
    assert Desired.from_json(json.loads(json.dumps(FULL_JSON))) == d


def test_from_json_converts_stored_values() -> None:
    """Values stored as other JSON types are read back as the field's type."""
    d = Desired.from_json(
        {
            "mode": "restarting",
            "moved": {"3": 5},
            "mitigation": {"2": 7},
            "weights": {"1": [1, 2]},
            "split": {"4": 1},
            "transit": {"6": {"2": 3.0}},
        }
    )
    assert d.mode is Mode.RESTARTING
    assert d.moved == {3: "5"}
    assert type(d.moved[3]) is str
    assert d.mitigation == {2: "7"}
    assert type(d.mitigation[2]) is str
    assert d.weights == {1: (1.0, 2.0)}
    assert all(type(x) is float for x in d.weights[1])
    assert d.split == {4: 1.0}
    assert type(d.split[4]) is float
    assert d.transit == {6: {2: 3}}
    assert type(d.transit[6][2]) is int


def test_from_json_of_nothing_and_of_missing_fields() -> None:
    assert Desired.from_json(None) == Desired()
    assert Desired.from_json({}) == Desired()
    partial = Desired.from_json({"k": 1.5})
    assert partial == Desired(k=1.5)
    assert partial.mode is Mode.NORMAL
    nulls = Desired.from_json(
        {
            "mode": "normal",
            "moved": None,
            "disabled": None,
            "evidence": None,
            "mitigation": None,
            "weights": None,
            "split": None,
            "transit": None,
        }
    )
    assert nulls == Desired()


def test_same_outcome_compares_mode_moves_channels_and_plans() -> None:
    base = full()
    assert base.same_outcome(Desired.from_json(FULL_JSON))
    # Bookkeeping fields are not the outcome.
    assert base.same_outcome(
        Desired(
            mode=base.mode,
            moved=base.moved,
            disabled={4: (0,), 7: (1, 3)},
            weights=base.weights,
            split=base.split,
            transit=base.transit,
        )
    )
    assert not base.same_outcome(
        Desired(
            mode=Mode.NORMAL,
            moved=base.moved,
            disabled=base.disabled,
            weights=base.weights,
            split=base.split,
            transit=base.transit,
        )
    )
    assert not base.same_outcome(
        Desired(
            mode=base.mode,
            moved={2: "mlx5_1/1"},
            disabled=base.disabled,
            weights=base.weights,
            split=base.split,
            transit=base.transit,
        )
    )
    assert not base.same_outcome(
        Desired(
            mode=base.mode,
            moved=base.moved,
            disabled={4: (0,), 7: (1,)},
            weights=base.weights,
            split=base.split,
            transit=base.transit,
        )
    )
    assert not base.same_outcome(
        Desired(
            mode=base.mode,
            moved=base.moved,
            disabled=base.disabled,
            weights={1: (0.5, 0.5)},
            split=base.split,
            transit=base.transit,
        )
    )
    assert not Desired(disabled={1: (2,)}).same_outcome(Desired())
    assert not Desired().same_outcome(Desired(disabled={1: (2,)}))
    assert Desired(disabled={1: ()}).same_outcome(Desired())


def decision(**kw: object) -> cost.Decision:
    base: dict[str, object] = {
        "checkpoint_interval_s": 3600.0,
        "elapsed_s": 100.0,
        "detect_s": 5.0,
        "reload_s": 600.0,
        "timeout_s": 30.0,
        "k": 1.5,
        "k_source": "measured",
        "gpus": 16,
        "path_available": False,
        "dp_size": 4,
        "new_dp_size": 3,
        "allow_scaling": True,
        "spare_nodes": False,
        "spares_free": 0,
        "spare_reserve": 1,
        "node_replace_s": 120.0,
        "spare_price_s": 45.0,
        "planned": True,
    }
    base.update(kw)
    return cost.decide(cost.DecisionInputs(**base))  # type: ignore[arg-type]


def test_inputs_record_is_the_exact_dict() -> None:
    d = decision()
    rec = inputs_record(d, 3)
    assert rec == {
        "t_elapsed_s": 100.0,
        "checkpoint_interval_s": 3600.0,
        "k": 1.5,
        "k_source": "measured",
        "detect_s": 5.0,
        "reload_s": 600.0,
        "timeout_s": 30.0,
        "threshold_s": d.threshold_s,
        "gpus": 16,
        "concurrent_faults": 3,
        "path_available": False,
        "dp_size": 4,
        "new_dp_size": 3,
        "allow_scaling": True,
        "spare_nodes": False,
        "spares_free": 0,
        "spare_reserve": 1,
        "node_replace_s": 120.0,
        "spare_price_s": 45.0,
        "planned": True,
    }
    assert d.threshold_s == (3600.0 * 0.5 - 5.0) / 1.5
    assert list(rec) == [
        "t_elapsed_s",
        "checkpoint_interval_s",
        "k",
        "k_source",
        "detect_s",
        "reload_s",
        "timeout_s",
        "threshold_s",
        "gpus",
        "concurrent_faults",
        "path_available",
        "dp_size",
        "new_dp_size",
        "allow_scaling",
        "spare_nodes",
        "spares_free",
        "spare_reserve",
        "node_replace_s",
        "spare_price_s",
        "planned",
    ]


def job(**kw: object) -> JobState:
    base: dict[str, object] = {
        "job_id": "j1",
        "mode": Mode.FAILED_OVER,
        "ranks": ((0, "n1", 0), (1, "n1", 1), (2, "n2", 0)),
        "checkpoint_interval_s": 3600.0,
        "reload_s": 600.0,
        "detect_s": 10.0,
        "timeout_s": 30.0,
        "last_checkpoint_at": T0,
    }
    base.update(kw)
    return JobState(**base)  # type: ignore[arg-type]


def test_inputs_now_with_measured_k() -> None:
    at = T0 + timedelta(seconds=900)
    rec = inputs_now(at, job(measured_k=1.25, slowdown_k=2.0), Options(), 3.0)
    assert rec == {
        "t_elapsed_s": 900.0,
        "checkpoint_interval_s": 3600.0,
        "k": 1.25,
        "k_source": "measured",
        "detect_s": 10.0,
        "reload_s": 600.0,
        "timeout_s": 30.0,
        "threshold_s": (3600.0 * 0.25 - 10.0) / 1.25,
        "gpus": 3,
    }
    assert list(rec) == [
        "t_elapsed_s",
        "checkpoint_interval_s",
        "k",
        "k_source",
        "detect_s",
        "reload_s",
        "timeout_s",
        "threshold_s",
        "gpus",
    ]


def test_inputs_now_k_falls_back_in_order() -> None:
    at = T0 + timedelta(seconds=60)
    # The job's own k when nothing was measured.
    assert inputs_now(at, job(slowdown_k=2.0), Options(), 3.0)["k"] == 2.0
    # The k the last decision used when the job gave none.
    used = inputs_now(at, job(), Options(), 3.0)
    assert (used["k"], used["k_source"]) == (3.0, "measured")
    assert used["threshold_s"] == (3600.0 * 2.0 - 10.0) / 3.0
    # The first default k when nothing is known.
    none = inputs_now(at, job(), Options(default_k=(1.1, 1.2)), None)
    assert (none["k"], none["k_source"]) == (1.1, "default")
    assert none["threshold_s"] == (3600.0 * (1.1 - 1) - 10.0) / 1.1


def test_inputs_now_elapsed_is_never_negative_and_starts_at_the_rebuilt_checkpoint() -> None:
    before = inputs_now(T0 - timedelta(seconds=5), job(), Options(), 1.5)
    assert before["t_elapsed_s"] == 0.0
    failure = MirrorFailureSeen(id=1, iteration=50, at=T0, rebuilt_at=T0 - timedelta(seconds=300))
    rec = inputs_now(T0 + timedelta(seconds=100), job(mirror_failures=(failure,)), Options(), 1.5)
    assert rec["t_elapsed_s"] == 400.0
