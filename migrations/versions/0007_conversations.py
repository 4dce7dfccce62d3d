"""conversations: the OpenAI Conversations API

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03

``conversations`` (project, creating key, metadata, a deletion marker) and
``conversation_items`` (the items in the API's shape, ordered by ``seq``; a deletion
marker per item). Deleting hides rows from the API; interaction records are never touched.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

JSONType = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def upgrade() -> None:
    op.create_table(
        "conversations",
        sa.Column("id", sa.String(length=128), nullable=False),
        sa.Column("project_id", sa.String(length=128), nullable=False),
        sa.Column("api_key_id", sa.String(length=128), nullable=True),
        sa.Column("key_session_id", sa.String(length=128), nullable=True),
        sa.Column("metadata", JSONType, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("deleted_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["project_id"],
            ["projects.id"],
            name=op.f("fk_conversations_project_id_projects"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_conversations")),
    )
    op.create_index(
        "ix_conversations_project_created", "conversations", ["project_id", "created_at"]
    )
    op.create_table(
        "conversation_items",
        sa.Column("seq", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("id", sa.String(length=128), nullable=False),
        sa.Column("conversation_id", sa.String(length=128), nullable=False),
        sa.Column("response_id", sa.String(length=128), nullable=True),
        sa.Column("item", JSONType, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("deleted_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["conversation_id"],
            ["conversations.id"],
            name=op.f("fk_conversation_items_conversation_id_conversations"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("seq", name=op.f("pk_conversation_items")),
        sa.UniqueConstraint("id", name=op.f("uq_conversation_items_id")),
    )
    op.create_index(
        "ix_conversation_items_conversation_seq",
        "conversation_items",
        ["conversation_id", "seq"],
    )


def downgrade() -> None:
    op.drop_index("ix_conversation_items_conversation_seq", table_name="conversation_items")
    op.drop_table("conversation_items")
    op.drop_index("ix_conversations_project_created", table_name="conversations")
    op.drop_table("conversations")
