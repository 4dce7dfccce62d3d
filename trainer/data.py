"""Which recorded interactions a run trains on, and the samples built from them.

One sample per interaction: the rendered prompt (masked) followed by the sampled
completion ids (trained), with the recorded per-token logprobs and temperature, and its
session: the turns of a session that extend each other token-exactly are forwarded as one
sequence (trainer/merge.py), each still its own sample in the loss.
Samples of a version newer than the serving one (it was rolled back) are skipped and stay
unconsumed. Records marked redacted (``request["rlgate_redaction"]["redacted"]``: the
gateway redacted them or retention purged them) are never selected or counted.

Two kinds of record are never trained on, skipped with their reason counted (and not
counted by the triggers, ``countable_where``):
- ``penalized``: sampled with a frequency or presence penalty (a field whose row in
  schemas/sampling_fields.py says its ``logprobs`` are ``penalized``), so the recorded
  logprobs are of the penalized distribution, not the policy's, and the off-policy
  correction would need the policy's own (docs/trainer.md);
- ``superseded``: a client SDK resent the request (a timeout) and the answer it never
  received was replaced by the retry's (``superseded_by``, gateway/recording/retries.py).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass, field

from sqlalchemy import false, or_, select
from sqlalchemy.orm import Session

from core.serving_version import BASE, serving_version
from schemas import sampling_fields
from schemas.tables import InteractionRow, PolicyVersionRow, SessionRow

BASE_POLICY = BASE  # what a base-model interaction records as its policy_version


@dataclass
class Sample:
    interaction_id: str
    prompt_ids: list[int]
    completion_ids: list[int]
    behav_logprobs: list[float]
    temperature: float
    reward: float
    group_key: str  # samples with the same key are normalized together
    baseline_key: str  # running baseline of singletons (the session's task, or "_default")
    advantage: float = 0.0
    version: int = 0  # the policy version that sampled it (base = 0)
    session_id: str = ""  # turns of one session may be merged (trainer/merge.py); "": never
    hinted_prompt: list[int] | None = None  # the prompt with a hint placed (trainer/hints.py)

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.completion_ids)


@dataclass
class Selection:
    samples: list[Sample] = field(default_factory=list)
    serving_version: int = 0
    skipped: Counter[str] = field(default_factory=Counter)


def policy_versions(db: Session, project_id: str) -> tuple[dict[str, int], int]:
    """(adapter name -> version incl. 'base' -> 0, serving version or 0)."""
    rows = db.execute(
        select(PolicyVersionRow.name, PolicyVersionRow.version).where(
            PolicyVersionRow.project_id == project_id
        )
    ).all()
    serving = serving_version(db, project_id)
    return {BASE_POLICY: 0, **dict(rows)}, serving.version if serving is not None else 0


def trainable_where(project_id: str):  # type: ignore[no-untyped-def]
    return (
        InteractionRow.project_id == project_id,
        InteractionRow.reward.is_not(None),
        InteractionRow.consumed_by_run_id.is_(None),
        InteractionRow.finish_reason != "abort",
        not_redacted(),
    )


# Set by the gateway's redaction (gateway/recording/redaction.py) and by the retention job
# (trainer/retention.py): such a record's text no longer matches its token ids, which
# are dropped, so it is never trained on.
REDACTION_MARKER = "rlgate_redaction"


def countable_where(project_id: str):  # type: ignore[no-untyped-def]
    """What the triggers count: trainable rows that selection will not skip by kind."""
    return (*trainable_where(project_id), *trains_on())


def trains_on():  # type: ignore[no-untyped-def]
    """SQL: not penalized (each penalizing field of schemas/sampling_fields.py at its
    default) and not superseded (selection skips those, counted)."""
    return (
        *(getattr(InteractionRow, f.column) == f.default for f in sampling_fields.penalizing()),
        InteractionRow.superseded_by.is_(None),
    )


def never_trained(row: InteractionRow) -> str | None:
    """The reason a record is never trained on, or None (``trains_on`` in Python)."""
    if row.superseded_by is not None:
        return "superseded"
    for f in sampling_fields.penalizing():
        value = getattr(row, f.column)
        if value is not None and value != f.default:
            return "penalized"
    return None


def not_redacted():  # type: ignore[no-untyped-def]
    """SQL: the record is not marked ``request["rlgate_redaction"]["redacted"]``."""
    flag = InteractionRow.request[(REDACTION_MARKER, "redacted")].as_boolean()
    return or_(flag.is_(None), flag == false())


def fresh_versions(db: Session, project_id: str, max_staleness: int) -> list[str]:
    versions, serving = policy_versions(db, project_id)
    return [name for name, v in versions.items() if 0 <= serving - v <= max_staleness]


def select_samples(
    db: Session, project_id: str, *, max_staleness: int, max_samples: int, group_by_prompt: bool
) -> Selection:
    versions, serving = policy_versions(db, project_id)
    out = Selection(serving_version=serving)
    rows = db.execute(
        select(InteractionRow, SessionRow.task_id)
        .join(SessionRow, SessionRow.id == InteractionRow.session_id)
        .where(*trainable_where(project_id))
        .order_by(InteractionRow.created_at, InteractionRow.id)
    ).all()
    for row, task_id in rows:
        excluded = never_trained(row)
        if excluded:
            out.skipped[excluded] += 1
            continue
        version = versions.get(row.policy_version)
        if version is None:
            out.skipped["unknown_policy"] += 1
            continue
        if serving - version > max_staleness:
            out.skipped["stale"] += 1
            continue
        if version > serving:  # sampled by a version that was rolled back
            out.skipped["rolled_back"] += 1
            continue
        comp = list(row.completion_token_ids or [])
        lps = list(row.completion_logprobs or [])
        if not comp or len(comp) != len(lps) or not row.prompt_token_ids:
            out.skipped["malformed"] += 1
            continue
        if len(out.samples) >= max_samples:
            out.skipped["over_max_samples"] += 1
            continue
        prompt = list(row.prompt_token_ids)
        if row.group_id:
            group_key = f"group:{row.group_id}"
        elif group_by_prompt:
            digest = hashlib.sha1(str(prompt).encode()).hexdigest()[:16]
            group_key = f"prompt:{digest}"
        else:
            group_key = f"single:{row.id}"
        out.samples.append(
            Sample(
                interaction_id=row.id,
                prompt_ids=prompt,
                completion_ids=comp,
                behav_logprobs=[float(x) for x in lps],
                temperature=float(row.temperature or 0.0),
                reward=float(row.reward),
                group_key=group_key,
                baseline_key=task_id or "_default",
                version=version,
                session_id=row.session_id or "",
            )
        )
    return out
