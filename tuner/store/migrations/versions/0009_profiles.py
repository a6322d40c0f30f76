"""A job's profile of its compiled model (kernel by kernel, with onnxruntime's beside it), and each host's
measured roofs (fp32 FMA peak, memory bandwidth), measured once per host and target.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UTC = sa.DateTime(timezone=True)


def upgrade() -> None:
    """Add the job_profiles and machine_limits tables."""
    op.create_table(
        "job_profiles",
        sa.Column("job_id", sa.String(32), nullable=False),
        sa.Column("profile_zlib", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", UTC, nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name="fk_job_profiles_job_id_jobs", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("job_id", name="pk_job_profiles"),
    )
    op.create_table(
        "machine_limits",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("host", sa.String(512), nullable=False),
        sa.Column("limits_json", sa.Text(), nullable=False),
        sa.Column("measured_at", UTC, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_machine_limits"),
    )
    op.create_index("ix_machine_limits_host", "machine_limits", ["host"], unique=True)


def downgrade() -> None:
    """Back to 0008."""
    op.drop_index("ix_machine_limits_host", table_name="machine_limits")
    op.drop_table("machine_limits")
    op.drop_table("job_profiles")
