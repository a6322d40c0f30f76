"""Which RPC servers each job measured on: candidates per server, first and last when, written as each
batch is measured, so that the devices page shows which running job is using which server.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UTC = sa.DateTime(timezone=True)


def upgrade() -> None:
    """Add the server_uses table."""
    op.create_table(
        "server_uses",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(32), nullable=False),
        sa.Column("key", sa.String(255), nullable=False),
        sa.Column("server", sa.String(512), nullable=False),
        sa.Column("candidates", sa.Integer(), nullable=False),
        sa.Column("first_used_at", UTC, nullable=False),
        sa.Column("last_used_at", UTC, nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name="fk_server_uses_job_id_jobs", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_server_uses"),
        sa.UniqueConstraint("job_id", "server", name="uq_server_uses_job_id_server"),
    )
    op.create_index("ix_server_uses_job_id", "server_uses", ["job_id"])
    op.create_index("ix_server_uses_key", "server_uses", ["key"])


def downgrade() -> None:
    """Back to 0014."""
    op.drop_index("ix_server_uses_key", table_name="server_uses")
    op.drop_index("ix_server_uses_job_id", table_name="server_uses")
    op.drop_table("server_uses")
