"""SQLAlchemy 2.0 tables that store ATDP v1 records (see ``schemas/atdp.py``).

Hot queries and their indexes:
- key lookup by hash: ``api_keys.key_hash`` (unique);
- sessions by project and time: ``ix_sessions_project_created``;
  the latest session of a key: ``ix_sessions_key_activity``;
  a client's own session id: ``ix_sessions_project_external``;
- interactions by session and sequence: ``uq_interactions_session_seq``;
- rated-but-unconsumed interactions by project: ``ix_interactions_trainable``
  (partial index on both PostgreSQL and SQLite);
- feedback by target: ``ix_feedback_target``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from schemas.coltypes import Logprobs, PortableJSON, TokenIds, UTCDateTime, utcnow

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

ID = String(128)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map = {dict[str, Any]: PortableJSON, list[Any]: PortableJSON}


class ProjectRow(Base):
    __tablename__ = "projects"

    id: Mapped[str] = mapped_column(ID, primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    training_paused: Mapped[bool] = mapped_column(Boolean, default=False)
    settings: Mapped[dict[str, Any]] = mapped_column(default=dict)


class ApiKeyRow(Base):
    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(ID, primary_key=True)
    project_id: Mapped[str] = mapped_column(
        ForeignKey("projects.id", ondelete="CASCADE"), index=True
    )
    kind: Mapped[str] = mapped_column(String(16))
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    name: Mapped[str | None] = mapped_column(String(200))
    session_id: Mapped[str | None] = mapped_column(ID)
    # the key that minted this one (POST /v1/sessions, /rl/start_session); revoking it
    # revokes this one
    parent_key_id: Mapped[str | None] = mapped_column(ID, index=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    last_used_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class SessionRow(Base):
    __tablename__ = "sessions"
    __table_args__ = (
        Index("ix_sessions_project_created", "project_id", "created_at"),
        Index("ix_sessions_project_external", "project_id", "external_id"),
        Index("ix_sessions_key_activity", "api_key_id", "last_activity_at"),
        Index("ix_sessions_status_activity", "status", "last_activity_at"),
    )

    id: Mapped[str] = mapped_column(ID, primary_key=True)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    task_id: Mapped[str | None] = mapped_column(String(200))
    agent_name: Mapped[str | None] = mapped_column(String(200))
    client_protocol: Mapped[str | None] = mapped_column(String(32))
    external_id: Mapped[str | None] = mapped_column(String(200))
    api_key_id: Mapped[str | None] = mapped_column(ID)
    status: Mapped[str] = mapped_column(String(16), default="open")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    last_activity_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    closed_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    meta: Mapped[dict[str, Any]] = mapped_column("metadata", default=dict)


class InteractionRow(Base):
    __tablename__ = "interactions"
    __table_args__ = (
        UniqueConstraint("session_id", "seq", name="uq_interactions_session_seq"),
        Index("ix_interactions_group", "group_id"),
        Index("ix_interactions_project_created", "project_id", "created_at"),
        Index("ix_interactions_continuation", "project_id", "continuation_hash"),
        Index(
            "ix_interactions_trainable",
            "project_id",
            "created_at",
            postgresql_where=text("reward IS NOT NULL AND consumed_by_run_id IS NULL"),
            sqlite_where=text("reward IS NOT NULL AND consumed_by_run_id IS NULL"),
        ),
        # the few SDK resends (gateway/recording/retries.py), looked up by every recorded batch
        Index(
            "ix_interactions_retries",
            "project_id",
            "created_at",
            postgresql_where=text("attempt > 0"),
            sqlite_where=text("attempt > 0"),
        ),
    )

    id: Mapped[str] = mapped_column(ID, primary_key=True)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    session_id: Mapped[str] = mapped_column(ForeignKey("sessions.id", ondelete="CASCADE"))
    seq: Mapped[int] = mapped_column(Integer)
    parent_id: Mapped[str | None] = mapped_column(ID)
    group_id: Mapped[str | None] = mapped_column(ID)
    choice_index: Mapped[int] = mapped_column(Integer, default=0)
    request: Mapped[dict[str, Any]] = mapped_column()
    prompt_token_ids: Mapped[list[int]] = mapped_column(TokenIds)
    completion_token_ids: Mapped[list[int]] = mapped_column(TokenIds)
    completion_logprobs: Mapped[list[float]] = mapped_column(Logprobs)
    temperature: Mapped[float] = mapped_column(Float)
    top_p: Mapped[float] = mapped_column(Float)
    min_p: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    frequency_penalty: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    presence_penalty: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    policy_version: Mapped[str] = mapped_column(String(200))
    finish_reason: Mapped[str] = mapped_column(String(32))
    output: Mapped[dict[str, Any]] = mapped_column()
    usage: Mapped[dict[str, Any]] = mapped_column()
    latency_ms: Mapped[float | None] = mapped_column(Float)
    ttft_ms: Mapped[float | None] = mapped_column(Float)
    engine_url: Mapped[str | None] = mapped_column(String(500))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    reward: Mapped[float | None] = mapped_column(Float)
    consumed_by_run_id: Mapped[str | None] = mapped_column(ID)
    # hash of (request messages + this answer): a later call whose messages start with
    # exactly this conversation continues it (session stitching, parent links)
    continuation_hash: Mapped[str | None] = mapped_column(String(64))
    # a client SDK's resend of a timed-out request (gateway/recording/retries.py): its retry count,
    # and on the orphaned earlier answer the id of the retry that replaced it
    attempt: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    superseded_by: Mapped[str | None] = mapped_column(ID)


class FeedbackRow(Base):
    __tablename__ = "feedback"
    __table_args__ = (
        Index("ix_feedback_target", "target_type", "target_id"),
        Index("ix_feedback_session", "session_id"),
        Index("ix_feedback_project_created", "project_id", "created_at"),
        UniqueConstraint("project_id", "idempotency_key", name="uq_feedback_idempotency"),
    )

    id: Mapped[str] = mapped_column(ID, primary_key=True)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    target_type: Mapped[str] = mapped_column(String(16))
    target_id: Mapped[str] = mapped_column(ID)
    session_id: Mapped[str | None] = mapped_column(ID)
    value: Mapped[Any] = mapped_column(PortableJSON)
    scale: Mapped[str] = mapped_column(String(16))
    scale_min: Mapped[float | None] = mapped_column(Float)
    scale_max: Mapped[float | None] = mapped_column(Float)
    reward: Mapped[float] = mapped_column(Float)
    source: Mapped[str] = mapped_column(String(16), default="user")
    rater: Mapped[str | None] = mapped_column(String(200))
    comment: Mapped[str | None] = mapped_column(Text)
    idempotency_key: Mapped[str | None] = mapped_column(String(200))
    request_hash: Mapped[str | None] = mapped_column(String(64))
    api_key_id: Mapped[str | None] = mapped_column(ID)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    rationale: Mapped[str | None] = mapped_column(Text)
    judge_model: Mapped[str | None] = mapped_column(String(200))


class JudgeCallRow(Base):
    """One call (one attempt) of the LLM judge, or one the budget refused: what the
    per-project budget counts (calls and known cost per hour) and what failed."""

    __tablename__ = "judge_calls"
    __table_args__ = (Index("ix_judge_calls_project_created", "project_id", "created_at"),)

    id: Mapped[str] = mapped_column(ID, primary_key=True)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    session_id: Mapped[str | None] = mapped_column(ID)
    mode: Mapped[str] = mapped_column(String(16))
    model: Mapped[str] = mapped_column(String(200))
    # ok | unparsable | error | timeout | budget | refused
    outcome: Mapped[str] = mapped_column(String(16))
    attempt: Mapped[int] = mapped_column(Integer, default=1)
    cost_usd: Mapped[float | None] = mapped_column(Float)
    latency_ms: Mapped[float | None] = mapped_column(Float)
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class RunHintRow(Base):
    """A hint a training run's teacher saw (trainer/hints.py): the words, where they came
    from (a rating's comment, or the user's next message), the teacher, and the mean
    per-token advantage they gave the answer's sampled tokens."""

    __tablename__ = "run_hints"
    __table_args__ = (Index("ix_run_hints_interaction", "interaction_id"),)

    id: Mapped[str] = mapped_column(ID, primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("training_runs.id", ondelete="CASCADE"))
    interaction_id: Mapped[str] = mapped_column(ID)
    feedback_id: Mapped[str | None] = mapped_column(ID)
    origin: Mapped[str] = mapped_column(String(16))  # comment | next_message
    text: Mapped[str] = mapped_column(Text)
    teacher: Mapped[str] = mapped_column(String(16))  # base | policy
    adv_mean: Mapped[float | None] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class VerifyLeaseRow(Base):
    """A running verify task's slot in its project's share of the verify pool
    (trainer/verify_leases.py); gone when the task ends, or stale after ``expires_at``."""

    __tablename__ = "verify_leases"

    project_id: Mapped[str] = mapped_column(ID, primary_key=True)
    slot: Mapped[int] = mapped_column(Integer, primary_key=True)
    holder: Mapped[str] = mapped_column(String(200))
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime)


