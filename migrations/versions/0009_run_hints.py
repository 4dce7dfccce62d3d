"""run_hints: the hints a training run's teacher saw

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-03

One row per hinted sample of a run (trainer/hints.py): the words (a rating's comment or
the user's next message), their origin, the teacher (base model or policy) and the mean
per-token advantage they gave. The dashboard's session page shows them beside the credit.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "run_hints",
        sa.Column("id", sa.String(length=128), nullable=False),
        sa.Column("run_id", sa.String(length=128), nullable=False),
        sa.Column("interaction_id", sa.String(length=128), nullable=False),
        sa.Column("feedback_id", sa.String(length=128), nullable=True),
        sa.Column("origin", sa.String(length=16), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("teacher", sa.String(length=16), nullable=False),
        sa.Column("adv_mean", sa.Float(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["training_runs.id"],
            name=op.f("fk_run_hints_run_id_training_runs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_run_hints")),
    )
    op.create_index("ix_run_hints_interaction", "run_hints", ["interaction_id"])


def downgrade() -> None:
    op.drop_index("ix_run_hints_interaction", table_name="run_hints")
    op.drop_table("run_hints")
