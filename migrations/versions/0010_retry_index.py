"""retry_index: the SDK resends of a project, indexed on their own

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-05

Every recorded batch looks up the retries (``attempt > 0``) of its projects from the last
30 minutes, to mark an orphan recorded after its retry (gateway/recording/retries.py).
With only ``(project_id, created_at)`` that read every interaction of those 30 minutes;
a partial index holds the retries alone, a handful.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(
        "ix_interactions_retries",
        "interactions",
        ["project_id", "created_at"],
        postgresql_where=sa.text("attempt > 0"),
        sqlite_where=sa.text("attempt > 0"),
    )


def downgrade() -> None:
    op.drop_index("ix_interactions_retries", table_name="interactions")
