"""A rating's words as a hint: what the teacher is told about an answer, and where.

A thumb says "better" or "worse"; a comment says *what* ("Too long. Answer in one short
sentence."). The trainer turns such words into per-token advantages (trainer/loss.py
``hint_advantages``): the answer's sampled tokens are scored by a teacher that sees the
words appended to the last user message, and each token's advantage is how much likelier
the teacher finds it than the policy did without them. Tokens the hint makes likelier
are pushed up, tokens it makes unlikelier pushed down, even on an answer whose thumb alone
says nothing about which of its tokens were wrong.

Where a hint comes from (the newest wins):
- ``comment``: the comment of a user's rating of the interaction (or of its session, for
  the session's last turn);
- ``next_message``: the user's next message in the session, when the ``next_turn`` signal
  read it as a correction or a complaint (a rating with a negative reward): "No, that's
  too long. Just answer in one short sentence."

A hint is refused, with its reason counted in the run's data stats, when it is empty or
whitespace only (``hint_empty``), longer than ``MAX_HINT_CHARS`` characters or
``MAX_HINT_TOKENS`` tokens (``hint_too_long``), or when the prompt does not end with the
chat template's generation suffix, so the hint cannot be placed in the last user message
(``hint_unplaceable``). The hint the teacher saw is recorded with the run
(``run_hints``) and shown beside the credit on the dashboard's session page.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from schemas.tables import FeedbackRow, InteractionRow
from trainer.data import Sample
from trainer.judge_text import next_user_message

MAX_HINT_CHARS = 1000
MAX_HINT_TOKENS = 160
SEPARATOR = "\n\n"  # between the user's message and the hint
_MARK = "\x00rlgate-hint-mark\x00"
NEGATIVE_NEXT_TURN = 0.0  # a next_turn rating below this read the next message as a correction


@dataclass(frozen=True)
class Hint:
    interaction_id: str
    text: str
    origin: str  # comment | next_message
    feedback_id: str


def clean(text: str | None) -> tuple[str | None, str | None]:
    """(the hint, None) or (None, the reason it is refused)."""
    stripped = (text or "").strip()
    if not stripped:
        return None, "hint_empty"
    if len(stripped) > MAX_HINT_CHARS:
        return None, "hint_too_long"
    return stripped, None


def find_hints(db: Session, rows: list[InteractionRow]) -> tuple[dict[str, Hint], Counter[str]]:
    """The hint of each of ``rows`` that has one (by interaction id), and the reasons of
    the hints refused."""
    skipped: Counter[str] = Counter()
    if not rows:
        return {}, skipped
    by_id = {r.id: r for r in rows}
    sessions = {r.session_id for r in rows if r.session_id}
    last_turn = _last_turns(db, sessions)
    candidates: dict[str, tuple[Any, Hint | None, str | None]] = {}

    def offer(interaction_id: str, fb: FeedbackRow, text: str | None, origin: str) -> None:
        order = (fb.created_at, fb.id)
        cur = candidates.get(interaction_id)
        if cur is not None and cur[0] >= order:
            return
        hint_text, reason = clean(text)
        hint = Hint(interaction_id, hint_text, origin, fb.id) if hint_text else None
        candidates[interaction_id] = (order, hint, reason)

    feedback = db.scalars(
        select(FeedbackRow).where(
            (FeedbackRow.target_id.in_(list(by_id))) | (FeedbackRow.target_id.in_(list(sessions)))
        )
    ).all()
    for fb in feedback:
        if fb.target_type == "interaction":
            target = fb.target_id
        elif fb.target_type == "session":
            target = last_turn.get(fb.target_id)
        else:
            continue
        if target not in by_id:
            continue
        if fb.source == "user" and fb.comment is not None:
            offer(target, fb, fb.comment, "comment")
        elif _reads_next_turn(fb) and fb.reward < NEGATIVE_NEXT_TURN:
            offer(target, fb, _next_message(db, by_id[target]), "next_message")
    out: dict[str, Hint] = {}
    for interaction_id, (_, hint, reason) in candidates.items():
        if hint is not None:
            out[interaction_id] = hint
        elif reason is not None:
            skipped[reason] += 1
    return out, skipped


def _reads_next_turn(fb: FeedbackRow) -> bool:
    return fb.source == "next_turn" or (fb.rater or "").endswith("next_turn")


def _last_turns(db: Session, sessions: set[str]) -> dict[str, str]:
    """session id -> the id of its last turn (highest seq)."""
    if not sessions:
        return {}
    out: dict[str, tuple[int, str]] = {}
    for sid, seq, iid in db.execute(
        select(InteractionRow.session_id, InteractionRow.seq, InteractionRow.id).where(
            InteractionRow.session_id.in_(list(sessions))
        )
    ):
        if sid not in out or seq > out[sid][0]:
            out[sid] = (seq, iid)
    return {sid: iid for sid, (_, iid) in out.items()}


def _next_message(db: Session, row: InteractionRow) -> str | None:
    """The user's message that followed ``row``'s answer: the user text at the end of the
    session's next turn, after its last assistant message."""
    if row.session_id is None:
        return None
    nxt = db.scalars(
        select(InteractionRow)
        .where(InteractionRow.session_id == row.session_id, InteractionRow.seq > row.seq)
        .order_by(InteractionRow.seq)
        .limit(1)
    ).first()
    return next_user_message(nxt) if nxt is not None else None  # type: ignore[arg-type]


class Placer:
    """Puts a hint at the end of a rendered prompt's last user message, in token ids.

    The chat template's generation suffix (what follows a user message's text when the
    assistant is to answer, e.g. ChatML's ``<|im_end|>\\n<|im_start|>assistant\\n``) is
    found once by rendering a marker message; a prompt that ends with it gets the hint's
    ids inserted just before it."""

    def __init__(self, tokenizer: Any) -> None:
        self.tok = tokenizer
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": _MARK}], tokenize=False, add_generation_prompt=True
        )
        self.suffix: list[int] = tokenizer.encode(text.split(_MARK, 1)[1], add_special_tokens=False)

    def place(self, prompt_ids: list[int], hint: str) -> tuple[list[int] | None, str | None]:
        """(the hinted prompt, None) or (None, the reason it cannot be placed)."""
        ids = self.tok.encode(SEPARATOR + hint, add_special_tokens=False)
        if len(ids) > MAX_HINT_TOKENS:
            return None, "hint_too_long"
        n = len(self.suffix)
        if not n or len(prompt_ids) <= n or prompt_ids[-n:] != self.suffix:
            return None, "hint_unplaceable"
        return prompt_ids[:-n] + ids + self.suffix, None


def attach(db: Session, samples: list[Sample], placer: Placer) -> tuple[list[Hint], Counter[str]]:
    """Find the hints of ``samples`` and set each one's ``hinted_prompt``; returns the
    hints placed and the reasons of those refused."""
    ids = [s.interaction_id for s in samples]
    rows = list(db.scalars(select(InteractionRow).where(InteractionRow.id.in_(ids))))
    hints, skipped = find_hints(db, rows)
    used: list[Hint] = []
    for s in samples:
        hint = hints.get(s.interaction_id)
        if hint is None:
            continue
        s.hinted_prompt, reason = placer.place(s.prompt_ids, hint.text)
        if reason is not None:
            skipped[reason] += 1
        else:
            used.append(hint)
    return used, skipped
