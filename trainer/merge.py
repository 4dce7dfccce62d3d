"""Prefix merge: the turns of a session that extend each other are forwarded as one
sequence (AReaL's merge of a session into one trajectory).

Turn B *extends* turn A when both are of the same session and B's prompt ids start with
A's prompt ids followed by A's completion ids (token-exact; the tokens after that, the
tool or user message and the template's markers, are new prompt tokens). A *chain* is a
run of turns each extending the one before; it is forwarded as one row, the last turn's
prompt + completion, which holds every earlier turn's prompt and completion as a prefix.
Turns that extend no other (a re-rendered assistant message whose tokens differ from the
sampled ones, a branch, another session) stay rows of their own.

The loss is unchanged by construction, and this is the one place that says so: the
merged forward only changes how the hidden states are computed. The LM head runs at the
positions that predict each turn's sampled tokens (never at the tokens between turns),
and the logprobs are split back per turn (trainer/policy.py), so trainer/loss.py sees
exactly the per-turn rows. Each turn keeps its own advantage, behaviour logprobs,
temperature, policy version (staleness, IcePop mask) and its weight in every
aggregation: ``token-mean`` divides by the minibatch's sampled tokens, ``seq-mean``
averages each turn's tokens first, just as without the merge. Causal attention makes a
turn's logprobs inside the merged row the same as in its own row; the shared prefix gets
the sum of every turn's gradient either way.

Memory: a merged row is exactly as long as its last turn's own row, so merging never
makes a longer sequence than the per-turn rows had (the model's context and
``micro_batch_tokens`` bound it as before).
"""

from __future__ import annotations

from trainer.data import Sample


def extends(later: Sample, earlier: Sample) -> bool:
    """``later``'s prompt is ``earlier``'s prompt + completion (+ more), same session."""
    if not later.session_id or later.session_id != earlier.session_id:
        return False
    p, c = earlier.prompt_ids, earlier.completion_ids
    n = len(p) + len(c)
    if len(later.prompt_ids) < n:
        return False
    lp = later.prompt_ids
    if c and lp[n - 1] != c[-1]:  # a cheap first look
        return False
    return lp[: len(p)] == p and lp[len(p) : n] == c


def chains(samples: list[Sample]) -> list[list[Sample]]:
    """Rows to forward: chains of turns that extend each other (shortest prompt first),
    and single turns. Every sample is in exactly one row; a row's last sample is its
    longest. Rows come in the order of their first sample in ``samples``."""
    by_session: dict[str, list[Sample]] = {}
    order: list[str] = []
    for s in samples:
        key = s.session_id or f"\0{s.interaction_id}"  # no session: never merged
        if key not in by_session:
            by_session[key] = []
            order.append(key)
        by_session[key].append(s)
    rows: list[list[Sample]] = []
    for key in order:
        members = by_session[key]
        if len(members) == 1:
            rows.append(members)
            continue
        open_rows: list[list[Sample]] = []
        for s in sorted(members, key=lambda x: len(x.prompt_ids)):  # stable
            row = next((r for r in open_rows if extends(s, r[-1])), None)
            if row is None:
                open_rows.append([s])
            else:
                row.append(s)
        first = {id(s): i for i, s in enumerate(members)}
        rows.extend(sorted(open_rows, key=lambda r: min(first[id(s)] for s in r)))
    return rows


def units(samples: list[Sample]) -> list[list[Sample]]:
    """Samples that must share a minibatch: the same prompt (a GRPO group, whose forward
    shares the prompt) or the same chain (whose forward shares the session's prefix),
    joined transitively. Each unit keeps the order of ``samples``; units come in the
    order of their first sample (without chains: the prompt groups, as before)."""
    parent = list(range(len(samples)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    def join(i: int, j: int) -> None:
        parent[find(i)] = find(j)

    index = {id(s): i for i, s in enumerate(samples)}
    by_prompt: dict[tuple[int, ...], int] = {}
    for i, s in enumerate(samples):
        join(i, by_prompt.setdefault(tuple(s.prompt_ids), i))
    for row in chains(samples):
        for s in row[1:]:
            join(index[id(s)], index[id(row[0])])
    out: dict[int, list[Sample]] = {}
    for i, s in enumerate(samples):
        out.setdefault(find(i), []).append(s)
    return list(out.values())


def merged_turns(rows: list[list[Sample]]) -> int:
    """Turns forwarded inside a merged row (rows of two or more turns)."""
    return sum(len(r) for r in rows if len(r) > 1)
