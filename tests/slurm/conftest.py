"""The throw-away Slurm cluster (tests/slurm/cluster.py), one per test module.

Skipped where Slurm or munge is missing, except under `make test`
(RAILOVER_REQUIRE_TOOLS=1, with the packages installed by `make tools`), where a
missing daemon fails instead: CI must not go green without the real Slurm.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.deploy.tools import need_tool, tool_missing
from tests.slurm.cluster import NODES, RUNS_JOBS, SlurmCluster, slurm_cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    for tool in ("munged", "slurmctld", "slurmd", "scontrol", "sbatch", "squeue", "sinfo"):
        need_tool(tool)
    if os.geteuid() != 0:
        tool_missing("the throw-away Slurm cluster runs its daemons as root (SlurmUser=root)")
    with slurm_cluster(tmp_path_factory.mktemp("slurm")) as c:
        _park_nodes_without_slurmd(c)
        yield c


def _park_nodes_without_slurmd(cluster: SlurmCluster) -> None:
    """Mark the slurmd-less nodes DOWN, so that no job is ever placed on them.

    A node that a test resumed from drain is IDLE (not responding) until SlurmdTimeout
    and schedulable meanwhile: a job submitted while gpu01 is still completing the last
    one would start there, on a node that can never run it. DOWN keeps the drain,
    comment and resume state the tests look at, and the scheduler away.
    """
    parked = [n for n in NODES if n != RUNS_JOBS]
    for node in parked:
        # Whatever its state now reads: a resume just made may not show yet. Setting DOWN
        # on a node already down is refused, which is fine (check=False).
        cluster.run(
            "scontrol", "update", f"NodeName={node}", "State=DOWN", "Reason=no slurmd", check=False
        )
    cluster.wait(
        "the slurmd-less nodes down",
        lambda: all("DOWN" in cluster.node(n).get("State", "") for n in parked),
    )


@pytest.fixture
def slurm(cluster: SlurmCluster, monkeypatch: pytest.MonkeyPatch) -> Iterator[SlurmCluster]:
    """The cluster with its nodes back to normal and no jobs; SLURM_CONF set for scontrol."""
    monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
    yield cluster
    cluster.run("scancel", "--full", "-u", "root", check=False)
    for node in NODES:
        cluster.run("scontrol", "update", f"NodeName={node}", "Comment=", check=False)
        if "DRAIN" in cluster.node(node).get("State", ""):
            cluster.run("scontrol", "update", f"NodeName={node}", "State=RESUME")
    _park_nodes_without_slurmd(cluster)
