"""The cost models trained on each target's records, kept so that every job and worker starts from one."""

from __future__ import annotations

import sqlalchemy as sa

from tuner.entities import StoredCostModel
from tuner.store.base import StoreBase
from tuner.store.orm import CostModelRow, utcnow


class CostModelQueries(StoreBase):
    """One cost model per target and record scope."""

    def get_cost_model(self, target_key: str, scope: str = "") -> StoredCostModel | None:
        """The cost model of ``target_key``'s records in ``scope`` (an owner; "" the shared pool)."""
        with self.session_scope(write=False) as s:
            row = s.scalar(
                sa.select(CostModelRow).where(
                    CostModelRow.target_key == target_key, CostModelRow.scope == scope
                )
            )
            if row is None:
                return None
            return StoredCostModel(
                row.target_key, row.scope, row.samples, row.last_record_id, row.model_tar, row.trained_at
            )

    def save_cost_model(self, model: StoredCostModel) -> bool:
        """Keep ``model`` unless the one kept has learnt from newer records (another worker's, trained
        meanwhile); returns whether it was kept."""
        with self.session_scope() as s:
            row = s.scalar(
                sa.select(CostModelRow)
                .where(CostModelRow.target_key == model.target_key, CostModelRow.scope == model.scope)
                .with_for_update()
            )
            if row is None:
                s.add(
                    CostModelRow(
                        target_key=model.target_key,
                        scope=model.scope,
                        samples=model.samples,
                        last_record_id=model.last_record_id,
                        model_tar=model.model_tar,
                        trained_at=utcnow(),
                    )
                )
                return True
            if row.last_record_id > model.last_record_id:
                return False
            row.samples = model.samples
            row.last_record_id = model.last_record_id
            row.model_tar = model.model_tar
            row.trained_at = utcnow()
            return True
