"""A workload's family: the same operator at other shapes shares it, so that a kernel without a record of
its own can start from a measured schedule of a similar one (schedules.transfer).

Workloads stored before this revision get theirs computed when a job first looks for similar records.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("workloads", sa.Column("family", sa.String(32), nullable=True))
    op.create_index("ix_workloads_family", "workloads", ["family"])


def downgrade() -> None:
    op.drop_index("ix_workloads_family", table_name="workloads")
    with op.batch_alter_table("workloads") as batch:
        batch.drop_column("family")
