"""response_deletions: DELETE /v1/responses/{id} as a marker

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-03

``response_deletions`` (the response id, its project, the deleting key, when): a deleted
response is hidden from the Responses API; its interaction record is never touched.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "response_deletions",
        sa.Column("response_id", sa.String(length=128), nullable=False),
        sa.Column("project_id", sa.String(length=128), nullable=False),
        sa.Column("api_key_id", sa.String(length=128), nullable=True),
        sa.Column("deleted_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["project_id"],
            ["projects.id"],
            name=op.f("fk_response_deletions_project_id_projects"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("response_id", name=op.f("pk_response_deletions")),
    )


def downgrade() -> None:
    op.drop_table("response_deletions")
