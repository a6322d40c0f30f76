"""A job's lowering, level by level (the Relax program after each graph pass, compressed, with its summary),
and each task's tuned kernel as the CPU runs it (its assembly, compressed, and its instruction mix).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Add the job_ir_levels table and tasks.asm_zlib, tasks.asm_mix_json."""
    op.create_table(
        "job_ir_levels",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(32), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("changed", sa.Boolean(), nullable=False),
        sa.Column("text_zlib", sa.LargeBinary(), nullable=False),
        sa.Column("summary_json", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name="fk_job_ir_levels_job_id_jobs", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_job_ir_levels"),
    )
    op.create_index("uq_job_ir_levels_job_id_position", "job_ir_levels", ["job_id", "position"], unique=True)
    op.add_column("tasks", sa.Column("asm_zlib", sa.LargeBinary(), nullable=True))
    op.add_column("tasks", sa.Column("asm_mix_json", sa.Text(), nullable=True))


def downgrade() -> None:
    """Back to 0007."""
    with op.batch_alter_table("tasks") as batch:
        batch.drop_column("asm_mix_json")
        batch.drop_column("asm_zlib")
    op.drop_table("job_ir_levels")
