"""What the LLM judge reads and what it must answer (trainer/judge.py makes the calls).

- Transcripts: a recorded interaction's request (OpenAI Chat ``messages``, Anthropic
  Messages ``system`` + ``messages``, OpenAI Responses ``instructions`` + ``input``, as
  the client sent them) and its answer, as plain ``ROLE: text`` lines, cut to a bounded
  length (the start, where the task is, and the end, where the answer is).
- The user's next message: what a user wrote after an answer (not a tool result), for
  the ``next_turn`` mode.
- Prompts for the three modes, and parsers that turn the judge's text into a result or
  None (unparsable: the caller retries, then skips and counts).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from schemas.atdp import Interaction

MAX_MESSAGE_CHARS = 4000
MAX_TRANSCRIPT_CHARS = 12_000
MAX_RATIONALE_CHARS = 4000

DEFAULT_RUBRIC = (
    "Did the assistant do what the user asked, correctly and completely? Prefer answers "
    "that reach the goal, use tools sensibly, and are honest about what they could not do."
)

# next_turn labels and the reward each gives the previous turn (None: no rating)
NEXT_TURN_REWARDS: dict[str, float | None] = {
    "satisfied": 1.0,
    "correction": -0.5,
    "complaint": -1.0,
    "new_topic": None,
}


# ---- transcripts ---------------------------------------------------------------------------


def clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    head = limit // 3
    tail = limit - head
    return f"{text[:head]}\n[... {len(text) - limit} characters left out ...]\n{text[-tail:]}"


def _part_text(part: Any) -> str:
    """The text of one content part / block (OpenAI, Anthropic, Responses shapes)."""
    if isinstance(part, str):
        return part
    if not isinstance(part, dict):
        return ""
    kind = part.get("type")
    if kind in ("text", "input_text", "output_text") or "text" in part:
        return str(part.get("text") or "")
    if kind == "tool_use":
        args = json.dumps(part.get("input"), ensure_ascii=False)
        return f"[calls tool {part.get('name')}({args})]"
    if kind == "tool_result":
        return f"[tool result: {content_text(part.get('content'))}]"
    if kind == "refusal":
        return str(part.get("refusal") or "")
    return ""


def content_text(content: Any) -> str:
    """A message's content (text, or a list of parts/blocks) as text."""
    if content is None:
        return ""
    if isinstance(content, list):
        return "\n".join(t for t in (_part_text(p) for p in content) if t)
    return _part_text(content)


def _is_tool_result(msg: dict[str, Any]) -> bool:
    """An Anthropic user message that only carries tool results (not the user talking)."""
    content = msg.get("content")
    return (
        isinstance(content, list)
        and bool(content)
        and all(isinstance(p, dict) and p.get("type") == "tool_result" for p in content)
    )


def request_messages(request: dict[str, Any]) -> list[tuple[str, str]]:
    """(role, text) of the request's conversation, in order, for any of the three APIs."""
    out: list[tuple[str, str]] = []
    for key in ("system", "instructions"):
        if request.get(key):
            out.append(("system", content_text(request[key])))
    items = request.get("messages")
    if items is None:
        raw = request.get("input")
        items = [{"role": "user", "content": raw}] if isinstance(raw, str) else raw
    for msg in items if isinstance(items, list) else []:
        if not isinstance(msg, dict):
            continue
        kind = msg.get("type")
        if kind == "function_call":
            out.append(("assistant", f"[calls tool {msg.get('name')}({msg.get('arguments')})]"))
            continue
        if kind == "function_call_output":
            out.append(("tool", str(msg.get("output") or "")))
            continue
        if kind not in (None, "message"):  # reasoning items and the like
            continue
        role = str(msg.get("role") or "user")
        if role == "user" and _is_tool_result(msg):
            role = "tool"
        text = content_text(msg.get("content"))
        calls = msg.get("tool_calls")
        for call in calls if isinstance(calls, list) else []:
            fn = call.get("function") if isinstance(call, dict) else None
            if isinstance(fn, dict):
                text += f"\n[calls tool {fn.get('name')}({fn.get('arguments')})]"
        out.append((role, text.strip()))
    return out


def answer_text(answer: Interaction) -> str:
    text = answer.output.text or ""
    for call in answer.output.tool_calls:
        text += f"\n[calls tool {call.name}({call.arguments})]"
    return text.strip() or "[empty answer]"


def context(request: dict[str, Any], limit: int = MAX_TRANSCRIPT_CHARS) -> str:
    """The conversation a request carries, as ``ROLE: text`` lines."""
    lines = [
        f"{role.upper()}: {clip(text, MAX_MESSAGE_CHARS)}"
        for role, text in request_messages(request)
    ]
    return clip("\n".join(lines), limit)


def transcript(answer: Interaction, limit: int = MAX_TRANSCRIPT_CHARS) -> str:
    """The conversation that led to ``answer`` (its request) and the answer itself."""
    rated = f"ASSISTANT (rated answer): {clip(answer_text(answer), MAX_MESSAGE_CHARS)}"
    return clip(f"{context(answer.request, limit)}\n{rated}", limit)


