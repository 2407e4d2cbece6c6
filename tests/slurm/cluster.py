"""A throw-away Slurm cluster on loopback: its own munged, slurmctld and one slurmd.

Everything lives in one temporary folder: the munge key and socket (slurm.conf's
AuthInfo points Slurm at that socket, so the machine's own munge is never used),
state and spool folders, logs, and free ports of its own. Slurm runs only one
slurmd per host, so jobs run on the first node; the others exist for drain,
comment and resume state, which slurmctld keeps whether or not a slurmd answers.
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import socket
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from railover_testing.waiting import wait_for

NODES = ("gpu01", "gpu02", "gpu03")
RUNS_JOBS = NODES[0]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class SlurmCluster:
    root: Path
    conf: Path
    env: dict[str, str]
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def run(self, *argv: str, check: bool = True) -> str:
        done = subprocess.run(
            argv, env=self.env, capture_output=True, text=True, timeout=60, check=False
        )
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr}")
        return done.stdout

    def node(self, name: str) -> dict[str, str]:
        """`scontrol show node -o`, as fields (Reason and Comment run to the next field)."""
        line = self.run("scontrol", "show", "node", "-o", name).strip()
        return _fields(line)

    def job(self, job_id: str) -> dict[str, str]:
        return _fields(self.run("scontrol", "show", "job", "-o", job_id).strip())

    def squeue(self, job_id: str) -> str:
        """The job's state code in squeue (PD, R, ...); empty when it left the queue."""
        return self.run("squeue", "-h", "-j", job_id, "-o", "%t", check=False).strip()

    def wait(self, what: str, probe: Callable[[], bool], timeout_s: float = 90.0) -> None:
        wait_for(f"slurm: {what}", probe, timeout_s, self.logs, step=0.2)

    def logs(self) -> str:
        out = []
        for log in sorted(self.root.glob("*.log")):
            out.append(f"--- {log.name}\n" + "\n".join(log.read_text().splitlines()[-15:]))
        return "\n".join(out)

    def submit(self) -> str:
        """A requeueable batch job that runs until cancelled, on the node with a slurmd."""
        out = self.run(
            "sbatch",
            "--parsable",
            "--requeue",
            "--job-name=railover-test",
            f"--output={self.root}/job-%j.out",
            f"--chdir={self.root}",
            "--wrap=sleep 3600",
        )
        return out.strip().split(";")[0]


_KEY = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9/:_]*)=")


def _fields(line: str) -> dict[str, str]:
    """Split `Key=value Key=value with spaces ...` by its keys."""
    marks = list(_KEY.finditer(line))
    out = {}
    for i, m in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(line)
        out[m.group(1)] = line[m.end() : end].strip()
    return out


def _conf(root: Path, munge_socket: Path) -> str:
    host = socket.gethostname().split(".")[0]
    nodes = f"gpu[01-{len(NODES):02d}]"
    return f"""\
ClusterName=railovertest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
AuthType=auth/munge
AuthInfo=socket={munge_socket}
SlurmUser=root
SlurmdUser=root
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool-%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
MpiDefault=none
SwitchType=switch/none
# 1, not 2: every node's NodeAddr is gpu01's slurmd, whose answers would return the
# slurmd-less nodes to service each time the tests set them DOWN.
ReturnToService=1
SlurmdTimeout=300
SchedulerParameters=sched_interval=2
NodeName={nodes} NodeHostname={host} NodeAddr=127.0.0.1 CPUs=1 State=UNKNOWN
PartitionName=gpu Nodes={nodes} Default=YES MaxTime=INFINITE State=UP
"""


@contextmanager
def slurm_cluster(root: Path) -> Iterator[SlurmCluster]:
    """Start munged, slurmctld and one slurmd under `root`; stop them all afterwards."""
    munge = root / "munge"
    munge.mkdir(mode=0o700)
    key = munge / "munge.key"
    key.write_bytes(secrets.token_bytes(1024))
    key.chmod(0o400)
    sock = munge / "munge.socket"
    (root / "state").mkdir()
    conf = root / "slurm.conf"
    conf.write_text(_conf(root, sock))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    cluster = SlurmCluster(root, conf, env)

    def daemon(*argv: str) -> None:
        cluster.procs.append(
            subprocess.Popen(
                argv,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=(root / f"{Path(argv[0]).name}.stderr.log").open("wb"),
                start_new_session=True,
            )
        )

    try:
        daemon(
            "munged",
            "--foreground",
            "--force",
            f"--socket={sock}",
            f"--key-file={key}",
            f"--log-file={root}/munged.log",
            f"--pid-file={munge}/munged.pid",
            f"--seed-file={munge}/munged.seed",
        )
        cluster.wait("munge socket", sock.exists, 30)
        daemon("slurmctld", "-D", "-i", "-f", str(conf))
        cluster.wait(
            "slurmctld answering",
            lambda: (
                subprocess.run(
                    ["scontrol", "ping"], env=env, capture_output=True, check=False, timeout=30
                ).returncode
                == 0
            ),
        )
        daemon("slurmd", "-D", "-N", RUNS_JOBS, "-f", str(conf))
        cluster.wait(
            f"{RUNS_JOBS} idle",
            lambda: "IDLE" in cluster.node(RUNS_JOBS).get("State", ""),
        )
        yield cluster
    finally:
        for proc in reversed(cluster.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in cluster.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
