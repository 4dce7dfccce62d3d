"""One settings object for every rlgate process.

Values come from, in order of precedence: explicit keyword arguments, ``RLGATE_*``
environment variables, a TOML config file (``RLGATE_CONFIG`` or ``rlgate --config``),
then the defaults below. The defaults give the embedded shape: a SQLite file under the
data dir, the embedded CPU engine on localhost, the packaged SmolLM2-135M-Instruct and an
in-process broker.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from core.engine_workers import check_pattern
from core.grants import CommandGrant, Grants, JudgeGrant, check_entries
from core.redaction_patterns import compile_patterns

EMBEDDED_ENGINE_URL = "http://127.0.0.1:30000"
PACKAGED_MODEL = "packaged:smollm2-135m-instruct"
TRACKERS = ("wandb", "mlflow", "tensorboard")  # RLGATE_TRACKERS: trainer/tracking.py


class ConfigError(Exception):
    """A setting that cannot work; the message is one line that says what to change."""


ENV_PREFIX = "RLGATE_"  # every setting is an environment variable: RLGATE_<FIELD>


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore")

    data_dir: Path = Field(
        Path("./rlgate-data"),
        description="Where the SQLite file, model cache, adapters and spool live.",
    )
    database_url: str = Field(
        "", description="SQLAlchemy URL; default sqlite:///<data dir>/rlgate.db."
    )
    engine_urls: str = Field(
        EMBEDDED_ENGINE_URL,
        description="Comma-separated engine base URLs (SGLang native protocol).",
    )
    engine_router_url: str = Field(
        "",
        description="An sglang-router (SGLang Model Gateway) in front of the engines. When "
        "set, the gateway sends every generate call to it (it routes cache-aware and fails "
        "over), and adapters are loaded into each worker it lists (GET /workers); "
        "RLGATE_ENGINE_URLS is then not used.",
    )
    engine_router_workers: str = Field(
        "",
        description="The router's workers rlgate may load adapters into (and send the "
        "engine key): comma-separated scheme://host[:port], matched part by part: the "
        "host may hold globs within its labels and the port may be *, e.g. "
        "http://10.0.0.*:30000. A listed URL with user@, a path, a query or a fragment "
        "is never reached; a worker the router lists that matches no entry gets no key "
        "and no adapter, and is logged. Required with RLGATE_ENGINE_ROUTER_URL.",
    )
    engine: str = Field(
        "embedded",
        pattern="^(embedded|sglang)$",
        description="What `rlgate up` starts as its engine: the embedded CPU engine, or "
        "real SGLang (RLGATE_SGLANG_COMMAND, docs/engine.md).",
    )
    sglang_command: str = Field(
        "python3 -m sglang.launch_server",
        description="How `rlgate up --engine sglang` starts SGLang (a command line; rlgate "
        "adds --model-path, --host, --port, --api-key and the LoRA flags). The operator's "
        "own setting: data and the admin API never change it.",
    )
    sglang_args: str = Field(
        "",
        description="More SGLang flags for `rlgate up --engine sglang`, e.g. the CPU recipe's "
        "(docs/engine.md).",
    )
    engine_sync_s: float = Field(
        5.0,
        gt=0,
        description="How often each gateway checks that every engine holds the serving "
        "adapters, loading those an engine lacks (one that restarted or joined).",
    )
    unload_wait_s: float = Field(
        600.0,
        gt=0,
        description="After a rollback or promote, how long the gateway waits for its "
        "requests still on the replaced adapter before unloading it anyway (audited "
        "`adapter.unload` with `forced: true`). The switch itself answers at once.",
    )
    adapter_dir: Path | None = Field(
        None,
        description="Where trained adapters are written, and what every engine must be "
        "able to read at the same path (shared storage with several machines). Default: "
        "<data dir>/adapters.",
    )
    model_path: str = Field(
        PACKAGED_MODEL, description="HF model dir, or the packaged SmolLM2-135M-Instruct."
    )
    served_model_name: str = Field(
        "rlgate-policy", description="Model name clients see in /v1/models."
    )
    broker_url: str = Field(
        "", description="Celery broker; empty means embedded (SQLite-backed, no server)."
    )
    admin_key: SecretStr | None = Field(
        None, description="Bootstrap admin key, accepted as an admin credential."
    )
    engine_api_key: SecretStr | None = Field(
        None,
        description="The engines' --api-key: the gateway and the trainer send it as "
        "'Authorization: Bearer <key>'; `rlgate engine` requires it when set. `rlgate up` "
        "and `rlgate demo` generate a fresh one per start.",
    )
    gateway_host: str = Field("127.0.0.1", description="Gateway bind address.")
    gateway_port: int = Field(8000, description="Gateway port.")
    engine_port: int = Field(30000, description="Embedded engine port.")
    engine_weights: Literal["float", "int4"] = Field(
        "int4",
        description="Embedded engine's --weights: int4 keeps the packaged model's 4-bit "
        "projections packed (about 3x faster at one stream; logprobs move by about 0.01); "
        "float keeps float32 weights, exact to transformers.",
    )
    log_level: str = Field("info", description="Log level for every process.")
    tokenizer_path: str = Field(
        "", description="Tokenizer for chat templates; default: the model's."
    )
    default_project: str = Field("default", description="Project of the bootstrap admin key.")
    session_idle_timeout_s: float = Field(
        1800.0, gt=0, description="Idle time that ends a session."
    )
    max_in_flight_per_engine: int = Field(
        64,
        ge=1,
        description="In-flight bound per engine, shared fairly between projects: past it a "
        "request waits for a slot (RLGATE_ENGINE_QUEUE_WAIT_S), then 429. Set it near the "
        "engine's running batch so requests queue here, fairly, not in the engine's queue.",
    )
    engine_queue_wait_s: float = Field(
        30.0,
        ge=0,
        description="How long a request waits for an engine slot when every engine is full "
        "(freed slots go to the waiting project holding the fewest); past it, 429. 0: no wait.",
    )
    engine_timeout_s: float = Field(600.0, gt=0, description="Timeout of one engine request.")
    tool_parser: str = Field("hermes", description="Tool-call format: hermes or llama3_json.")
    train_tick_s: float = Field(
        60.0, gt=0, description="Trainer beat interval (schedule, threshold, retries)."
    )
    train_processes: int = Field(
        1,
        ge=1,
        le=64,
        description="Processes per training run. Above 1 the worker starts the run under "
        "torchrun on this machine: FSDP2 shards the frozen base's decoder layers across "
        "the processes, each forwards its share of every step, rank 0 saves and the worker "
        "publishes (docs/scaling.md). With CUDA, one GPU per process.",
    )
    train_backend: str = Field(
        "auto",
        pattern="^(auto|gloo|nccl)$",
        description="torch.distributed backend of a multi-process run: nccl, gloo, or auto "
        "(nccl when every process has a GPU of its own, else gloo).",
    )
    train_shared_gpu_engines: str = Field(
        "",
        description="Engines (comma-separated URLs, each one of the engines adapters are "
        "loaded into) that share a GPU with this worker's training runs. Before a run loads "
        "the base, each is paused and releases its GPU memory (SGLang "
        "/release_memory_occupation: needs --enable-memory-saver); after training it takes "
        "the memory back and continues, then the run publishes. Meanwhile its requests "
        "wait (docs/engine.md).",
    )
    reasoning_parser: bool = Field(False, description="Split <think>...</think> into reasoning.")
    serving_cache_s: float = Field(
        0.5, ge=0, description="How long the gateway caches which adapter serves a project."
    )
    default_max_tokens: int | None = Field(
        None,
        ge=1,
        description="Output limit for requests that name none (OpenAI's max_tokens, "
        "Responses' max_output_tokens). Unset: up to the model's context, as OpenAI does. "
        "Set it for clients that never send a limit (Codex) on a small or slow policy.",
    )
    # ---- request size and prompt work (gateway/edge/body_limit.py, gateway/call/render_pool.py)
    max_body_bytes: int = Field(
        4 * 1024 * 1024,
        ge=1024,
        description="Largest request body accepted, in bytes (413 past it). Claude Code "
        "sends about 120 KB on a first turn; a full 200k-token conversation is ~1-2 MB.",
    )
    prompt_chars_per_token: float = Field(
        16.0,
        gt=0,
        description="Most characters one prompt token is assumed to hold: a prompt longer "
        "than context length x this is a 400 before it is tokenized (text averages 3-5).",
    )
    render_workers: int = Field(
        4, ge=1, description="Threads that render chat templates and tokenize prompts."
    )
    render_timeout_s: float = Field(
        30.0,
        gt=0,
        description="Time limit for rendering and tokenizing one prompt, waiting for a "
        "render thread included (503 past it).",
    )
    spool_fsync: bool = Field(
        False,
        description="fdatasync the recording spool before each response (survives power "
        "loss; costs a disk flush per request batch). Off: records reach the spool file "
        "before the response is sent, which survives a gateway crash or kill.",
    )
    recording_backlog_max_mb: float = Field(
        256.0,
        gt=0,
        description="Most MiB of records that may wait for the database (in memory and the "
        "spool); over it, new model calls get 503 until recording catches up.",
    )
    commit_wait_s: float = Field(
        5.0,
        ge=0,
        le=600,
        description="How long an answer (a JSON body, a stream's last event) waits for its "
        "records to be committed, so its ids work at once on every gateway; past it, or "
        "while the database is unreachable, it is sent anyway (records stay in the spool) "
        "and a warning is logged. 0: never wait.",
    )
    recording_lag_alert_s: float = Field(
        60.0, gt=0, description="/health says degraded when recording lags more than this."
    )
    spool_replay_interval_s: float = Field(
        60.0,
        gt=0,
        description="How often spool segments left by dead gateway processes are replayed.",
    )

    # ---- data protection (gateway/recording/redaction.py, core/redaction_patterns.py,
    # trainer/retention.py, docs/data-protection.md)
    redact: bool = Field(
        False,
        description="Redact emails, phone numbers, API keys and long hex/base64 secrets (and "
        "redact_patterns) from every project's records before storage; a redacted record "
        "loses its token ids and is never trained on. Projects can also opt in one by one.",
    )
    redact_patterns: list[str] = Field(
        default_factory=list,
        description="Extra regular expressions to redact (a JSON list in the environment); "
        "validated at start-up: no nested quantifiers, backreferences or empty matches.",
    )
    retention_days: int | None = Field(
        None,
        ge=1,
        description="Delete the request/response payloads and token data of interactions "
        "older than this many days (daily trainer beat job; `rlgate retention`). Unset: keep.",
    )

    # ---- traces (gateway/call/tracing.py, docs/observability.md "Traces") -------------------
    otlp_endpoint: str = Field(
        "",
        description="An OTLP/HTTP (protobuf) collector, e.g. http://collector:4318: each "
        "model call is then a span under the OpenTelemetry GenAI conventions, with child "
        "spans for the engine call and the recording (traces go to <endpoint>/v1/traces; a "
        "URL already ending in /v1/traces is used as it is). Needs the `otel` extra "
        "(pip install 'rlgate[otel]'). The standard OTEL_EXPORTER_OTLP_TRACES_HEADERS / "
        "_TIMEOUT / _COMPRESSION / _CERTIFICATE, OTEL_SERVICE_NAME, "
        "OTEL_RESOURCE_ATTRIBUTES, OTEL_TRACES_SAMPLER and OTEL_BSP_* apply. Unset: off, "
        "and nothing of OpenTelemetry is loaded.",
    )
    otlp_capture_content: bool = Field(
        False,
        description="Put the prompt and answer text into the spans (gen_ai.input.messages, "
        "gen_ai.output.messages), redacted when redaction is on for the call's project "
        "(RLGATE_REDACT, a project's redaction setting). Off: spans carry no text.",
    )

    # ---- limits and exposure (gateway/edge/ratelimit.py, docs/gateway.md "Limits") ----------
    rate_limit_rps: float = Field(
        100.0, gt=0, description="Requests per second per key (token bucket refill)."
    )
    rate_limit_burst: float = Field(
        400.0, ge=1, description="Requests a key may send at once before the per-second rate."
    )
    feedback_rate_per_s: float = Field(
        50.0, gt=0, description="Feedback posts (/feedback, /rl/set_reward) per second per key."
    )
    feedback_burst: float = Field(200.0, ge=1, description="Feedback posts a key may send at once.")
    max_concurrent_per_key: int = Field(
        32,
        ge=1,
        description="Model calls (streams included) one key may have running; below the "
        "engine's in-flight bound, so one key never fills an engine alone.",
    )
    login_rate_per_min: float = Field(
        10.0, gt=0, description="Failed dashboard logins per minute per client IP (429 past it)."
    )
    ratelimit_url: str = Field(
        "",
        description="Redis URL for limits shared by every replica; empty: the broker URL "
        "if it is redis://, else in-process buckets (one gateway process).",
    )
    session_key_grace_s: float = Field(
        3600.0,
        ge=0,
        description="How long a session-bound key keeps working after its session ended "
        "(late feedback); model calls on an ended session are refused at once.",
    )
    unknown_id_wait_s: float = Field(
        0.5,
        ge=0,
        le=10,
        description="How long an id neither stored nor pending in this process is looked "
        "up again (another replica may still be recording it), asynchronously.",
    )
    waits_per_key: int = Field(
        8, ge=0, description="Such lookups one key may have waiting at once; more get 404 at once."
    )
    # ---- operator grants and the verify pool (core/grants.py, docs/security.md) --------
    commands: dict[str, CommandGrant] = Field(
        default_factory=dict,
        description="Programs the command verifier may run, by name ([commands.<name>] in "
        "the config file, or JSON in RLGATE_COMMANDS); a project picks one with 'use'.",
    )
    judges: dict[str, JudgeGrant] = Field(
        default_factory=dict,
        description="LLM judges (model, URL, key variable, per-project caps) by name "
        "([judges.<name>], or JSON in RLGATE_JUDGES); a project picks one with 'judge'.",
    )
    verify_workers: int = Field(
        2,
        ge=0,
        description="Processes of the verify pool `rlgate worker` starts beside its trainer "
        "(queue rlgate.verify); 0: none here, another worker serves that queue.",
    )
    verify_per_project: int = Field(
        1, ge=1, description="Verify tasks one project may have running at once."
    )
    verify_time_limit_s: float = Field(
        300.0,
        gt=0,
        le=3600,
        description="Hard time limit of one verify task (its judge calls and commands).",
    )
    eval_gate_budget_s: float = Field(
        0.0,
        ge=0,
        le=3600,
        description="Total time the eval gate's scoring may take in one publish (every "
        "eval prompt, both adapters; a command verifier is killed when it runs out). Over "
        "it, the candidate is rejected (audited) and the run ends trained-not-published. "
        "0: RLGATE_VERIFY_TIME_LIMIT_S.",
    )
    # ---- run tracking (trainer/tracking.py, docs/observability.md): the operator's own
    # settings; no project or admin setting names a tracker or where it writes
    trackers: str = Field(
        "",
        description="Experiment trackers the worker logs each training run to, "
        "comma-separated: wandb, mlflow, tensorboard (each needs its extra, e.g. "
        "pip install 'rlgate[mlflow]'). Empty or none: no tracking. A tracker that fails "
        "is noted on the run (config.tracking.warnings) and the run goes on.",
    )
    public_url: str = Field(
        "",
        description="The gateway's base URL as people reach it (e.g. https://rlgate.example.com); "
        "a tracked run links to its dashboard page, <public url>/admin/runs/<run id>. "
        "Default: http://<gateway host>:<gateway port>.",
    )
    mlflow_tracking_uri: str = Field(
        "",
        description="MLflow tracking server or store (http://host:5000, sqlite:///path). "
        "Default: MLflow's MLFLOW_TRACKING_URI, else sqlite:///<data dir>/mlflow.db.",
    )
    mlflow_experiment: str = Field(
        "rlgate", min_length=1, description="MLflow experiment of the tracked runs."
    )
    wandb_project: str = Field("rlgate", min_length=1, description="W&B project of the runs.")
    wandb_entity: str = Field("", description="W&B entity (team or user); empty: the default.")
    wandb_mode: str = Field(
        "",
        pattern="^(|online|offline)$",
        description="W&B mode: online or offline (runs kept in RLGATE_WANDB_DIR for "
        "`wandb sync`). Empty: W&B's own (WANDB_MODE, else online).",
    )
    wandb_dir: Path | None = Field(
        None, description="Where W&B keeps its run files. Default: <data dir>/wandb."
    )
    tensorboard_dir: Path | None = Field(
        None,
        description="TensorBoard event files, one directory per run "
        "(<dir>/<project>/<run id>). Default: <data dir>/tensorboard.",
    )
    metrics_public: bool = Field(False, description="Serve /metrics without an admin key.")
    docs_public: bool = Field(False, description="Serve /openapi.json without an admin key.")

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        config_file = os.environ.get("RLGATE_CONFIG")
        if config_file:
            path = Path(config_file)
            if not path.is_file():
                raise ConfigError(f"RLGATE_CONFIG points at {path}, which is not a file")
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=path))
        return tuple(sources)

    @field_validator("otlp_endpoint")
    @classmethod
    def _otlp_endpoint(cls, v: str) -> str:
        v = v.strip()
        if v and not v.startswith(("http://", "https://")):
            raise ValueError(f"RLGATE_OTLP_ENDPOINT must be an http(s) URL, not {v!r}")
        return v

    @field_validator("redact_patterns")
    @classmethod
    def _patterns(cls, v: list[str]) -> list[str]:
        compile_patterns(v)  # RedactionConfigError (a ValueError) names the bad pattern
        return v

    @model_validator(mode="after")
    def _router_workers(self) -> Settings:
        # a router without the operator's worker list would reach no worker at all: say so
        # at start, not as a 503 per request
        if self.engine_router_url and not self.engine_router_workers.strip():
            raise ValueError(
                "RLGATE_ENGINE_ROUTER_URL needs RLGATE_ENGINE_ROUTER_WORKERS: the router's "
                "workers rlgate may load adapters into and send the engine key (URLs or "
                "patterns such as http://10.0.0.*:30000; docs/scaling.md)"
            )
        for entry in self.engine_router_worker_list:
            check_pattern(entry)  # a ValueError that names the entry
        return self

    @model_validator(mode="after")
    def _grants(self) -> Settings:
        check_entries(self.commands, self.judges)
        return self

    @field_validator("trackers")
    @classmethod
    def _trackers(cls, v: str) -> str:
        names = [n.strip().lower() for n in v.split(",") if n.strip()]
        unknown = sorted(set(names) - {*TRACKERS, "none"})
        if unknown:
            raise ValueError(
                f"trackers: unknown {unknown}; allowed: none or any of {', '.join(TRACKERS)}"
            )
        if "none" in names and len(names) > 1:
            raise ValueError("trackers: 'none' cannot be combined with a tracker")
        return ",".join(n for n in dict.fromkeys(names) if n != "none")

    @field_validator("log_level")
    @classmethod
    def _level(cls, v: str) -> str:
        v = v.lower()
        if v not in {"debug", "info", "warning", "error", "critical"}:
            raise ValueError("log_level must be one of debug, info, warning, error, critical")
        return v

    # ---- derived values -------------------------------------------------------------

    @property
    def effective_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'rlgate.db').as_posix()}"

    @property
    def effective_adapter_dir(self) -> Path:
        return self.adapter_dir or self.data_dir / "adapters"

    @property
    def grants(self) -> Grants:
        return Grants(self.commands, self.judges)

    @property
    def eval_gate_budget(self) -> float:
        """The eval gate's scoring budget per publish, in seconds."""
        return self.eval_gate_budget_s or self.verify_time_limit_s

    @property
    def tracker_list(self) -> tuple[str, ...]:
        """The trackers each training run is logged to (trainer/tracking.py)."""
        return tuple(n for n in self.trackers.split(",") if n)

    @property
    def dashboard_url(self) -> str:
        """The gateway's base URL for links into the dashboard."""
        return self.public_url.rstrip("/") or f"http://{self.gateway_host}:{self.gateway_port}"

    @property
    def effective_mlflow_tracking_uri(self) -> str:
        if self.mlflow_tracking_uri:
            return self.mlflow_tracking_uri
        if os.environ.get("MLFLOW_TRACKING_URI"):
            return os.environ["MLFLOW_TRACKING_URI"]
        return f"sqlite:///{(self.data_dir / 'mlflow.db').resolve().as_posix()}"

    @property
    def effective_wandb_dir(self) -> Path:
        return self.wandb_dir or self.data_dir / "wandb"

    @property
    def effective_tensorboard_dir(self) -> Path:
        return self.tensorboard_dir or self.data_dir / "tensorboard"

    @property
    def engine_url_list(self) -> list[str]:
        return [u.strip().rstrip("/") for u in self.engine_urls.split(",") if u.strip()]

    @property
    def train_shared_gpu_engine_list(self) -> list[str]:
        urls = self.train_shared_gpu_engines.split(",")
        return [u.strip().rstrip("/") for u in urls if u.strip()]

    @property
    def engine_router_worker_list(self) -> list[str]:
        return [u.strip() for u in self.engine_router_workers.split(",") if u.strip()]

    @property
    def engine_api_key_value(self) -> str | None:
        return (self.engine_api_key.get_secret_value() or None) if self.engine_api_key else None

    @property
    def engine_headers(self) -> dict[str, str]:
        """What the gateway and the trainer send with every engine request."""
        key = self.engine_api_key_value
        return {"Authorization": f"Bearer {key}"} if key else {}

    @property
    def effective_broker_url(self) -> str:
        if self.broker_url:
            return self.broker_url
        return f"sqla+sqlite:///{(self.data_dir / 'broker.db').as_posix()}"

    @property
    def uses_packaged_model(self) -> bool:
        return self.model_path == PACKAGED_MODEL

    def masked(self) -> dict[str, Any]:
        """Effective settings as plain values, secrets and URL passwords masked."""
        out: dict[str, Any] = {}
        for name in type(self).model_fields:
            value = getattr(self, name)
            if name in ("commands", "judges"):
                value = ", ".join(sorted(value))  # names only: an entry's env may be secret
            elif isinstance(value, SecretStr):
                value = "********" if value.get_secret_value() else ""
            elif value is None:
                value = ""
            out[name] = str(value)
        out["database_url"] = mask_url(self.effective_database_url)
        out["broker_url"] = mask_url(self.effective_broker_url)
        out["mlflow_tracking_uri"] = mask_url(self.mlflow_tracking_uri)
        return out


def mask_url(url: str) -> str:
    """Hide the password in ``scheme://user:password@host/...``."""
    if "://" not in url or "@" not in url:
        return url
    scheme, rest = url.split("://", 1)
    creds, host = rest.rsplit("@", 1)
    if ":" in creds:
        user = creds.split(":", 1)[0]
        return f"{scheme}://{user}:***@{host}"
    return url


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
