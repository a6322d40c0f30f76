"""``/api/v1/devices``: the RPC tracker's device queues (keys, free and pending servers, and which running
job measures on which server), and the bf16 instructions of the server's own CPU."""

from __future__ import annotations

from fastapi import APIRouter

from service.deps import OwnerDep, StateDep
from service.schemas import DeviceOut, DevicesOut, ErrorOut, ServerUseOut
from tuner.passes.precision import native_bf16
from tuner.rpc.tracker import tracker_summary
from tuner.targets import host_target, to_tvm_target

router = APIRouter(prefix="/api/v1/devices", tags=["devices"])


@router.get(
    "",
    response_model=DevicesOut,
    responses={401: {"model": ErrorOut}, 503: {"model": ErrorOut}},
    summary="Devices registered with the TVM RPC tracker (KILN_RPC_TRACKER)",
)
def list_devices(state: StateDep, owner: OwnerDep) -> DevicesOut:
    tracker = state.settings.rpc_tracker
    host_bf16 = native_bf16(to_tvm_target(host_target()))
    if not tracker:
        return DevicesOut(
            tracker=None,
            devices=[],
            message="no RPC tracker configured (set KILN_RPC_TRACKER=host:port); jobs measure locally",
            host_bf16=host_bf16,
        )
    queues = tracker_summary(tracker, state.settings.rpc_timeout_s)
    uses = state.store.server_uses(running_only=True)
    return DevicesOut(
        tracker=tracker,
        devices=[
            DeviceOut.from_entity(
                q,
                in_use=[
                    # Another user's job shows as a server in use, without its id.
                    ServerUseOut.from_entity(u, job_id=u.job_id if u.owner == owner else None)
                    for u in uses
                    if u.key == q.key
                ],
            )
            for q in queues
        ],
        host_bf16=host_bf16,
    )
