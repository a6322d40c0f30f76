"""What routes depend on: the service's state (settings, store) and the owner a request acts as."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from service.auth import OWNER_STATE, Authenticator
from service.events import JobEvents
from tuner.isolation.sandbox import ModelSandbox
from tuner.settings import Settings
from tuner.store.sql import Store

_bearer = HTTPBearer(auto_error=False, description="An API token (when the server requires tokens)")


@dataclass
class ServiceState:
    """Everything a request may need, built once by ``create_app``."""

    settings: Settings
    store: Store
    auth: Authenticator
    sandbox: ModelSandbox  # where uploaded models are imported and planned
    events: JobEvents  # the open event streams, one database poll per job


async def get_state(request: Request) -> ServiceState:  # async: no thread for a lookup
    return request.app.state.kiln


StateDep = Annotated[ServiceState, Depends(get_state)]


async def get_owner(
    request: Request,
    state: StateDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> str:
    """The owner name of the request ("" when the server needs no token)."""
    owner = getattr(request.state, OWNER_STATE, None)
    if owner is not None:  # checked by AuthGate before the body was read: no thread needed
        return owner
    header = f"{credentials.scheme} {credentials.credentials}" if credentials else None
    return await run_in_threadpool(state.auth.owner, header)


OwnerDep = Annotated[str, Depends(get_owner)]
