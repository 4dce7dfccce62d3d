"""verify_leases: the verify tasks each project has running

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02

One row per running verify task (its project and slot, 0 .. RLGATE_VERIFY_PER_PROJECT-1):
a project whose slots are taken waits, so one project's slow judge or command cannot take
the whole verify pool (trainer/verify_leases.py). A row outlives a killed task only until
``expires_at``.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "verify_leases",
        sa.Column("project_id", sa.String(length=128), nullable=False),
        sa.Column("slot", sa.Integer(), nullable=False),
        sa.Column("holder", sa.String(length=200), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("project_id", "slot", name=op.f("pk_verify_leases")),
    )


def downgrade() -> None:
    op.drop_table("verify_leases")
