"""One call on its way through the pipeline, and its three translations that are not an
API's: the engine's SGLang JSON in (``engine_payload``) and out (``engine_completion``),
and the ATDP interaction record it leaves (``interaction_record``).

Token ids and logprobs are copied here as the engine returned them, never re-tokenized.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from core import engine_protocol as proto
from core.errors import APIError
from core.serving_version import BASE
from gateway.call.custom_tools import custom_names
from gateway.call.cut_calls import cut_calls
from gateway.call.output_limit import OutputLimit
from gateway.call.parsing import parse_output
from gateway.call.request import Completion, GenerationRequest, Message, ToolCallOut
from gateway.call.sessions import SessionContext, conversation_hash
from gateway.edge.auth import Principal
from schemas import sampling_fields
from schemas.atdp import Interaction


@dataclass
class Prepared:
    principal: Principal
    req: GenerationRequest
    session: SessionContext
    prompt_ids: list[int]
    adapter: str | None
    limit: OutputLimit  # the engine's max_new_tokens and what set it (output_limit.py)
    interaction_id: str
    started: float = field(default_factory=time.monotonic)
    ttft_ms: float | None = None
    engine_url: str | None = None
    forced_tools: str | None = None  # the structural_tag of forced calls (forced_tools.py)
    attempt: int = 0  # the client SDK's retry count of this request (gateway/recording/retries.py)
    # the call's span (gateway/call/tracing.py CallTrace) when traces are on; None: off
    trace: Any = None

    @property
    def policy_version(self) -> str:
        return self.adapter or BASE

    def row_id(self, index: int) -> str:
        return self.interaction_id if self.req.sampling.n == 1 else f"{self.interaction_id}.{index}"


@dataclass
class StreamEvent:
    index: int
    text: str = ""  # the engine's text delta, unparsed (what the Completions API streams)
    content: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCallOut] = field(default_factory=list)
    new_ids: list[int] = field(default_factory=list)
    new_logprobs: list[float] = field(default_factory=list)
    new_top: list[list[tuple[int, float]]] = field(default_factory=list)
    finished: Completion | None = None
    # on a choice's first event when the prompt's logprobs were asked for (Completion's)
    prompt_logprobs: list[float | None] | None = None
    prompt_top: list[list[tuple[int, float]] | None] | None = None


def engine_payload(prep: Prepared, index: int, stream: bool) -> dict[str, Any]:
    """SGLang's ``/generate`` body for choice ``index`` (core/engine_protocol.py): the
    prompt as ids, the adapter named explicitly, logprobs always returned; choice i of a
    seeded call samples with seed + i. Forced tool calls replace structured output (a
    forced turn has no text answer to shape)."""
    s = prep.req.sampling
    sampling = proto.Sampling(
        max_new_tokens=prep.limit.tokens,
        values=s.values,
        stop=s.stop or None,
        seed=s.seed + index if s.seed is not None else None,
        json_schema=None if prep.forced_tools else s.json_schema,
        structural_tag=prep.forced_tools,
    )
    return proto.generate_body(
        prep.prompt_ids,
        sampling,
        adapter=prep.adapter,
        rid=proto.new_rid(prep.row_id(index)),
        stream=stream,
        top_logprobs=s.top_logprobs if s.logprobs else 0,
        logprob_start_len=0 if prep.req.prompt_logprobs else None,
    )


def engine_completion(
    prep: Prepared,
    index: int,
    out: dict[str, Any] | proto.Output,
    parser: str | None,
    reasoning: bool,
) -> Completion:
    """The finished choice of an engine answer, its text parsed (reasoning, tool calls)."""
    try:
        got = out if isinstance(out, proto.Output) else proto.read_output(out)
    except proto.BadAnswer as e:
        raise APIError(503, str(e)) from None
    fr = got.finish_reason or "stop"
    if is_cut_forced(prep, fr) and parser:  # its calls as calls, the cut one marked cut
        content, thought, calls = None, None, cut_calls(got.text, parser, prep.req.tools)
    else:
        content, thought, calls = parse_output(
            got.text, parser, reasoning, custom_names(prep.req.tools)
        )
    if calls and fr == "stop":
        fr = "tool_calls"
    return Completion(
        index=index,
        output_ids=got.ids,
        logprobs=got.logprobs,
        top_logprobs=got.top,
        text=got.text,
        content=content,
        reasoning=thought,
        tool_calls=calls,
        finish_reason=fr,
        prompt_tokens=got.prompt_tokens if got.prompt_tokens is not None else len(prep.prompt_ids),
        cached_tokens=got.cached_tokens,
        prompt_logprobs=got.prompt_logprobs,
        prompt_top=got.prompt_top,
    )


def is_cut_forced(prep: Prepared, finish_reason: str | None) -> bool:
    """A forced turn (gateway/call/forced_tools.py) that its output limit cut."""
    return prep.forced_tools is not None and finish_reason == "length"


def aborted_completion(prep: Prepared, index: int, state: proto.StreamReader) -> Completion:
    """What a stream had generated for choice ``index`` when its client went away."""
    return Completion(
        index=index,
        output_ids=list(state.ids),
        logprobs=list(state.logprobs),
        top_logprobs=list(state.top) or None,
        text=state.text,
        content=state.text,
        reasoning=None,
        tool_calls=[],
        finish_reason="abort",
        prompt_tokens=len(prep.prompt_ids),
    )


def output_json(c: Completion) -> dict[str, Any]:
    """A choice's parsed output as ``interactions.output`` stores it."""
    return {
        "text": c.content,
        "reasoning": c.reasoning,
        "tool_calls": [stored_call(t) for t in c.tool_calls],
    }


