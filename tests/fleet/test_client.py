"""The launcher client against the live service, and the torchrun hook in a real 2-process job."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from datetime import timedelta
from pathlib import Path

import pytest

from railover_testing.local import free_port, local_service
from scheduler_svc.api.schemas.jobs import JobIn
from scheduler_svc.config import Settings
from scheduler_svc.fleet.client import RailoverClient, RailoverError
from tests.fleet.helpers import fault
from tests.scheduler_svc.helpers import CHECKPOINT, job_body, register_nodes

REPO = Path(__file__).resolve().parents[2]


def test_client_registers_reports_and_waits(db_url: str) -> None:
    settings = Settings(
        db_url=db_url, port=0, allow_anonymous_loopback=True, webhook_allow_loopback=True
    )
    with local_service(settings) as url, RailoverClient(url) as rv:
        register_nodes(rv._http, ["n0", "n1"])
        job = JobIn.model_validate(job_body("j1", ["n0", "n1"]))
        assert rv.register_job(job).job_id == "j1"
        assert rv.register_job(job).job_id == "j1"  # 409 answered with the stored job
        assert len(rv.register_job(job, replace=True).ranks) == 16
        cp = rv.report_checkpoint("j1", iteration=500, at=CHECKPOINT + timedelta(seconds=60))
        assert cp.current and rv.get_job("j1").last_checkpoint_iteration == 500
        assert rv.report_iteration_times("j1", [1.0, 1.01, 0.99]).samples == 3
        assert rv.wait_for_decision("j1", timeout_s=0.1, poll_s=0.05) is None
        # A fault arrives while the launcher waits for the decision.
        threading.Timer(0.3, lambda: fault(rv._http, "n0", "mlx5_0", 2000)).start()
        # Not None: the wait ended on the decision, not on its 10 s timeout.
        decision = rv.wait_for_decision("j1", timeout_s=10, poll_s=0.05)
        assert decision is not None and decision.action == "failover"
        assert rv.wait_for_decision("j1", after=decision, timeout_s=0.1, poll_s=0.05) is None
        with pytest.raises(RailoverError) as err:
            rv.get_job("nope")
        assert err.value.status == 404
        sub = rv.subscribe("http://127.0.0.1:9/hook", job_id="j1")
        assert sub.secret and sub.job_id == "j1"


def test_a_gpu_another_job_holds_is_the_conflict_raised(db_url: str) -> None:
    """register_job answers its own job's 409 with the stored job, never another's."""
    settings = Settings(db_url=db_url, port=0, allow_anonymous_loopback=True)
    with local_service(settings) as url, RailoverClient(url) as rv:
        register_nodes(rv._http, ["n0"])
        rv.register_job(JobIn.model_validate(job_body("a", ["n0"])))
        b = JobIn.model_validate(job_body("b", ["n0"]))
        for replace in (False, True):
            with pytest.raises(RailoverError) as info:
                rv.register_job(b, replace=replace)
            assert info.value.status == 409 and "job 'a'" in info.value.body["detail"]
        assert rv.register_job(b.model_copy(update={"replaces": "a"})).job_id == "b"


def test_client_and_hook_take_a_checkpoint_request(db_url: str) -> None:
    """FlowCheck: a node reports a lost iteration; rank 0's hook hears of it on its next
    report, calls back once, says a checkpoint is due until one newer is saved."""
    from examples.railover_torchrun import RailoverHook  # imports torch

    settings = Settings(db_url=db_url, port=0, allow_anonymous_loopback=True)
    with local_service(settings) as url, RailoverClient(url) as rv:
        register_nodes(rv._http, ["n0", "n1"])
        rv.register_job(JobIn.model_validate(job_body("j1", ["n0", "n1"])))
        assert rv.checkpoint_requested("j1") is None
        at = CHECKPOINT + timedelta(seconds=60)
        out = rv.report_mirror_failure("j1", 700, at=at)
        assert (out.created, out.checkpoint_requested_after) == (True, 700)
        assert rv.report_mirror_failure("j1", 700, at=at).created is False  # a retry
        assert rv.checkpoint_requested("j1") == 700
        asked: list[int] = []
        hook = RailoverHook(rv, "j1", rank=0, report_every=2, on_checkpoint_request=asked.append)
        assert hook.checkpoint_due() is False  # not heard of yet: no report went out
        hook.iteration_done(1.0)
        assert asked == [] and hook.checkpoint_due() is False
        hook.iteration_done(1.0)  # the batch goes out; its answer carries the request
        assert asked == [700] and hook.checkpoint_due() is True
        hook.iteration_done(1.0)
        hook.iteration_done(1.0)
        assert asked == [700]  # called back once per request
        hook.checkpoint_saved(700)  # not newer than the lost iteration
        assert hook.checkpoint_due() is True
        hook.checkpoint_saved(701)
        assert hook.checkpoint_due() is False and hook.checkpoint_requested_after is None
        assert rv.checkpoint_requested("j1") is None
        with pytest.raises(RailoverError) as err:
            rv.report_mirror_failure("nope", 1)
        assert err.value.status == 404


@pytest.mark.slow
def test_torchrun_two_processes_register_and_checkpoint(tmp_path: Path) -> None:
    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.exists():
        pytest.fail("torchrun missing: `pip install -e '.[dev]'` installs torch==2.13.0 (CPU)")
    settings = Settings(
        db_url=f"sqlite:///{tmp_path / 'r.db'}", port=0, allow_anonymous_loopback=True
    )
    with local_service(settings) as url, RailoverClient(url) as rv:
        register_nodes(rv._http, ["trainer-0"])
        env = {
            **os.environ,
            "RAILOVER_URL": url,
            "RAILOVER_JOB_ID": "torchrun-job",
            "RAILOVER_NODE_NAME": "trainer-0",
            "RAILOVER_CHECKPOINT_INTERVAL_S": "1800",
            "DEMO_STEPS": "20",
            "DEMO_CHECKPOINT_EVERY": "10",
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": str(REPO),
        }
        done = subprocess.run(
            [
                str(torchrun),
                "--standalone",
                "--nproc-per-node",
                "2",
                str(REPO / "examples" / "railover_torchrun.py"),
            ],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        # Every report (registration, checkpoints, iteration batches) was taken.
        assert "WARNING:railover.torchrun" not in done.stderr, done.stderr[-3000:]
        job = rv.get_job("torchrun-job")
    assert [(r.rank, r.node, r.gpu) for r in job.ranks] == [
        (0, "trainer-0", 0),
        (1, "trainer-0", 1),
    ]
    assert job.checkpoint_interval_s == 1800 and job.dp_size == 2
    assert job.last_checkpoint_iteration == 20  # both checkpoints reported, the newest counts


def _closed_port() -> int:
    """A port nothing listens on, below the ephemeral range: torchrun's store binds it as
    MASTER_PORT, and a port from the ephemeral range can meanwhile be taken by any
    outgoing connection (a CI run saw EADDRINUSE)."""
    return free_port()


@pytest.mark.slow
def test_torchrun_hook_trains_on_when_the_service_is_down(tmp_path: Path) -> None:
    """Registration against a port nobody listens on: a warning, and the job still ends 0."""
    env = {
        **os.environ,
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(_closed_port()),
        "RAILOVER_URL": f"http://127.0.0.1:{_closed_port()}",
        "RAILOVER_JOB_ID": "offline-job",
        "DEMO_STEPS": "12",
        "DEMO_CHECKPOINT_EVERY": "5",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(REPO),
    }
    done = subprocess.run(
        [sys.executable, str(REPO / "examples" / "railover_torchrun.py")],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "registering job offline-job" in done.stderr, done.stderr[-3000:]
    assert "training without Railover" in done.stderr
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    # Once registration failed the hook stays quiet: no report is tried, none warns.
    assert "report_checkpoint failed" not in done.stderr
