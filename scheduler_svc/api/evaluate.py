"""Stateless what-if decisions."""

from __future__ import annotations

from scheduler_svc.api import routing
from scheduler_svc.api.deps import Reader, SettingsDep
from scheduler_svc.api.schemas.decisions import DecisionInputsOut, EvaluateIn, EvaluateOut
from scheduler_svc.engine.decision import DecisionInputs, decide, ib_timeout_s
from scheduler_svc.engine.records import inputs_record
from scheduler_svc.engine.slowdown import estimate_k
from scheduler_svc.errors import VALIDATION, Forbidden, Unauthorized, responses

router = routing.router(prefix="/v1", tags=["decisions"])


@router.post(
    "/evaluate", operation_id="evaluate", responses=responses(Unauthorized, Forbidden) | VALIDATION
)
def evaluate(body: EvaluateIn, _: Reader, settings: SettingsDep) -> EvaluateOut:
    """The decision the service would make for these inputs; nothing is stored."""
    if body.timeout_s is not None:
        timeout = body.timeout_s
    elif body.ib_timeout is not None and body.ib_retry_cnt is not None:
        timeout = ib_timeout_s(body.ib_timeout, body.ib_retry_cnt)
    else:
        timeout = 0.0
    est = estimate_k(
        measured_k=body.k,
        comm_share=body.comm_share,
        bandwidth_left=body.bandwidth_left,
        concurrent_faults=body.concurrent_faults,
        table=settings.default_k,
    )
    result = decide(
        DecisionInputs(
            checkpoint_interval_s=body.checkpoint_interval_s,
            elapsed_s=body.t_elapsed_s,
            detect_s=body.detect_s,
            reload_s=body.reload_s,
            timeout_s=timeout,
            k=est.k,
            k_source=est.source.value,
            gpus=body.gpus,
            path_available=body.path_available,
            healed=body.healed,
            dp_size=body.dp_size,
            new_dp_size=_new_dp_size(body.dp_size, body.new_dp_size),
            allow_scaling=body.allow_scaling,
            spare_nodes=body.spare_nodes,
            node_replace_s=body.node_replace_s,
        )
    )
    return EvaluateOut(
        action=result.action.value,
        reason=result.reason,
        inputs=DecisionInputsOut(**inputs_record(result, body.concurrent_faults)),
        costs_s=dict(result.costs_s),
        costs_gpu_s=dict(result.costs_gpu_s),
        notes=list(result.notes),
    )


def _new_dp_size(dp_size: int, given: int | None) -> int | None:
    """A what-if has no placement: one replica on the dropped node unless it says otherwise."""
    if given is not None:
        return given
    return dp_size - 1 if dp_size >= 2 else None
