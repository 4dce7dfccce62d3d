"""api keys: parent_key_id; key prefixes shortened

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30

``api_keys.parent_key_id`` (indexed) records the key that minted a key (POST /v1/sessions,
/rl/start_session), so revoking the parent revokes its children. Stored prefixes are cut
to what a key list may show: 8 characters of generated keys (``rlg_<kind>_...``, 50+
characters long), 2 of any other key (caller-chosen keys could be as short as 8
characters before this revision, and a prefix may show at most a quarter of a key).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        batch.add_column(sa.Column("parent_key_id", sa.String(length=128), nullable=True))
        batch.create_index(op.f("ix_api_keys_parent_key_id"), ["parent_key_id"], unique=False)
    op.execute(
        "UPDATE api_keys SET prefix = CASE WHEN substr(prefix, 1, 4) = 'rlg_' "
        "THEN substr(prefix, 1, 8) ELSE substr(prefix, 1, 2) END"
    )


def downgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_index(op.f("ix_api_keys_parent_key_id"))
        batch.drop_column("parent_key_id")
