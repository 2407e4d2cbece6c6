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
from tests.slurm.cluster import SlurmCluster, slurm_cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    for tool in ("munged", "slurmctld", "slurmd", "scontrol", "sbatch", "squeue", "sinfo"):
        need_tool(tool)
    if os.geteuid() != 0:
        tool_missing("the throw-away Slurm cluster runs its daemons as root (SlurmUser=root)")
    with slurm_cluster(tmp_path_factory.mktemp("slurm")) as c:
        yield c


@pytest.fixture
def slurm(cluster: SlurmCluster, monkeypatch: pytest.MonkeyPatch) -> Iterator[SlurmCluster]:
    """The cluster with its nodes back to normal and no jobs; SLURM_CONF set for scontrol."""
    monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
    yield cluster
    cluster.run("scancel", "--full", "-u", "root", check=False)
    for node in ("gpu01", "gpu02", "gpu03"):
        cluster.run("scontrol", "update", f"NodeName={node}", "Comment=", check=False)
        if "DRAIN" in cluster.node(node).get("State", ""):
            cluster.run("scontrol", "update", f"NodeName={node}", "State=RESUME")
