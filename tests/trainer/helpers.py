"""Recording interactions for trainer tests the way the gateway does: real engine
/generate calls with return_logprob, stored as InteractionRows (rewards set directly,
as credit assignment would)."""

from __future__ import annotations

import secrets
from functools import lru_cache
from typing import Any

import httpx
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from core.db import transaction
from schemas.coltypes import utcnow
from schemas.tables import InteractionRow, ProjectRow, SessionRow
from tests.servers import MODEL_CACHE, packaged_model_dir

MODEL_DIR = MODEL_CACHE / "models" / "smollm2-135m-instruct"
QUESTIONS = ["What is 2+2?", "Name a color.", "Say hi.", "Pick a fruit.", "Count to three."]


@lru_cache(maxsize=1)
def _tokenizer():  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(packaged_model_dir()))


def render(question: str) -> list[int]:
    tok = _tokenizer()
    return list(
        tok.apply_chat_template(
            [{"role": "user", "content": question}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
    )


def make_project(factory: sessionmaker[Session], training: dict[str, Any]) -> str:
    pid = f"p{secrets.token_hex(4)}"
    with transaction(factory) as db:
        db.add(ProjectRow(id=pid, name=pid, settings={"training": training}))
    return pid


def rewards(factory: sessionmaker[Session], ids: list[str]) -> dict[str, float | None]:
    """The reward stored on each of these interactions (set by their feedback)."""
    with factory() as db:
        rows = db.execute(
            select(InteractionRow.id, InteractionRow.reward).where(InteractionRow.id.in_(ids))
        ).all()
    return {iid: reward for iid, reward in rows}


def set_training(factory: sessionmaker[Session], pid: str, **values: Any) -> None:
    with transaction(factory) as db:
        p = db.get(ProjectRow, pid)
        assert p is not None
        s = dict(p.settings)
        s["training"] = {**s.get("training", {}), **values}
        p.settings = s


def record(
    factory: sessionmaker[Session],
    engine_url: str,
    pid: str,
    question: str,
    rewards: list[float | None],
    *,
    adapter: str | None = None,
    temperature: float = 1.0,
    finish_override: str | None = None,
) -> list[str]:
    """One /generate with n = len(rewards); one InteractionRow per choice (one group)."""
    ids = render(question)
    n = len(rewards)
    r = httpx.post(
        f"{engine_url}/generate",
        json={
            "input_ids": ids,
            "lora_path": adapter,
            "return_logprob": True,
            "sampling_params": {
                "temperature": temperature,
                "max_new_tokens": 8,
                "n": n,
                "seed": secrets.randbelow(10**6),
            },
        },
        timeout=120,
    )
    r.raise_for_status()
    outs = r.json() if isinstance(r.json(), list) else [r.json()]
    sid = f"s_{secrets.token_hex(6)}"
    group = f"g_{secrets.token_hex(6)}" if n > 1 else None
    out_ids = []
    with transaction(factory) as db:
        db.add(SessionRow(id=sid, project_id=pid, task_id="task-a"))
        db.flush()
        for i, (o, reward) in enumerate(zip(outs, rewards, strict=True)):
            iid = f"chatcmpl-{secrets.token_hex(8)}"
            db.add(
                InteractionRow(
                    id=iid,
                    project_id=pid,
                    session_id=sid,
                    seq=i,
                    group_id=group,
                    choice_index=i,
                    request={"messages": [{"role": "user", "content": question}]},
                    prompt_token_ids=ids,
                    completion_token_ids=o["output_ids"],
                    completion_logprobs=[x[0] for x in o["meta_info"]["output_token_logprobs"]],
                    temperature=temperature,
                    top_p=1.0,
                    policy_version=adapter or "base",
                    finish_reason=finish_override or o["meta_info"]["finish_reason"]["type"],
                    output={"text": o["text"]},
                    usage={},
                    created_at=utcnow(),
                    reward=reward,
                )
            )
            out_ids.append(iid)
    return out_ids


def greedy(engine_url: str, question: str, adapter: str | None) -> dict[str, Any]:
    r = httpx.post(
        f"{engine_url}/generate",
        json={
            "input_ids": render(question),
            "lora_path": adapter,
            "return_logprob": True,
            "sampling_params": {"temperature": 0, "max_new_tokens": 8},
        },
        timeout=120,
    )
    assert r.status_code == 200, r.text
    return r.json()
