"""Search statistics per task: what the schedule space's hooks did (cpu-poly's pruning and seeds).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Add tasks.search_stats_json."""
    op.add_column("tasks", sa.Column("search_stats_json", sa.Text(), nullable=True))


def downgrade() -> None:
    """Drop tasks.search_stats_json."""
    with op.batch_alter_table("tasks") as batch:
        batch.drop_column("search_stats_json")