def next_user_message(nxt: Interaction) -> str | None:
    """What the user wrote after the previous answer: the user messages at the end of
    ``nxt``'s request, after its last assistant message; None when the request goes on
    with a tool result (or has no earlier answer)."""
    msgs = request_messages(nxt.request)
    last_assistant = max((i for i, (role, _) in enumerate(msgs) if role == "assistant"), default=-1)
    if last_assistant < 0:
        return None
    after = msgs[last_assistant + 1 :]
    if not after or any(role == "tool" for role, _ in after):
        return None
    texts = [text for role, text in after if role == "user" and text]
    return "\n".join(texts) or None


# ---- prompts ---------------------------------------------------------------------------------

_SYSTEM = (
    "You are a strict, fair judge of an AI assistant's work. Answer with one JSON object "
    "and nothing else."
)


def session_prompt(rubric: str | None, conversation: str) -> list[dict[str, str]]:
    user = (
        f"Rubric:\n{rubric or DEFAULT_RUBRIC}\n\n"
        f"Conversation:\n{conversation}\n\n"
        "Score the assistant's rated answer against the rubric from 0 (fails it) to 1 "
        '(fully meets it). Reply with JSON: {"score": <number 0..1>, "rationale": "<one or '
        'two sentences>"}'
    )
    return [{"role": "system", "content": _SYSTEM}, {"role": "user", "content": user}]


def group_prompt(
    rubric: str | None, conversations: list[str], shared: str | None = None
) -> list[dict[str, str]]:
    """``conversations``: whole trajectories, or (with ``shared``, the conversation they
    all answer) only the answers."""
    parts = [f'<trajectory id="{i + 1}">\n{c}\n</trajectory>' for i, c in enumerate(conversations)]
    common = f"The conversation they all answer:\n{shared}\n\n" if shared else ""
    user = (
        f"Rubric:\n{rubric or DEFAULT_RUBRIC}\n\n{common}"
        f"{len(conversations)} attempts at the same task follow. Compare them with each "
        "other and score each from 0 to 1 against the rubric: better attempts get higher "
        "scores, equally good ones equal scores.\n\n" + "\n\n".join(parts) + "\n\n"
        'Reply with JSON: {"scores": [{"id": <trajectory id>, "score": <number 0..1>, '
        '"rationale": "<one sentence>"}, ...]} with one entry per trajectory.'
    )
    return [{"role": "system", "content": _SYSTEM}, {"role": "user", "content": user}]


def next_turn_prompt(previous: str, reply: str) -> list[dict[str, str]]:
    user = (
        f"An assistant answered:\n{previous}\n\nThe user then wrote:\n{clip(reply, 2000)}\n\n"
        "Classify the user's message: 'satisfied' (accepts or thanks, goes on building on "
        "the answer), 'correction' (says the answer was wrong or incomplete and corrects "
        "it), 'complaint' (expresses frustration or rejects the answer), 'new_topic' (asks "
        'about something unrelated). Reply with JSON: {"label": "<one of the four>", '
        '"rationale": "<one sentence>"}'
    )
    return [{"role": "system", "content": _SYSTEM}, {"role": "user", "content": user}]


# ---- answers ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    score: float  # session/group: in [0, 1]; next_turn: the reward in [-1, 1]
    rationale: str
    label: str | None = None  # next_turn


def _json_object(text: str | None) -> dict[str, Any] | None:
    """The first JSON object in the text (code fences and prose around it allowed)."""
    if not text:
        return None
    decoder = json.JSONDecoder()
    start = text.find("{")
    while start >= 0:
        try:
            value, _ = decoder.raw_decode(text, start)
        except ValueError:
            start = text.find("{", start + 1)
            continue
        return value if isinstance(value, dict) else None
    return None


def _score(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if 0.0 <= value <= 1.0 else None


def _rationale(value: Any) -> str:
    return str(value or "").strip()[:MAX_RATIONALE_CHARS]


def parse_session(text: str | None) -> Verdict | None:
    obj = _json_object(text)
    if obj is None or (score := _score(obj.get("score"))) is None:
        return None
    return Verdict(score, _rationale(obj.get("rationale")))


def parse_group(text: str | None, size: int) -> list[Verdict] | None:
    """One verdict per trajectory, in order; None unless every id 1..size has exactly
    one score in [0, 1]."""
    obj = _json_object(text)
    items = obj.get("scores") if obj is not None else None
    if not isinstance(items, list):
        return None
    found: dict[int, Verdict] = {}
    for item in items:
        if not isinstance(item, dict):
            return None
        ident, score = item.get("id"), _score(item.get("score"))
        if isinstance(ident, str) and ident.strip().isdigit():
            ident = int(ident)
        if not isinstance(ident, int) or isinstance(ident, bool) or score is None:
            return None
        if ident in found or not 1 <= ident <= size:
            return None
        found[ident] = Verdict(score, _rationale(item.get("rationale")))
    if len(found) != size:
        return None
    return [found[i] for i in range(1, size + 1)]


def parse_next_turn(text: str | None) -> Verdict | None:
    """The label's reward; None when unparsable. ``new_topic`` parses (score 0, label
    set) but gives no rating (NEXT_TURN_REWARDS)."""
    obj = _json_object(text)
    label = obj.get("label") if obj is not None else None
    if not isinstance(label, str):
        return None
    label = label.strip().lower().replace(" ", "_").replace("-", "_")
    if label not in NEXT_TURN_REWARDS:
        return None
    reward = NEXT_TURN_REWARDS[label]
    return Verdict(0.0 if reward is None else reward, _rationale(obj.get("rationale")), label)
