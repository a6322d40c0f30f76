"""Service: owners of models and jobs, job cancellation, stage and reference latencies, API tokens.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UTC = sa.DateTime(timezone=True)


def upgrade() -> None:
    """Add owners (the same bytes may now be uploaded once per owner), cancellation, stages, tokens."""
    op.add_column("models", sa.Column("owner", sa.String(64), server_default="", nullable=False))
    op.drop_index("ix_models_sha256", table_name="models")
    op.create_index("ix_models_sha256", "models", ["sha256"])
    op.create_index("uq_models_owner_sha256", "models", ["owner", "sha256"], unique=True)

    op.add_column("jobs", sa.Column("owner", sa.String(64), server_default="", nullable=False))
    op.add_column(
        "jobs", sa.Column("cancel_requested", sa.Boolean(), server_default=sa.false(), nullable=False)
    )
    op.add_column("jobs", sa.Column("stage", sa.String(32), nullable=True))
    op.add_column("jobs", sa.Column("reference_latency_json", sa.Text(), nullable=True))
    op.create_index("ix_jobs_owner", "jobs", ["owner"])

    op.create_table(
        "api_tokens",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("token_sha256", sa.String(64), nullable=False),
        sa.Column("created_at", UTC, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_api_tokens"),
    )
    op.create_index("ix_api_tokens_name", "api_tokens", ["name"], unique=True)
    op.create_index("ix_api_tokens_token_sha256", "api_tokens", ["token_sha256"], unique=True)


def downgrade() -> None:
    """Back to 0001 (fails if two owners uploaded the same bytes)."""
    op.drop_table("api_tokens")
    op.drop_index("ix_jobs_owner", table_name="jobs")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("reference_latency_json")
        batch.drop_column("stage")
        batch.drop_column("cancel_requested")
        batch.drop_column("owner")
    op.drop_index("uq_models_owner_sha256", table_name="models")
    op.drop_index("ix_models_sha256", table_name="models")
    op.create_index("ix_models_sha256", "models", ["sha256"], unique=True)
    with op.batch_alter_table("models") as batch:
        batch.drop_column("owner")