class PolicyVersionRow(Base):
    __tablename__ = "policy_versions"
    __table_args__ = (
        UniqueConstraint("project_id", "version", name="uq_policy_versions_project_version"),
        UniqueConstraint("project_id", "name", name="uq_policy_versions_project_name"),
        Index("ix_policy_versions_project_status", "project_id", "status"),
    )

    id: Mapped[str] = mapped_column(ID, primary_key=True)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(200))
    version: Mapped[int] = mapped_column(Integer)
    parent_name: Mapped[str | None] = mapped_column(String(200))
    base_model: Mapped[str] = mapped_column(String(500))
    path: Mapped[str] = mapped_column(String(1000))
    lora_config: Mapped[dict[str, Any]] = mapped_column()
    created_by_run_id: Mapped[str | None] = mapped_column(ID)
    status: Mapped[str] = mapped_column(String(16), default="candidate")
    eval_metrics: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    promoted_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class TrainingRunRow(Base):
    __tablename__ = "training_runs"
    __table_args__ = (
        Index("ix_training_runs_project_created", "project_id", "created_at"),
        Index("ix_training_runs_project_status", "project_id", "status"),
    )

    id: Mapped[str] = mapped_column(ID, primary_key=True)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    trigger: Mapped[str] = mapped_column(String(16))
    status: Mapped[str] = mapped_column(String(32), default="queued")
    config: Mapped[dict[str, Any]] = mapped_column(default=dict)
    num_samples: Mapped[int] = mapped_column(Integer, default=0)
    step_metrics: Mapped[list[Any]] = mapped_column(default=list)
    policy_version_id: Mapped[str | None] = mapped_column(ID)
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class AuditEventRow(Base):
    __tablename__ = "audit_events"
    __table_args__ = (Index("ix_audit_events_project_created", "project_id", "created_at"),)

    id: Mapped[str] = mapped_column(ID, primary_key=True)
    project_id: Mapped[str | None] = mapped_column(ID)
    actor: Mapped[str] = mapped_column(String(200))
    action: Mapped[str] = mapped_column(String(64))
    target_type: Mapped[str | None] = mapped_column(String(32))
    target_id: Mapped[str | None] = mapped_column(ID)
    details: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class ConversationRow(Base):
    """An OpenAI Conversations API conversation (gateway/api/openai_responses/
    conversations.py). Its turns through ``responses.create`` form one session: the
    conversation id is that session's external id. ``deleted_at`` hides it from the API;
    the interaction records of its turns are never touched."""

    __tablename__ = "conversations"
    __table_args__ = (Index("ix_conversations_project_created", "project_id", "created_at"),)

    id: Mapped[str] = mapped_column(ID, primary_key=True)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    api_key_id: Mapped[str | None] = mapped_column(ID)
    # the session of the per-session key that created it (only such keys of that session
    # see it); None for a project-wide key
    key_session_id: Mapped[str | None] = mapped_column(ID)
    meta: Mapped[dict[str, Any]] = mapped_column("metadata", default=dict)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    deleted_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class ConversationItemRow(Base):
    """One item of a conversation, in the API's shape; ``seq`` orders them. Items added by
    a response name it (``response_id``); ``deleted_at`` hides an item from the API."""

    __tablename__ = "conversation_items"
    __table_args__ = (
        Index("ix_conversation_items_conversation_seq", "conversation_id", "seq"),
        UniqueConstraint("id"),
    )

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(ID)
    conversation_id: Mapped[str] = mapped_column(ForeignKey("conversations.id", ondelete="CASCADE"))
    response_id: Mapped[str | None] = mapped_column(ID)
    item: Mapped[dict[str, Any]] = mapped_column()
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    deleted_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class ResponseDeletionRow(Base):
    """``DELETE /v1/responses/{id}`` (gateway/api/openai_responses/router.py): the marker
    that hides a stored response from the API (GET, its input items and
    ``previous_response_id`` then 404). The interaction record is never touched."""

    __tablename__ = "response_deletions"

    response_id: Mapped[str] = mapped_column(ID, primary_key=True)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    api_key_id: Mapped[str | None] = mapped_column(ID)
    deleted_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
