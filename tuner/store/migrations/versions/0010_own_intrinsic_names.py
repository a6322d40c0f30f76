"""Kiln's tensor intrinsics carry names of their own: records measured before refer to them by the old names
(``dot_16x4_vnni``, TVM's own name, which plain TVM resolves to TVM's intrinsic; ``dot_8x4_avxvnni``;
``dot_16x2_avx512bf16``), so their traces are rewritten to the new ones.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

RENAMED = {
    "dot_16x4_vnni": "kiln_dot_16x4_vnni",
    "dot_8x4_avxvnni": "kiln_dot_8x4_avxvnni",
    "dot_16x2_avx512bf16": "kiln_dot_16x2_avx512bf16",
}


def _rename(names: dict[str, str]) -> None:
    # The names appear as JSON strings in a trace (a Tensorize instruction's argument, an annotation's value).
    for old, new in names.items():
        for column in ("trace_json", "record_json"):
            op.execute(
                sa.text(
                    f"UPDATE tuning_records SET {column} = REPLACE({column}, :old, :new) WHERE {column} LIKE :like"
                ).bindparams(old=f'"{old}"', new=f'"{new}"', like=f'%"{old}"%')
            )


def upgrade() -> None:
    """Rewrite the old intrinsic names in stored traces."""
    _rename(RENAMED)


def downgrade() -> None:
    """Back to the old names."""
    _rename({new: old for old, new in RENAMED.items()})
