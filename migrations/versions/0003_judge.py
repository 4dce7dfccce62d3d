"""judge: feedback rationale and judge model; judge_calls

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01

``feedback.rationale`` and ``feedback.judge_model`` hold why an LLM judge rated as it did
and which model judged (trainer/judge.py). ``judge_calls`` holds one row per judge call
(attempt) or per call the budget refused: the per-project budget (calls and known cost
per hour) counts them, and failures are counted there.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("feedback") as batch:
        batch.add_column(sa.Column("rationale", sa.Text(), nullable=True))
        batch.add_column(sa.Column("judge_model", sa.String(length=200), nullable=True))
    op.create_table(
        "judge_calls",
        sa.Column("id", sa.String(length=128), nullable=False),
        sa.Column("project_id", sa.String(length=128), nullable=False),
        sa.Column("session_id", sa.String(length=128), nullable=True),
        sa.Column("mode", sa.String(length=16), nullable=False),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("outcome", sa.String(length=16), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("cost_usd", sa.Float(), nullable=True),
        sa.Column("latency_ms", sa.Float(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["project_id"],
            ["projects.id"],
            name=op.f("fk_judge_calls_project_id_projects"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_judge_calls")),
    )
    op.create_index(
        "ix_judge_calls_project_created", "judge_calls", ["project_id", "created_at"], unique=False
    )


def downgrade() -> None:
    op.drop_index("ix_judge_calls_project_created", table_name="judge_calls")
    op.drop_table("judge_calls")
    with op.batch_alter_table("feedback") as batch:
        batch.drop_column("judge_model")
        batch.drop_column("rationale")
