"""The rule-based next-turn signal (``next_turn_rules``): what the user wrote after an
answer, read by a small lexicon instead of a judge model. English only.

:func:`classify` labels the user's next message:

- ``complaint`` (reward -1): frustration or rejection ("useless", "too long", "you
  didn't", "stop", "doesn't work", "not helpful");
- ``correction`` (-0.5): the answer was wrong or not what was asked, and the user says
  so ("no, ...", "that's wrong", "actually, ...", "I meant", "not what I asked",
  "... instead");
- ``repeat`` (-0.5): the user asks essentially the same question again: the word sets of
  the message and of the user message the answer replied to overlap (Jaccard) at least
  ``repeat_similarity`` (default 0.6), both with at least 3 words;
- ``thanks`` (+1): "thanks", "thank you", "great", "perfect", "that works", "exactly";
- nothing: no cue, no rating (a new question, a follow-up on the answer).

A negative cue wins over thanks ("thanks, but you didn't ..." is a complaint), a
complaint over a correction, and both over a repeat. Cues are looked for in the first
:data:`CUE_CHARS` characters: that is where a reaction to the answer is, and a message
that pastes a document after it should not be rated by a word inside the document.

Its feedback (:func:`rate_by_rules`, run by trainer/next_turn.py): ``source="next_turn"``,
``rater="rules:next_turn"``, the reward of the label on the answer before the message,
the comment ``next turn: <label> (cue: "<the words matched>")`` and the idempotency key
``next_turn:rules:<interaction id>``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from core.feedback import FeedbackInput
from schemas.atdp import FeedbackSource
from schemas.atdp import Session as SessionRecord
from trainer.reward_source import NextTurn, RewardSource

NAME = "next_turn_rules"
RATER = "rules:next_turn"
CUE_CHARS = 400  # the start of the message, where the reaction is
MAX_REPEAT_CHARS = 4000  # of each message compared for a repeat
MIN_REPEAT_WORDS = 3  # "ok" again is not the same question again
DEFAULT_REPEAT_SIMILARITY = 0.6

# each label's reward on the answer before the message (like judge_text.NEXT_TURN_REWARDS)
RULE_REWARDS: dict[str, float] = {
    "thanks": 1.0,
    "correction": -0.5,
    "complaint": -1.0,
    "repeat": -0.5,
}

# The lexicon: (label, pattern), tried in this order; the first match decides. Kept small
# on purpose: each cue is a phrase people use for that reaction and rarely otherwise.
_NOT = r"(?<!not )(?<!n't )"  # "not great" is no thanks
LEXICON: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        "complaint",
        re.compile(
            r"\b(?:useless|pointless|waste of (?:my )?time|too (?:long|verbose|short)"
            r"|you (?:didn'?t|did not|still|keep|ignored)|stop\b|(?:does|did)n'?t work"
            r"|(?:does|did) not work|not working|not (?:helpful|useful)|unhelpful"
            r"|i (?:already )?told you|ugh+\b)"
        ),
    ),
    (
        "correction",
        re.compile(
            # "no" opening the message (not "no problem", "no worries", "no thanks")
            r"^\W*no\b(?!\s*(?:problem|worries|thanks|thank))"
            r"|^\W*actually\b"
            r"|\b(?:that'?s|that is|this is|it'?s|it is) not (?:right|correct|it)\b"
            r"|\b(?:wrong|incorrect)\b"
            r"|\bi meant\b|\bwhat i meant\b|\bnot what i (?:asked|wanted|meant)"
            r"|\bi asked (?:for|you)\b|\byou misunderstood\b|\binstead\b"
        ),
    ),
    (
        "thanks",
        re.compile(
            rf"\b(?:thanks|thank you|thx|ty\b|{_NOT}great\b|{_NOT}perfect\b"
            rf"|that (?:works|worked|helps|helped)|it (?:works|worked)\b|{_NOT}awesome\b"
            rf"|{_NOT}exactly\b|{_NOT}excellent\b|spot on)"
        ),
    ),
)
_WORD = re.compile(r"[a-z0-9]+")


@dataclass(frozen=True)
class Label:
    label: str  # a key of RULE_REWARDS
    cue: str  # the words matched; for a repeat, the similarity

    @property
    def reward(self) -> float:
        return RULE_REWARDS[self.label]


def _words(text: str) -> set[str]:
    return set(_WORD.findall(text[:MAX_REPEAT_CHARS].lower()))


def similarity(a: str, b: str) -> float:
    """Jaccard overlap of the two texts' word sets (0 when either has too few words)."""
    wa, wb = _words(a), _words(b)
    if len(wa) < MIN_REPEAT_WORDS or len(wb) < MIN_REPEAT_WORDS:
        return 0.0
    return len(wa & wb) / len(wa | wb)


def classify(
    reply: str,
    previous: str | None = None,
    repeat_similarity: float = DEFAULT_REPEAT_SIMILARITY,
) -> Label | None:
    """The label of the user's next message ``reply``; ``previous``: the user message
    the answer replied to (for ``repeat``). None: no cue, no rating."""
    head = reply[:CUE_CHARS].lower().replace("\u2019", "'").strip()
    found = {label: m for label, pattern in LEXICON if (m := pattern.search(head))}
    for label in ("complaint", "correction"):
        if label in found:
            return Label(label, found[label].group(0).strip())
    if previous:
        score = similarity(reply, previous)
        if score >= repeat_similarity:
            return Label("repeat", f"{score:.2f} word overlap with the previous question")
    if "thanks" in found:
        return Label("thanks", found["thanks"].group(0).strip())
    return None


def comment(label: Label) -> str:
    return f'next turn: {label.label} (cue: "{label.cue}")'


def check_params(spec: dict[str, Any], where: str) -> None:
    value = spec.get("repeat_similarity")
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.3 <= value <= 1:
        raise ValueError(f"{where}.repeat_similarity must be a number in 0.3..1")


def rate_by_rules(
    factory: sessionmaker[Session],
    session: SessionRecord,
    pair: Any,
    spec: dict[str, Any],
    store: Callable[[FeedbackInput], dict[str, Any] | None],
    deadline: float | None = None,
) -> list[dict[str, Any]]:
    """The rating of ``pair.answer`` by ``pair.reply`` (trainer/next_turn.py ``Pair``),
    stored through ``store``; none without a cue."""
    threshold = float(spec.get("repeat_similarity") or DEFAULT_REPEAT_SIMILARITY)
    label = classify(pair.reply, pair.question, threshold)
    if label is None:
        return []
    fb = store(
        FeedbackInput(
            target="interaction",
            ref=pair.answer.id,
            value=label.reward,
            scale="scalar",
            scale_min=-1.0,
            scale_max=1.0,
            reward=label.reward,
            source="next_turn",
            rater=RATER,
            comment=comment(label),
            idempotency_key=f"next_turn:rules:{pair.answer.id}",
        )
    )
    return [fb] if fb else []


# the rules as a reward source: no answer score (the eval gate cannot use it), no session
# rating; it reads the user's next message as it arrives. Project settings only.
NEXT_TURN_RULES = RewardSource(
    NAME,
    ("repeat_similarity",),
    next_turn=NextTurn(rate_by_rules),
    trusted_only=("repeat_similarity",),
    check=check_params,
    feedback_source=FeedbackSource.next_turn,
)
