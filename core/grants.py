"""What only the operator grants: programs to run, addresses to call, credentials to spend.

A project admin configures verifiers through the admin API, whose settings live in the
database. Nothing stored there may name a program, a URL or a key variable, or raise a
cap on another project's expense. Those come from the operator's configuration (the TOML
file of ``RLGATE_CONFIG``, or ``RLGATE_COMMANDS`` / ``RLGATE_JUDGES`` as JSON), as named
entries; a project's verifier spec picks one by name and sets only inert parameters::

    [commands.unit_tests]            # {"name": "command", "use": "unit_tests"}
    command = ["python", "-m", "pytest", "-q", "tests"]
    cwd = "/srv/task"
    timeout_s = 120
    env = {PYTHONHASHSEED = "0"}
    projects = ["swe"]               # who may use it; omitted: every project

    [judges.mini]                    # {"name": "judge", "judge": "mini", "rubric": "..."}
    model = "openai/gpt-4o-mini"
    api_key_env = "OPENAI_API_KEY"   # the variable the worker reads the key from
    calls_per_hour = 120             # per project
    seconds_per_hour = 600           # judge wall time per project

Pure data: both the gateway (to refuse a spec naming no entry) and the worker (to run
one) read the same entries from their settings.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator

ENTRY_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")
# what a command gets from the worker's environment when its entry names nothing else:
# enough to find programs and a home, never the worker's secrets
DEFAULT_INHERIT_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "VIRTUAL_ENV")

Seconds = Annotated[float, Field(gt=0)]


class GrantError(ValueError):
    """A verifier spec that names no operator entry it may use; says what to change."""


class _Entry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    projects: list[str] | None = Field(
        None, description="Projects that may use this entry; omitted: every project."
    )

    def allows(self, project_id: str) -> bool:
        return self.projects is None or project_id in self.projects


class CommandGrant(_Entry):
    """A program the ``command`` verifier may run: exit status 0 rates +1, else -1."""

    command: str | list[str] = Field(
        description="Text (run by the shell) or an argument list (run directly)."
    )
    cwd: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    inherit_env: list[str] = Field(
        default_factory=lambda: list(DEFAULT_INHERIT_ENV),
        description="Worker environment variables the command sees; no others (so a "
        "command that runs model-written code sees none of the worker's secrets).",
    )
    timeout_s: float = Field(60.0, gt=0, le=3600)

    @field_validator("command")
    @classmethod
    def _command(cls, v: str | list[str]) -> str | list[str]:
        if not v or (isinstance(v, list) and not all(v)):
            raise ValueError("command must be non-empty text or a list of non-empty strings")
        return v


class JudgeGrant(_Entry):
    """An LLM judge: where it calls, with which key, and what one project may spend."""

    model: str = Field(description="litellm model string, e.g. openai/gpt-4o-mini.")
    api_base: str | None = Field(
        None, description="The provider URL; omitted: litellm's for the model's provider."
    )
    api_key_env: str | None = Field(
        None,
        description="Environment variable holding the key. Omitted with api_base: no key. "
        "Omitted without api_base: litellm reads the provider's usual variable.",
    )
    timeout_s: float = Field(60.0, gt=0, le=600, description="One call's time limit.")
    retries: int = Field(1, ge=0, le=5)
    calls_per_hour: int = Field(120, ge=1, description="Calls per project per hour.")
    seconds_per_hour: float = Field(
        600.0, gt=0, description="Judge wall time per project per hour, timeouts included."
    )
    usd_per_hour: float | None = Field(
        None,
        ge=0,
        description="Known cost per project per hour (litellm's price list; a custom "
        "api_base usually has no price, so calls_per_hour and seconds_per_hour bind).",
    )

    @field_validator("api_base")
    @classmethod
    def _base(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(("http://", "https://")):
            raise ValueError("api_base must be an http(s) URL")
        return v


def _check_names(entries: Mapping[str, _Entry], kind: str) -> None:
    for name in entries:
        if not ENTRY_NAME.match(name):
            raise ValueError(f"[{kind}.{name}]: an entry name is letters, digits and _.- (<=64)")


def check_entries(commands: Mapping[str, CommandGrant], judges: Mapping[str, JudgeGrant]) -> None:
    _check_names(dict(commands), "commands")
    _check_names(dict(judges), "judges")


@dataclass(frozen=True)
class Grants:
    """The operator's entries, as a worker or gateway read them from its settings."""

    commands: Mapping[str, CommandGrant] = field(default_factory=dict)
    judges: Mapping[str, JudgeGrant] = field(default_factory=dict)

    def command(self, name: object, project_id: str | None, where: str) -> CommandGrant:
        entry = _pick(self.commands, name, project_id, kind="commands", field="use", where=where)
        assert isinstance(entry, CommandGrant)
        return entry

    def judge(self, name: object, project_id: str | None, where: str) -> JudgeGrant:
        entry = _pick(self.judges, name, project_id, kind="judges", field="judge", where=where)
        assert isinstance(entry, JudgeGrant)
        return entry


def _pick(
    entries: Mapping[str, _Entry],
    name: object,
    project_id: str | None,
    *,
    kind: str,
    field: str,
    where: str,
) -> _Entry:
    """The operator's entry ``name`` for ``project_id`` (None: not checked for a project);
    :class:`GrantError` otherwise."""
    offered = sorted(n for n, e in entries.items() if project_id is None or e.allows(project_id))
    if not isinstance(name, str) or name not in entries:
        raise GrantError(
            f"{where}.{field} must name one of the operator's [{kind}] entries "
            f"(granted to this project: {offered}), not {name!r}: programs, URLs and keys "
            f"are granted in the operator's configuration only (docs/security.md)"
        )
    entry = entries[name]
    if project_id is not None and not entry.allows(project_id):
        raise GrantError(
            f"{where}.{field}: the operator's [{kind}.{name}] is not granted to project "
            f"{project_id!r} (granted to it: {offered})"
        )
    return entry
