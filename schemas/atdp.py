"""ATDP v1, the Agent Trajectory Data Protocol: the wire format of every record.

These Pydantic models are the source of the JSON Schema files in ``schemas/json/``
(``python -m schemas.generate`` writes them; a test checks they are current). The
SQLAlchemy tables that store the records are in ``schemas/tables.py``; the conversion
between the two is in ``schemas/convert.py``.

Token data on the wire is plain JSON arrays: ``prompt_token_ids`` and
``completion_token_ids`` (integers) and ``completion_logprobs`` (one float per completion
token, the logprob the engine reported for the token it sampled).
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

ATDP_VERSION = "1"


class Record(BaseModel):
    """Base of every ATDP record: closed shape, versioned."""

    model_config = ConfigDict(extra="forbid", use_enum_values=True)

    atdp_version: Literal["1"] = ATDP_VERSION


class KeyKind(StrEnum):
    admin = "admin"
    agent = "agent"
    feedback = "feedback"


class SessionStatus(StrEnum):
    open = "open"
    closed = "closed"
    expired = "expired"


class ClientProtocol(StrEnum):
    openai_chat = "openai-chat"
    openai_responses = "openai-responses"
    anthropic_messages = "anthropic-messages"
    openai_completions = "openai-completions"
    areal = "areal"


class FeedbackScale(StrEnum):
    binary = "binary"
    stars5 = "stars-5"
    scalar = "scalar"


class FeedbackSource(StrEnum):
    user = "user"
    verifier = "verifier"
    judge = "judge"
    next_turn = (
        "next_turn"  # a rule classifier read the user's next message (trainer/next_turn_rules.py)
    )
    system = "system"


class FeedbackTarget(StrEnum):
    session = "session"
    interaction = "interaction"
    group = "group"


class PolicyStatus(StrEnum):
    candidate = "candidate"
    serving = "serving"
    retired = "retired"
    rejected = "rejected"


class RunTrigger(StrEnum):
    schedule = "schedule"
    manual = "manual"
    threshold = "threshold"


class RunStatus(StrEnum):
    queued = "queued"
    running = "running"
    published = "published"
    trained_not_published = "trained-not-published"
    failed = "failed"
    cancelled = "cancelled"


Id = Annotated[str, Field(min_length=1, max_length=128)]
Metadata = dict[str, Any]


class Project(Record):
    """A tenant: keys, sessions, adapters and runs belong to one project."""

    id: Id
    name: str
    created_at: datetime
    training_paused: bool = False
    settings: Metadata = Field(
        default_factory=dict, description="Per-project overrides (credit assignment, training)."
    )


class ApiKey(Record):
    """An API key. Only the SHA-256 hash of the secret is ever stored."""

    id: Id
    project_id: Id
    kind: KeyKind
    key_hash: str = Field(pattern=r"^[0-9a-f]{64}$", description="hex SHA-256 of the secret")
    prefix: str = Field(description="first characters of the secret, for display")
    name: str | None = None
    session_id: Id | None = Field(None, description="fixed session binding (per-session keys)")
    created_at: datetime
    revoked_at: datetime | None = None
    last_used_at: datetime | None = None


class Session(Record):
    """A trajectory: the calls of one agent on one task."""

    id: Id
    project_id: Id
    task_id: str | None = None
    agent_name: str | None = None
    client_protocol: ClientProtocol | None = None
    external_id: str | None = Field(
        None, description="the client's own session id, e.g. Claude Code's"
    )
    api_key_id: Id | None = None
    status: SessionStatus = SessionStatus.open
    created_at: datetime
    last_activity_at: datetime
    closed_at: datetime | None = None
    metadata: Metadata = Field(default_factory=dict)


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str
    name: str
    arguments: str = Field(
        description="the arguments as the model wrote them (JSON text); for a custom tool "
        "call, its free-form input"
    )
    type: Literal["function", "custom"] = Field(
        "function", description="custom: a call of an OpenAI Responses custom tool"
    )
    cut: bool = Field(
        False,
        description="cut by the output limit (the last call of a forced turn that hit it): "
        "its arguments are as generated so far, possibly not whole JSON",
    )


class ParsedOutput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    text: str | None = None
    reasoning: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)


class Usage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    prompt_tokens: int = Field(ge=0)
    completion_tokens: int = Field(ge=0)
    cached_tokens: int = Field(0, ge=0)


class Interaction(Record):
    """One model call (one choice of it when ``n > 1``), token-exact."""

    id: Id = Field(description="the id the client saw: chatcmpl-..., msg_..., resp_...")
    project_id: Id
    session_id: Id
    seq: int = Field(ge=0, description="position in the session")
    parent_id: Id | None = Field(
        None, description="the interaction whose prompt+answer this prompt extends"
    )
    group_id: Id | None = Field(None, description="shared by the choices of one n>1 request")
    choice_index: int = Field(0, ge=0)
    request: Metadata = Field(
        description="messages, tools and sampling params as the client sent them"
    )
    prompt_token_ids: list[int]
    completion_token_ids: list[int]
    completion_logprobs: list[float] = Field(
        description="logprob of each sampled token, as the engine reported it"
    )
    temperature: float = Field(ge=0)
    top_p: float = Field(gt=0, le=1)
    min_p: float = Field(0.0, ge=0, le=1, description="0: off (vLLM's and SGLang's)")
    frequency_penalty: float = Field(
        0.0, ge=-2, le=2, description="OpenAI's; not 0: sampled from a penalized distribution"
    )
    presence_penalty: float = Field(
        0.0, ge=-2, le=2, description="OpenAI's; not 0: sampled from a penalized distribution"
    )
    policy_version: str = Field(description="adapter name that served the call, or 'base'")
    finish_reason: str = Field(description="stop, length, tool_calls or abort")
    output: ParsedOutput
    usage: Usage
    latency_ms: float | None = Field(None, ge=0)
    ttft_ms: float | None = Field(None, ge=0)
    engine_url: str | None = None
    created_at: datetime
    reward: float | None = Field(
        None, ge=-1, le=1, description="aggregated reward, set by credit assignment"
    )
    consumed_by_run_id: Id | None = None
    continuation_hash: str | None = Field(
        None, description="hash of the request messages plus this answer (session stitching)"
    )
    attempt: int = Field(
        0,
        ge=0,
        description="the client SDK's retry count of this request (x-stainless-retry-count)",
    )
    superseded_by: Id | None = Field(
        None, description="the client's retry of this same request: this answer was orphaned"
    )

    @model_validator(mode="after")
    def _aligned(self) -> Interaction:
        if len(self.completion_logprobs) != len(self.completion_token_ids):
            raise ValueError("completion_logprobs must have one value per completion token id")
        return self


class Feedback(Record):
    """A rating of a session, an interaction or an interaction group."""

    id: Id
    project_id: Id
    target_type: FeedbackTarget
    target_id: Id
    session_id: Id | None = None
    value: float | bool
    scale: FeedbackScale
    scale_min: float | None = None
    scale_max: float | None = None
    reward: float = Field(ge=-1, le=1, description="value normalized linearly onto [-1, 1]")
    source: FeedbackSource = FeedbackSource.user
    rater: str | None = None
    comment: str | None = None
    idempotency_key: str | None = None
    created_at: datetime
    rationale: str | None = Field(None, description="why the judge gave this rating")
    judge_model: str | None = Field(None, description="the model that judged (source judge)")


class LoraConfig(BaseModel):
    model_config = ConfigDict(extra="allow")

    r: int = Field(gt=0)
    lora_alpha: float
    lora_dropout: float = 0.0
    target_modules: list[str]


class PolicyVersion(Record):
    """A LoRA adapter version of a project's policy."""

    id: Id
    project_id: Id
    name: str = Field(description="engine-facing adapter name, e.g. policy-v7")
    version: int = Field(ge=1)
    parent_name: str | None = None
    base_model: str
    path: str
    lora_config: LoraConfig
    created_by_run_id: Id | None = None
    status: PolicyStatus = PolicyStatus.candidate
    eval_metrics: Metadata = Field(default_factory=dict)
    created_at: datetime
    promoted_at: datetime | None = None


class TrainingRun(Record):
    """One training job of a project."""

    id: Id
    project_id: Id
    trigger: RunTrigger
    status: RunStatus = RunStatus.queued
    config: Metadata = Field(default_factory=dict, description="config snapshot the run used")
    num_samples: int = Field(0, ge=0, description="interactions consumed")
    step_metrics: list[Metadata] = Field(default_factory=list)
    policy_version_id: Id | None = None
    error: str | None = None
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None


class AuditEvent(Record):
    """Who did what to which data."""

    id: Id
    project_id: Id | None = None
    actor: str = Field(description="key id, 'cli' or 'system'")
    action: str = Field(description="e.g. key.create, key.revoke, export, adapter.promote")
    target_type: str | None = None
    target_id: str | None = None
    details: Metadata = Field(default_factory=dict)
    created_at: datetime


RECORD_TYPES: dict[str, type[Record]] = {
    "Project": Project,
    "ApiKey": ApiKey,
    "Session": Session,
    "Interaction": Interaction,
    "Feedback": Feedback,
    "PolicyVersion": PolicyVersion,
    "TrainingRun": TrainingRun,
    "AuditEvent": AuditEvent,
}