def stored_call(t: ToolCallOut) -> dict[str, Any]:
    """A tool call as ``interactions.output`` stores it; a custom call's input is its
    ``arguments``, marked ``"type": "custom"``; one cut by the output limit (a forced
    turn's last, gateway/call/cut_calls.py) is marked ``"cut": true``."""
    out: dict[str, Any] = {"id": t.id, "name": t.name, "arguments": t.arguments}
    if t.custom:
        out["type"] = "custom"
    if t.cut:
        out["cut"] = True
    return out


def read_stored_call(d: dict[str, Any]) -> ToolCallOut:
    """The inverse of ``stored_call``."""
    return ToolCallOut(
        str(d.get("id", "")),
        str(d.get("name", "")),
        str(d.get("arguments", "{}")),
        custom=d.get("type") == "custom",
        cut=d.get("cut") is True,
    )


def interaction_record(
    prep: Prepared, c: Completion, *, now: datetime, latency_ms: float, group: str | None
) -> Interaction:
    """The ATDP record of one choice, with the continuation hash a follow-up call that
    extends this conversation will be stitched by (gateway.call.sessions)."""
    answer = Message("assistant", c.content or "", tool_calls=c.tool_calls)
    return Interaction(
        id=prep.row_id(c.index),
        project_id=prep.principal.project_id,
        session_id=prep.session.session_id,
        seq=0,
        parent_id=prep.session.parent_id,
        group_id=group,
        choice_index=c.index,
        request=prep.req.raw,
        prompt_token_ids=prep.prompt_ids,
        completion_token_ids=c.output_ids,
        completion_logprobs=c.logprobs,
        **sampling_fields.recorded(prep.req.sampling.values),
        policy_version=prep.policy_version,
        finish_reason=c.finish_reason,
        output=output_json(c),
        usage={
            "prompt_tokens": len(prep.prompt_ids),
            "completion_tokens": len(c.output_ids),
            "cached_tokens": c.cached_tokens,
        },
        latency_ms=latency_ms,
        ttft_ms=prep.ttft_ms if prep.ttft_ms is not None else latency_ms,
        engine_url=prep.engine_url,
        created_at=now,
        continuation_hash=conversation_hash([*prep.req.messages, answer]),
        attempt=prep.attempt,
    )


def keep_streamed_ids(done: Completion, streamed: list[ToolCallOut]) -> None:
    """The streamed calls' ids on the finished choice (both parse the same text; the
    whole-text parse minted new ids): the ids the client was sent are the ones recorded,
    answered in ``response.completed`` and looked up by ``previous_response_id``. The
    streamed calls may be the first of them only: a cut call is sent at the end."""
    head = done.tool_calls[: len(streamed)]
    if [(c.name, c.arguments) for c in streamed] == [(c.name, c.arguments) for c in head]:
        for sent, call in zip(streamed, head, strict=True):
            call.id = sent.id
