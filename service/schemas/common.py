"""What every response shares: the error body, the base of the views of entities, request-size bounds."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, Field

MAX_TIME_BUDGET_S = 7 * 24 * 3600  # a week: a longer budget is a typo


# Sizes no real request comes near, so that nothing a client sends is built or echoed at any size.
MAX_INPUTS = 256


MAX_RANK = 16


MAX_TARGET_KEYS = 32


class ErrorDetail(BaseModel):
    kind: str = Field(description="Machine-readable error class, e.g. 'invalid_model'")
    message: str = Field(description="What went wrong, and usually what to do about it")


class ErrorOut(BaseModel):
    error: ErrorDetail


_Out = TypeVar("_Out", bound="EntityOut")


class EntityOut(BaseModel):
    """A response body built from an entity of :mod:`tuner.entities`."""

    @classmethod
    def from_entity(cls: type[_Out], entity: object, **given: Any) -> _Out:
        """The fields ``entity`` has (attributes and properties of the same name), then ``given``."""
        data = {name: getattr(entity, name) for name in cls.model_fields if hasattr(entity, name)}
        return cls.model_validate({**data, **given})
