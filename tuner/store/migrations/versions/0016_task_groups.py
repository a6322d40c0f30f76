"""Task groups: a job split over several workers, each group of its tasks claimed, heartbeated and
requeued like a job.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UTC = sa.DateTime(timezone=True)


def upgrade() -> None:
    """Add the task_groups table."""
    op.create_table(
        "task_groups",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(32), nullable=False),
        sa.Column("index", sa.Integer(), nullable=False),
        sa.Column("task_indices_json", sa.Text(), nullable=False),
        sa.Column("trials", sa.Integer(), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("worker", sa.String(255), nullable=True),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("heartbeat_at", UTC, nullable=True),
        sa.Column("deadline_at", UTC, nullable=True),
        sa.Column("created_at", UTC, nullable=False),
        sa.Column("finished_at", UTC, nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name="fk_task_groups_job_id_jobs", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_task_groups"),
        sa.UniqueConstraint("job_id", "index", name="uq_task_groups_job_id_index"),
    )
    op.create_index("ix_task_groups_job_id", "task_groups", ["job_id"])
    op.create_index("ix_task_groups_status", "task_groups", ["status"])


def downgrade() -> None:
    """Back to 0015."""
    op.drop_index("ix_task_groups_status", table_name="task_groups")
    op.drop_index("ix_task_groups_job_id", table_name="task_groups")
    op.drop_table("task_groups")
