"""Model plans: each model's task preview per target, computed once in the model sandbox and kept.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Add the model_plans table."""
    op.create_table(
        "model_plans",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("model_id", sa.String(32), nullable=False),
        sa.Column("plan_key", sa.String(64), nullable=False),
        sa.Column("target_key", sa.String(512), nullable=False),
        sa.Column("error_kind", sa.String(64), nullable=True),
        sa.Column("error_message", sa.Text(), nullable=True),
        sa.Column("tasks_json", sa.Text(), nullable=True),
        sa.Column("fusion_json", sa.Text(), nullable=True),
        sa.Column("graph", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["model_id"], ["models.id"], name="fk_model_plans_model_id_models", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_model_plans"),
    )
    op.create_index("uq_model_plans_model_id_plan_key", "model_plans", ["model_id", "plan_key"], unique=True)


def downgrade() -> None:
    """Back to 0002."""
    op.drop_table("model_plans")
