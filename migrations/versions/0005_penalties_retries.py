"""interactions: penalties and client retries

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02

``frequency_penalty`` / ``presence_penalty``: the OpenAI penalties a call was sampled with
(0 = none); a penalized sample's logprobs are not the policy's, so it is never trained on.
``attempt``: the client SDK's retry count of the request (``x-stainless-retry-count``);
``superseded_by``: on an answer the client never received, the id of the retry that
replaced it (gateway/recording/retries.py); such an orphan is never trained on (trainer/data.py).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("interactions") as batch:
        batch.add_column(
            sa.Column("frequency_penalty", sa.Float(), server_default="0", nullable=False)
        )
        batch.add_column(
            sa.Column("presence_penalty", sa.Float(), server_default="0", nullable=False)
        )
        batch.add_column(sa.Column("attempt", sa.Integer(), server_default="0", nullable=False))
        batch.add_column(sa.Column("superseded_by", sa.String(length=128), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("interactions") as batch:
        for name in ("superseded_by", "attempt", "presence_penalty", "frequency_penalty"):
            batch.drop_column(name)
