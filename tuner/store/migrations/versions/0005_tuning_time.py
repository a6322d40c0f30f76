"""Tuning time: seconds a job has spent tuning, for time budgets and the elapsed/remaining display.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Add jobs.tuning_s and jobs.tuning_since."""
    op.add_column("jobs", sa.Column("tuning_s", sa.Float(), nullable=False, server_default="0"))
    op.add_column("jobs", sa.Column("tuning_since", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    """Drop jobs.tuning_s and jobs.tuning_since."""
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("tuning_since")
        batch.drop_column("tuning_s")
