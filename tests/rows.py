"""ATDP records for tests that write sessions and answers straight into the database
(`to_row(...)` of these is what the gateway's recorder stores).

Every field can be overridden by keyword; the defaults are a one-token answer to a
one-token prompt in project "p1", dated from T0.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from schemas.atdp import Interaction, PolicyStatus, PolicyVersion, Session
from schemas.coltypes import utcnow

T0 = utcnow()


def session(id: str, project_id: str = "p1", *, at: datetime = T0, **fields: Any) -> Session:
    """A session created and last active at `at`."""
    return Session.model_validate(
        {"id": id, "project_id": project_id, "created_at": at, "last_activity_at": at, **fields}
    )


def interaction(
    id: str,
    session_id: str,
    seq: int,
    text: str = "a",
    *,
    project_id: str = "p1",
    question: str = "q",
    start: datetime = T0,
    **fields: Any,
) -> Interaction:
    """Turn `seq` of a session: the user asks `question`, the model answers `text`
    (prompt [1], completion [2]), created `seq` seconds after `start`."""
    return Interaction.model_validate(
        {
            "id": id,
            "project_id": project_id,
            "session_id": session_id,
            "seq": seq,
            "request": {"messages": [{"role": "user", "content": question}]},
            "prompt_token_ids": [1],
            "completion_token_ids": [2],
            "completion_logprobs": [-0.1],
            "temperature": 1.0,
            "top_p": 1.0,
            "policy_version": "base",
            "finish_reason": "stop",
            "output": {"text": text},
            "usage": {"prompt_tokens": 1, "completion_tokens": 1},
            "created_at": start + timedelta(seconds=seq),
            **fields,
        }
    )


def policy_version(
    project_id: str, version: int, status: PolicyStatus = PolicyStatus.candidate, **fields: Any
) -> PolicyVersion:
    """Version ``version`` of a project's adapter, ``<project>-policy-v<version>``, stored
    under /adapters/ (no files there)."""
    name = f"{project_id}-policy-v{version}"
    lora = {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj"]}
    return PolicyVersion.model_validate(
        {
            "id": f"pv_{project_id}_{version}",
            "project_id": project_id,
            "name": name,
            "version": version,
            "base_model": "packaged",
            "path": f"/adapters/{name}",
            "lora_config": lora,
            "status": status,
            "created_at": T0,
            **fields,
        }
    )
