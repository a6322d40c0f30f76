"""A quantized job's accuracy against onnxruntime (max steps off, share beyond one step, cosine).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Add jobs.accuracy_json."""
    op.add_column("jobs", sa.Column("accuracy_json", sa.Text(), nullable=True))


def downgrade() -> None:
    """Drop jobs.accuracy_json."""
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("accuracy_json")
