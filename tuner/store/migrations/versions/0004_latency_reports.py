"""Latency reports: how a job's side-by-side latencies were measured (interleaved rounds, warnings).

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Add jobs.latency_report_json."""
    op.add_column("jobs", sa.Column("latency_report_json", sa.Text(), nullable=True))


def downgrade() -> None:
    """Drop jobs.latency_report_json."""
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("latency_report_json")
