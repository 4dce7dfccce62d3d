"""interactions: min_p

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-03

``min_p``: the min-p the call was sampled with (0 = off; vLLM's and SGLang's extension,
taken by Chat Completions and Responses). Like ``top_p`` it filters what is drawn, not the
recorded logprobs (computed before filtering, as SGLang does), so such samples are trained.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("interactions") as batch:
        batch.add_column(sa.Column("min_p", sa.Float(), server_default="0", nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("interactions") as batch:
        batch.drop_column("min_p")
