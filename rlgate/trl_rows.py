"""Interaction records as the rows TRL's trainers and `datasets.load_dataset("json")` read.

- `sft`: ``{"messages": [...], "tools": [...]}`` — the recorded request's messages plus the
  answer as an assistant message (its tool calls in the OpenAI ``tool_calls`` shape, the
  arguments parsed to objects as chat templates expect); SFTTrainer's conversational format.
- `preference`: ``{"prompt": [...], "chosen": [...], "rejected": [...]}`` — answers to the
  same prompt with different rewards: siblings (one group: several choices of one call),
  and ungrouped answers from any sessions whose prompt (messages and tools) is the same;
  every pair of a higher and a lower reward is one row; DPOTrainer's conversational format.
- `kto`: ``{"prompt": [...], "completion": [...], "label": bool}`` — each rated interaction;
  the label is ``reward > 0`` (a thumbs up is +1, a thumbs down -1); KTOTrainer's format.

Records whose payload was purged (retention) or that carry no messages give no row.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from typing import Any

SHAPES = ("sft", "preference", "kto")


def _prompt(rec: dict[str, Any]) -> list[dict[str, Any]] | None:
    msgs = (rec.get("request") or {}).get("messages")
    return list(msgs) if msgs else None


def _answer(rec: dict[str, Any]) -> dict[str, Any]:
    out = rec.get("output") or {}
    msg: dict[str, Any] = {"role": "assistant", "content": out.get("text") or ""}
    calls = []
    for c in out.get("tool_calls") or []:
        try:
            args: Any = json.loads(c["arguments"])
        except (ValueError, TypeError):
            args = c["arguments"]
        calls.append(
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": args}}
        )
    if calls:
        msg["tool_calls"] = calls
    return msg


def sft_rows(records: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for rec in records:
        prompt = _prompt(rec)
        if prompt is None:
            continue
        row: dict[str, Any] = {"messages": [*prompt, _answer(rec)]}
        tools = (rec.get("request") or {}).get("tools")
        if tools:
            row["tools"] = tools
        yield row


def kto_rows(records: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for rec in records:
        prompt = _prompt(rec)
        if prompt is None or rec.get("reward") is None:
            continue
        yield {"prompt": prompt, "completion": [_answer(rec)], "label": rec["reward"] > 0}


def _same_prompt(rec: dict[str, Any]) -> str:
    """Which answers compete: a group's siblings, else every ungrouped answer to the same
    messages and tools (a digest of them, so the key stays small)."""
    if rec.get("group_id"):
        return "group:" + rec["group_id"]
    req = rec.get("request") or {}
    text = json.dumps([req.get("messages"), req.get("tools")], sort_keys=True, default=str)
    return "prompt:" + hashlib.sha256(text.encode()).hexdigest()


def preference_rows(records: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    groups: dict[str, list[dict[str, Any]]] = {}
    for rec in records:
        if rec.get("reward") is not None and _prompt(rec):
            groups.setdefault(_same_prompt(rec), []).append(rec)
    for sibs in groups.values():
        sibs.sort(key=lambda r: -r["reward"])
        for i, hi in enumerate(sibs):
            for lo in sibs[i + 1 :]:
                if hi["reward"] > lo["reward"]:
                    yield {
                        "prompt": _prompt(hi),
                        "chosen": [_answer(hi)],
                        "rejected": [_answer(lo)],
                    }


def rows(shape: str, records: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    return {"sft": sft_rows, "kto": kto_rows, "preference": preference_rows}[shape](records)
