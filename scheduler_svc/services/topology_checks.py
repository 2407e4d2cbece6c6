"""What a node registration or a job's CCL layout may not claim about devices.

Both were accepted before issue 30: two devices with one PCI address (the planner then
counts one function twice, and its PCIe distances are wrong), and merged_nics naming
RNICs that do not exist (NCCL would be told of virtual NICs over devices it cannot
find, and the decision counted their failover as possible).
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from scheduler_svc.api.schemas.jobs import JobIn
from scheduler_svc.api.schemas.nodes import NodeIn
from scheduler_svc.errors import Unprocessable
from scheduler_svc.store.nodes import NodeRepo

# RNIC kinds that have a PCI function of their own; an SF names its parent's, a bond its
# first member's, so those share one by design.
OWN_FUNCTION = ("physical", "vf")


def check_pci_unique(body: NodeIn) -> None:
    """Every GPU, and every physical or virtual-function RNIC, has its own PCI function
    (one RNIC's ports share it); a second device on an address is refused, named."""
    owner: dict[str, str] = {}
    for i, gpu in enumerate(body.gpus):
        _claim(owner, gpu.pci.lower(), f"gpus.{i}.pci", f"GPU {gpu.index}")
    for i, rnic in enumerate(body.rnics):
        if rnic.pci is None or rnic.kind not in OWN_FUNCTION:
            continue
        _claim(owner, rnic.pci.lower(), f"rnics.{i}.pci", f"RNIC {rnic.name}")


def _claim(owner: dict[str, str], pci: str, field: str, device: str) -> None:
    held = owner.setdefault(pci, device)
    if held != device:
        raise Unprocessable(
            f"{field}: {pci} is already {held}'s PCI address; two devices cannot share one "
            "(only an RNIC's ports, an SF or a bond do)"
        )


def check_merged_nics(session: Session, body: JobIn) -> None:
    """Each device merged_nics names is an RNIC of every node the job is placed on (the
    groups are the same on every node)."""
    if body.ccl is None or not body.ccl.merged_nics:
        return
    nodes = sorted({r.node for r in body.ranks})
    names = NodeRepo(session).rnic_names(nodes)
    for i, group in enumerate(body.ccl.merged_nics):
        for dev in group:
            missing = [n for n in nodes if dev not in names.get(n, set())]
            if missing:
                shown = ", ".join(missing[:3]) + (" ..." if len(missing) > 3 else "")
                raise Unprocessable(
                    f"ccl.merged_nics.{i}: {dev!r} is not an RNIC of node {shown}; name "
                    "devices every node of the job has"
                )
