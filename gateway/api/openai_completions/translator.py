"""OpenAI Completions <-> the internal request: a body to one ``GenerationRequest`` per
prompt (no chat template: the prompt is tokenized as it is, or sent as token ids), their
``Completion``s to a ``text_completion``, a stored request to the dashboard's messages."""

from __future__ import annotations

import time
from typing import Any

from core.errors import APIError
from gateway.api import base
from gateway.api.openai_chat.protocol import calls_usage
from gateway.api.openai_completions.protocol import (
    MAX_PROMPTS,
    CompletionRequest,
    choice_json,
)
from gateway.call.pipeline import Prepared
from gateway.call.request import Completion, GenerationRequest, Message, Sampling
from gateway.edge.errors import bad_request
from schemas.atdp import ClientProtocol

PROTOCOL = ClientProtocol.openai_completions
ID_PREFIX = "cmpl-"
IGNORED = {"store", "service_tier", "prompt_cache_key", "safety_identifier"}
PROMPT_FORMS = "a string, a list of strings, a list of token ids, or a list of token-id lists"


def _is_ids(x: Any) -> bool:
    return isinstance(x, list) and bool(x) and all(type(i) is int for i in x)


def prompts(raw: Any) -> list[str | list[int]]:
    """The prompts of ``prompt`` in any of its four forms; a 400 naming them otherwise."""
    if isinstance(raw, str):
        return [raw]
    if not isinstance(raw, list) or not raw:
        raise bad_request(f"prompt must be {PROMPT_FORMS} (got {type(raw).__name__})", "prompt")
    if _is_ids(raw):
        return [list(raw)]
    if all(isinstance(p, str) for p in raw) or all(_is_ids(p) for p in raw):
        if len(raw) > MAX_PROMPTS:
            raise bad_request(f"prompt holds {len(raw)} prompts; at most {MAX_PROMPTS}", "prompt")
        return list(raw)
    raise bad_request(
        f"prompt must be {PROMPT_FORMS}, not a mix; token ids are non-negative integers",
        "prompt",
    )


def _sampling(req: CompletionRequest) -> Sampling:
    stop = base.seed_and_stop(req.seed, req.n, req.stop)
    return Sampling(
        values=base.call_values(req, PROTOCOL),
        max_tokens=req.max_tokens,
        stop=stop,
        seed=req.seed,
        n=req.n,
        logprobs=req.logprobs is not None,
        top_logprobs=req.logprobs or 0,
    )


def _refuse(req: CompletionRequest) -> None:
    if req.suffix:
        raise bad_request(
            "suffix (fill-in-the-middle) is not supported: the served model has no "
            "fill-in-the-middle template; put the text before the gap in prompt and drop suffix",
            "suffix",
        )
    if req.best_of is not None and req.best_of != req.n:
        raise bad_request("best_of is not supported; drop it (or set it equal to n)", "best_of")
    if req.logit_bias:
        raise bad_request("logit_bias is not supported; remove it", "logit_bias")


def to_internal(body: Any, session_header: str | None) -> list[GenerationRequest]:
    """One request per prompt, each sampled ``n`` times."""
    req = base.validate(CompletionRequest, body)
    _refuse(req)
    base.reject_unknown(req, IGNORED)
    out = []
    for prompt in prompts(req.prompt):
        # the prompt as one user message: what sessions hash and the dashboard shows
        messages = [Message("user", prompt if isinstance(prompt, str) else "")]
        out.append(
            base.internal_request(
                PROTOCOL,
                req,
                body,
                messages,
                ("none", []),
                _sampling(req),
                include_usage=bool((req.stream_options or {}).get("include_usage")),
                user=req.user,
                metadata=req.metadata or {},
                session_hint=session_header,
                raw_prompt=prompt,
                return_token_ids=req.return_token_ids,
                prompt_logprobs=req.echo and req.logprobs is not None,
            )
        )
    return out


