"""Build spool entries (what Pipeline.record hands the recorder) for recorder tests."""

from __future__ import annotations

import secrets
from typing import Any

from schemas.atdp import Interaction
from schemas.atdp import Session as AtdpSession
from schemas.coltypes import utcnow


def entry(
    project: str = "p1",
    *,
    session_id: str | None = None,
    new_session: bool = True,
    external_id: str | None = None,
    content: str = "hello",
) -> dict[str, Any]:
    """One interaction record plus (``new_session``) the session it opens, as JSON."""
    now = utcnow()
    sid = session_id or "sess_" + secrets.token_hex(8)
    session = None
    if new_session:
        session = AtdpSession(
            id=sid,
            project_id=project,
            client_protocol="openai-chat",
            external_id=external_id,
            status="open",
            created_at=now,
            last_activity_at=now,
        ).model_dump(mode="json")
    rec = Interaction(
        id="chatcmpl-" + secrets.token_hex(8),
        project_id=project,
        session_id=sid,
        seq=0,
        request={"model": "m", "messages": [{"role": "user", "content": content}]},
        prompt_token_ids=[1, 2, 3],
        completion_token_ids=[4],
        completion_logprobs=[-0.5],
        temperature=1.0,
        top_p=1.0,
        policy_version="base",
        finish_reason="stop",
        output={"text": "hi"},
        usage={"prompt_tokens": 3, "completion_tokens": 1},
        created_at=now,
    )
    return {"interaction": rec.model_dump(mode="json"), "session": session}


def iid(e: dict[str, Any]) -> str:
    return e["interaction"]["id"]
