"""initial ATDP v1 schema

Revision ID: 0001
Revises:
Create Date: 2026-11-29

Every ATDP v1 table. Token ids (int32) and logprobs (float64) are packed little-endian
bytes (see schemas/coltypes.py); JSON columns are JSONB on PostgreSQL.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

JSONType = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def upgrade() -> None:
    op.create_table(
        "audit_events",
        sa.Column("id", sa.String(length=128), nullable=False),
        sa.Column("project_id", sa.String(length=128), nullable=True),
        sa.Column("actor", sa.String(length=200), nullable=False),
        sa.Column("action", sa.String(length=64), nullable=False),
        sa.Column("target_type", sa.String(length=32), nullable=True),
        sa.Column("target_id", sa.String(length=128), nullable=True),
        sa.Column("details", JSONType, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_events")),
    )
    op.create_index(
        "ix_audit_events_project_created",
        "audit_events",
        ["project_id", "created_at"],
        unique=False,
    )
    op.create_table(
        "projects",
        sa.Column("id", sa.String(length=128), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("training_paused", sa.Boolean(), nullable=False),
        sa.Column("settings", JSONType, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_projects")),
    )
    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(length=128), nullable=False),
        sa.Column("project_id", sa.String(length=128), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("key_hash", sa.String(length=64), nullable=False),
        sa.Column("prefix", sa.String(length=16), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=True),
        sa.Column("session_id", sa.String(length=128), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["project_id"],
            ["projects.id"],
            name=op.f("fk_api_keys_project_id_projects"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_keys")),
        sa.UniqueConstraint("key_hash", name=op.f("uq_api_keys_key_hash")),
    )
    op.create_index(op.f("ix_api_keys_project_id"), "api_keys", ["project_id"], unique=False)
    op.create_table(
        "feedback",
        sa.Column("id", sa.String(length=128), nullable=False),
        sa.Column("project_id", sa.String(length=128), nullable=False),
        sa.Column("target_type", sa.String(length=16), nullable=False),
        sa.Column("target_id", sa.String(length=128), nullable=False),
        sa.Column("session_id", sa.String(length=128), nullable=True),
        sa.Column("value", JSONType, nullable=False),
        sa.Column("scale", sa.String(length=16), nullable=False),
        sa.Column("scale_min", sa.Float(), nullable=True),
        sa.Column("scale_max", sa.Float(), nullable=True),
        sa.Column("reward", sa.Float(), nullable=False),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.Column("rater", sa.String(length=200), nullable=True),
        sa.Column("comment", sa.Text(), nullable=True),
        sa.Column("idempotency_key", sa.String(length=200), nullable=True),
        sa.Column("request_hash", sa.String(length=64), nullable=True),
        sa.Column("api_key_id", sa.String(length=128), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["project_id"],
            ["projects.id"],
            name=op.f("fk_feedback_project_id_projects"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_feedback")),
        sa.UniqueConstraint("project_id", "idempotency_key", name="uq_feedback_idempotency"),
    )
    op.create_index(
        "ix_feedback_project_created", "feedback", ["project_id", "created_at"], unique=False
    )
    op.create_index("ix_feedback_session", "feedback", ["session_id"], unique=False)
    op.create_index("ix_feedback_target", "feedback", ["target_type", "target_id"], unique=False)
    op.create_table(
        "policy_versions",
        sa.Column("id", sa.String(length=128), nullable=False),
        sa.Column("project_id", sa.String(length=128), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("parent_name", sa.String(length=200), nullable=True),
        sa.Column("base_model", sa.String(length=500), nullable=False),
        sa.Column("path", sa.String(length=1000), nullable=False),
        sa.Column("lora_config", JSONType, nullable=False),
        sa.Column("created_by_run_id", sa.String(length=128), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("eval_metrics", JSONType, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("promoted_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["project_id"],
            ["projects.id"],
            name=op.f("fk_policy_versions_project_id_projects"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_policy_versions")),
        sa.UniqueConstraint("project_id", "name", name="uq_policy_versions_project_name"),
        sa.UniqueConstraint("project_id", "version", name="uq_policy_versions_project_version"),
    )
    op.create_index(
        "ix_policy_versions_project_status",
        "policy_versions",
        ["project_id", "status"],
        unique=False,
    )
    op.create_table(
        "sessions",
        sa.Column("id", sa.String(length=128), nullable=False),
        sa.Column("project_id", sa.String(length=128), nullable=False),
        sa.Column("task_id", sa.String(length=200), nullable=True),
        sa.Column("agent_name", sa.String(length=200), nullable=True),
        sa.Column("client_protocol", sa.String(length=32), nullable=True),
        sa.Column("external_id", sa.String(length=200), nullable=True),
        sa.Column("api_key_id", sa.String(length=128), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_activity_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("closed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("metadata", JSONType, nullable=False),
        sa.ForeignKeyConstraint(
            ["project_id"],
            ["projects.id"],
            name=op.f("fk_sessions_project_id_projects"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_sessions")),
    )
    op.create_index(
        "ix_sessions_key_activity", "sessions", ["api_key_id", "last_activity_at"], unique=False
    )
    op.create_index(
        "ix_sessions_project_created", "sessions", ["project_id", "created_at"], unique=False
    )
    op.create_index(
        "ix_sessions_project_external", "sessions", ["project_id", "external_id"], unique=False
    )
    op.create_index(
        "ix_sessions_status_activity", "sessions", ["status", "last_activity_at"], unique=False
    )
    op.create_table(
        "training_runs",
        sa.Column("id", sa.String(length=128), nullable=False),
        sa.Column("project_id", sa.String(length=128), nullable=False),
        sa.Column("trigger", sa.String(length=16), nullable=False),
        sa.Column("status", sa.String(length=32), nullable=False),
        sa.Column("config", JSONType, nullable=False),
        sa.Column("num_samples", sa.Integer(), nullable=False),
        sa.Column("step_metrics", JSONType, nullable=False),
        sa.Column("policy_version_id", sa.String(length=128), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["project_id"],
            ["projects.id"],
            name=op.f("fk_training_runs_project_id_projects"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_training_runs")),
    )
    op.create_index(
        "ix_training_runs_project_created",
        "training_runs",
        ["project_id", "created_at"],
        unique=False,
    )
    op.create_index(
        "ix_training_runs_project_status", "training_runs", ["project_id", "status"], unique=False
    )
    op.create_table(
        "interactions",
        sa.Column("id", sa.String(length=128), nullable=False),
        sa.Column("project_id", sa.String(length=128), nullable=False),
        sa.Column("session_id", sa.String(length=128), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("parent_id", sa.String(length=128), nullable=True),
        sa.Column("group_id", sa.String(length=128), nullable=True),
        sa.Column("choice_index", sa.Integer(), nullable=False),
        sa.Column("request", JSONType, nullable=False),
        sa.Column("prompt_token_ids", sa.LargeBinary(), nullable=False),
        sa.Column("completion_token_ids", sa.LargeBinary(), nullable=False),
        sa.Column("completion_logprobs", sa.LargeBinary(), nullable=False),
        sa.Column("temperature", sa.Float(), nullable=False),
        sa.Column("top_p", sa.Float(), nullable=False),
        sa.Column("policy_version", sa.String(length=200), nullable=False),
        sa.Column("finish_reason", sa.String(length=32), nullable=False),
        sa.Column("output", JSONType, nullable=False),
        sa.Column("usage", JSONType, nullable=False),
        sa.Column("latency_ms", sa.Float(), nullable=True),
        sa.Column("ttft_ms", sa.Float(), nullable=True),
        sa.Column("engine_url", sa.String(length=500), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("reward", sa.Float(), nullable=True),
        sa.Column("consumed_by_run_id", sa.String(length=128), nullable=True),
        sa.Column("continuation_hash", sa.String(length=64), nullable=True),
        sa.ForeignKeyConstraint(
            ["project_id"],
            ["projects.id"],
            name=op.f("fk_interactions_project_id_projects"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["session_id"],
            ["sessions.id"],
            name=op.f("fk_interactions_session_id_sessions"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_interactions")),
        sa.UniqueConstraint("session_id", "seq", name="uq_interactions_session_seq"),
    )
    op.create_index("ix_interactions_group", "interactions", ["group_id"], unique=False)
    op.create_index(
        "ix_interactions_continuation",
        "interactions",
        ["project_id", "continuation_hash"],
        unique=False,
    )
    op.create_index(
        "ix_interactions_project_created",
        "interactions",
        ["project_id", "created_at"],
        unique=False,
    )
    op.create_index(
        "ix_interactions_trainable",
        "interactions",
        ["project_id", "created_at"],
        unique=False,
        postgresql_where=sa.text("reward IS NOT NULL AND consumed_by_run_id IS NULL"),
        sqlite_where=sa.text("reward IS NOT NULL AND consumed_by_run_id IS NULL"),
    )


def downgrade() -> None:
    op.drop_index(
        "ix_interactions_trainable",
        table_name="interactions",
        postgresql_where=sa.text("reward IS NOT NULL AND consumed_by_run_id IS NULL"),
        sqlite_where=sa.text("reward IS NOT NULL AND consumed_by_run_id IS NULL"),
    )
    op.drop_index("ix_interactions_project_created", table_name="interactions")
    op.drop_index("ix_interactions_group", table_name="interactions")
    op.drop_index("ix_interactions_continuation", table_name="interactions")
    op.drop_table("interactions")
    op.drop_index("ix_training_runs_project_status", table_name="training_runs")
    op.drop_index("ix_training_runs_project_created", table_name="training_runs")
    op.drop_table("training_runs")
    op.drop_index("ix_sessions_status_activity", table_name="sessions")
    op.drop_index("ix_sessions_project_external", table_name="sessions")
    op.drop_index("ix_sessions_project_created", table_name="sessions")
    op.drop_index("ix_sessions_key_activity", table_name="sessions")
    op.drop_table("sessions")
    op.drop_index("ix_policy_versions_project_status", table_name="policy_versions")
    op.drop_table("policy_versions")
    op.drop_index("ix_feedback_target", table_name="feedback")
    op.drop_index("ix_feedback_session", table_name="feedback")
    op.drop_index("ix_feedback_project_created", table_name="feedback")
    op.drop_table("feedback")
    op.drop_index(op.f("ix_api_keys_project_id"), table_name="api_keys")
    op.drop_table("api_keys")
    op.drop_table("projects")
    op.drop_index("ix_audit_events_project_created", table_name="audit_events")
    op.drop_table("audit_events")