def display_messages(raw: dict[str, Any]) -> list[dict[str, Any]]:
    """A stored request's prompt(s) as the dashboard shows them."""

    def parse() -> list[Message]:
        return [
            Message("user", p if isinstance(p, str) else f"(token ids) {p}")
            for p in prompts(raw.get("prompt"))
        ]

    return base.display_or_raw(parse, raw.get("prompt"))


# ---- answers ------------------------------------------------------------------------


def echoed(prep: Prepared, tokenizer: Any) -> str:
    """The prompt as text, for ``echo``."""
    p = prep.req.raw_prompt
    return p if isinstance(p, str) else tokenizer.decode(prep.prompt_ids)


def logprobs_json(
    tokenizer: Any,
    ids: list[int],
    lps: list[float] | list[float | None],
    tops: list[list[tuple[int, float]]] | list[list[tuple[int, float]] | None] | None,
    offset: int = 0,
) -> dict[str, Any]:
    """The legacy logprobs object: each token's text, logprob, top alternatives (token
    text -> logprob, the sampled token always among them) and character offset. A
    position without a logprob (an echoed prompt's first token) has null for both."""
    tokens, offsets, top = [], [], []
    for k, (tid, lp) in enumerate(zip(ids, lps, strict=True)):
        tok = tokenizer.decode([tid])
        tokens.append(tok)
        offsets.append(offset)
        offset += len(tok)
        if lp is None:
            top.append(None)
            continue
        given = (tops[k] if tops and k < len(tops) else None) or []
        alts = {tokenizer.decode([t]): v for t, v in given}
        alts.setdefault(tok, lp)
        top.append(alts)
    return {
        "tokens": tokens,
        "token_logprobs": list(lps),
        "top_logprobs": top,
        "text_offset": offsets,
    }


def _echo_logprobs(prep: Prepared, c: Completion, tokenizer: Any) -> dict[str, Any]:
    """``echo`` with ``logprobs``: the prompt's tokens (the first without a logprob, as
    vLLM answers) and then the completion's, in one logprobs object."""
    n = len(prep.prompt_ids)
    if c.prompt_logprobs is None or len(c.prompt_logprobs) != n:
        raise APIError(503, "the engine did not return the prompt's logprobs; retry")
    return logprobs_json(
        tokenizer,
        [*prep.prompt_ids, *c.output_ids],
        [*c.prompt_logprobs, *c.logprobs],
        [*(c.prompt_top or [None] * n), *(c.top_logprobs or [None] * len(c.output_ids))],
    )


def choice_of(
    prep: Prepared, c: Completion, index: int, tokenizer: Any, prefix: str = ""
) -> dict[str, Any]:
    logprobs = None
    if prep.req.prompt_logprobs:  # echo: the prompt's tokens first, then the completion's
        logprobs = _echo_logprobs(prep, c, tokenizer)
    elif prep.req.sampling.logprobs:
        logprobs = logprobs_json(tokenizer, c.output_ids, c.logprobs, c.top_logprobs, len(prefix))
    choice = choice_json(index, prefix + c.text, logprobs, c.finish_reason)
    return {**choice, **base.token_ids(prep, c)}  # vLLM's place: in each choice


def response_body(
    preps: list[Prepared], results: list[list[Completion]], tokenizer: Any, model: str
) -> dict[str, Any]:
    """One ``text_completion`` for every prompt: choice ``k * n + j`` is choice j of
    prompt k (as vLLM numbers them)."""
    choices = []
    for k, (prep, completions) in enumerate(zip(preps, results, strict=True)):
        prefix = echoed(prep, tokenizer) if prep.req.raw.get("echo") else ""
        n = prep.req.sampling.n
        choices += [choice_of(prep, c, k * n + c.index, tokenizer, prefix) for c in completions]
    return {
        "id": preps[0].interaction_id,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": calls_usage(
            [(len(p.prompt_ids), cs) for p, cs in zip(preps, results, strict=True)]
        ),
        "system_fingerprint": preps[0].policy_version,
    }
