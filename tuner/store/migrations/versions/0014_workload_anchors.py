"""A workload's anchor: the same first reduction block under other fused epilogues shares it, so that a
kernel without a record of its own, or of its family, can start from the decisions of a measured schedule
of the same operator (schedules.transfer.decisions_transferred).

Workloads stored before this revision get theirs computed when a job first looks for similar records.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("workloads", sa.Column("anchor", sa.String(32), nullable=True))
    op.create_index("ix_workloads_anchor", "workloads", ["anchor"])


def downgrade() -> None:
    op.drop_index("ix_workloads_anchor", table_name="workloads")
    with op.batch_alter_table("workloads") as batch:
        batch.drop_column("anchor")
