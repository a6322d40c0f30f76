"""Uploaded models and their stored plans (tasks and fused graph per target)."""

from __future__ import annotations

import dataclasses
import json

import sqlalchemy as sa

from tuner.entities import (
    FusionSummary,
    ModelFormat,
    ModelInfo,
    ModelPlan,
    ModelSignature,
    PlanError,
    TaskInfo,
)
from tuner.errors import Conflict
from tuner.store.base import StoreBase
from tuner.store.convert import model_entity
from tuner.store.orm import ModelPlanRow, ModelRow


class ModelQueries(StoreBase):
    """Models and model plans."""

    # ---- models -----------------------------------------------------------------------------------------

    def add_model(
        self,
        *,
        name: str,
        format: ModelFormat,
        sha256: str,
        size_bytes: int,
        signature: ModelSignature,
        blob_path: str,
        owner: str = "",
    ) -> tuple[ModelInfo, bool]:
        """Store a model's metadata; the same bytes (sha256) from the same owner give back that model.

        Returns the model and whether it was newly created.
        """
        try:
            with self.session_scope() as s:
                existing = s.scalars(
                    sa.select(ModelRow).where(ModelRow.sha256 == sha256, ModelRow.owner == owner)
                ).first()
                if existing is not None:
                    return model_entity(existing), False
                row = ModelRow(
                    owner=owner,
                    name=name,
                    format=ModelFormat(format).value,
                    sha256=sha256,
                    size_bytes=size_bytes,
                    signature_json=json.dumps(signature.to_dict()),
                    blob_path=blob_path,
                )
                s.add(row)
                s.flush()
                created = model_entity(row)
        except Conflict:
            # A concurrent upload of the same bytes committed first.
            raced = self.find_model_by_sha256(sha256, owner)
            if raced is None:
                raise
            return raced, False
        return created, True

    def get_model(self, model_id: str, owner: str | None = None) -> ModelInfo:
        """The model with this id (owned by ``owner`` when given); :class:`NotFound` otherwise."""
        with self.session_scope(write=False) as s:
            return model_entity(self._model_row(s, model_id, owner))

    def find_model_by_sha256(self, sha256: str, owner: str = "") -> ModelInfo | None:
        """The owner's model with these bytes, if stored."""
        with self.session_scope(write=False) as s:
            row = s.scalars(
                sa.select(ModelRow).where(ModelRow.sha256 == sha256, ModelRow.owner == owner)
            ).first()
            return model_entity(row) if row is not None else None

    def list_models(self, owner: str | None = None) -> list[ModelInfo]:
        """Every model (of ``owner`` when given), newest first."""
        query = sa.select(ModelRow).order_by(ModelRow.created_at.desc(), ModelRow.id)
        if owner is not None:
            query = query.where(ModelRow.owner == owner)
        with self.session_scope(write=False) as s:
            return [model_entity(r) for r in s.scalars(query)]

    def model_blob_path(self, model_id: str) -> str:
        """Where the model's bytes are stored, relative to the data directory."""
        with self.session_scope(write=False) as s:
            return self._model_row(s, model_id).blob_path

    # ---- model plans ------------------------------------------------------------------------------------

    def get_model_plan(self, model_id: str, plan_key: str) -> ModelPlan | PlanError | None:
        """The stored outcome of planning a model under ``plan_key`` (target, shapes, passes), if any."""
        with self.session_scope(write=False) as s:
            row = s.scalar(
                sa.select(ModelPlanRow).where(
                    ModelPlanRow.model_id == model_id, ModelPlanRow.plan_key == plan_key
                )
            )
            if row is None:
                return None
            if row.error_kind is not None:
                return PlanError(row.target_key, row.error_kind, row.error_message or "")
            return ModelPlan(
                target_key=row.target_key,
                tasks=[TaskInfo(**t) for t in json.loads(row.tasks_json or "[]")],
                fusion=FusionSummary.from_dict(json.loads(row.fusion_json or "{}")),
                graph=row.graph or "",
            )

    def add_model_plan(self, model_id: str, plan_key: str, outcome: ModelPlan | PlanError) -> None:
        """Keep a model's plan (or planning error); a plan stored meanwhile by another request wins."""
        row = ModelPlanRow(model_id=model_id, plan_key=plan_key, target_key=outcome.target_key)
        if isinstance(outcome, PlanError):
            row.error_kind, row.error_message = outcome.kind, outcome.message
        else:
            row.tasks_json = json.dumps([dataclasses.asdict(t) for t in outcome.tasks])
            row.fusion_json = json.dumps(dataclasses.asdict(outcome.fusion))
            row.graph = outcome.graph
        try:
            with self.session_scope() as s:
                s.add(row)
        except Conflict:
            pass
