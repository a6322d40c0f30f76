"""The cost model trained on each target's records (per owner, or the shared pool), kept in the store so
that a job's first batch is already ranked by what earlier jobs measured.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UTC = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "cost_models",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("target_key", sa.String(255), nullable=False),
        sa.Column("scope", sa.String(64), nullable=False),
        sa.Column("samples", sa.Integer(), nullable=False),
        sa.Column("last_record_id", sa.BigInteger(), nullable=False),
        sa.Column("model_tar", sa.LargeBinary(), nullable=False),
        sa.Column("trained_at", UTC, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_cost_models"),
        sa.UniqueConstraint("target_key", "scope", name="uq_cost_models_target_key_scope"),
    )


def downgrade() -> None:
    op.drop_table("cost_models")
