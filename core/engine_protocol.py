"""SGLang's native HTTP protocol as rlgate speaks it, without I/O: the bodies rlgate
sends and the readings of what an engine answers.

The one place that knows SGLang's wire format, for the gateway (``gateway/engines/engine_client.py``
over aiohttp, its hot path) and the trainer (``core/engine_http.py`` over httpx: publish,
rollback, the eval gate, the tick). It lives in core because the trainer never imports
the gateway. The embedded engine (``engine/``) implements the subset this module uses;
``tests/engine/test_engine_contract.py`` checks it on both engines (docs/engine.md).

Facts of SGLang 0.5.23 that shaped it (checked in its source and by the contract suite):
- ``sampling_params`` is checked against a schema: an unknown key (``seed``) is a 400;
  the seed is ``sampling_seed``, used only with ``--enable-deterministic-inference``;
- a request naming an adapter that was unloaded is served after SGLang re-loads it from
  the path it was loaded from (``TokenizerManager._resolve_lora_path``); only a name never
  loaded, or one whose path is gone, is refused; rlgate therefore loads every adapter
  from a path that it removes before unloading (``core/live_adapters.py``);
- an error found after a stream started (an adapter it cannot resolve) is a 200 whose
  one event is ``{"error": {"message", "code"}}``, then ``[DONE]``;
- the weight version is in ``GET /get_model_info`` and each answer's ``meta_info``;
  there is no ``/get_weight_version``.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from schemas import sampling_fields

# The SGLang release the contract suite runs against (tests/sglang_cpu/requirements.txt).
SGLANG_VERSION = "0.5.23"

# The router's worker listings, newest first (SGLang Model Gateway: GET /workers ->
# {"workers": [{"url"}, ...]}; older routers: GET /list_workers -> {"urls": [...]}).
WORKER_LISTINGS = ("/workers", "/list_workers")
GENERATE = "/generate"
ABORT = "/abort_request"
LOAD = "/load_lora_adapter"
UNLOAD = "/unload_lora_adapter"
MODELS = "/v1/models"
MODEL_INFO = "/get_model_info"
SERVER_INFO = "/get_server_info"
HEALTH = "/health"
# a GPU shared with training (trainer/shared_gpu.py): SGLang's RL hooks; the memory ones
# need ``--enable-memory-saver`` and an idle engine (hence the pause first)
PAUSE = "/pause_generation"
CONTINUE = "/continue_generation"
RELEASE_MEMORY = "/release_memory_occupation"
RESUME_MEMORY = "/resume_memory_occupation"


class EngineRefused(Exception):
    """The engine answered with an error: ``status`` (an HTTP code; for an error inside a
    200 stream, the code the event carries) and its message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message


class BadAnswer(Exception):
    """The engine answered something this protocol cannot read."""


# ---- requests --------------------------------------------------------------------------


@dataclass(frozen=True)
class Sampling:
    """The sampling parameters rlgate sends: ``values``, the table's fields by internal name
    (schemas/sampling_fields.py; one left out takes its default), and the rest."""

    max_new_tokens: int
    values: Mapping[str, float] = field(default_factory=dict)
    stop: list[str] | None = None
    seed: int | None = None
    json_schema: str | None = None
    structural_tag: str | None = None  # the JSON text of ``structural_tag()``
    skip_special_tokens: bool = True

    def params(self) -> dict[str, Any]:
        """SGLang's ``sampling_params``: each table field under its SGLang name, always or
        only when not its default (the row's ``sent``)."""
        out: dict[str, Any] = {"max_new_tokens": self.max_new_tokens}
        for f in sampling_fields.FIELDS:
            value = self.values.get(f.name, f.default)
            if f.sends(value):
                out[f.sglang] = value
        out["skip_special_tokens"] = self.skip_special_tokens
        if self.stop:
            out["stop"] = list(self.stop)
        if self.seed is not None:
            # SGLang's name; `seed` is an unknown field there (400). The embedded engine
            # takes both; SGLang honours it only with --enable-deterministic-inference.
            out["sampling_seed"] = self.seed
        if self.json_schema is not None:
            out["json_schema"] = self.json_schema
        if self.structural_tag is not None:
            out["structural_tag"] = self.structural_tag
        return out


GREEDY = {"temperature": 0.0}


@dataclass(frozen=True)
class Tag:
    """One tag of a structural tag: ``begin``, a JSON value valid against ``schema`` (or,
    given ``content``, that xgrammar format: ``grammar``, ``any_text``), ``end``."""

    begin: str
    schema: dict[str, Any]
    end: str
    content: dict[str, Any] | None = None


def structural_tag(
    tags: list[Tag], separator: str, *, at_least_one: bool, stop_after_first: bool
) -> str:
    """SGLang's ``structural_tag`` param in xgrammar's format shape (SGLang 0.5.23 passes it
    to ``compile_structural_tag``; the embedded engine reads the same subset,
    engine/structural_tag.py): the output is one of ``tags``, then optionally more, each
    after ``separator``, and nothing else; ``at_least_one`` forbids the empty output,
    ``stop_after_first`` allows one tag only. The older ``structures``/``triggers`` shape
    allows free text around its tags, so it cannot force them."""
    fmt = {
        "type": "tags_with_separator",
        "tags": [
            {
                "type": "tag",
                "begin": t.begin,
                "content": t.content or {"type": "json_schema", "json_schema": t.schema},
                "end": t.end,
            }
            for t in tags
        ],
        "separator": separator,
        "at_least_one": at_least_one,
        "stop_after_first": stop_after_first,
    }
    return json.dumps({"type": "structural_tag", "format": fmt}, ensure_ascii=False)


def new_rid(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(4)}"


def generate_body(
    input_ids: list[int] | list[list[int]] | list[str],
    sampling: Sampling | list[Sampling],
    *,
    adapter: str | None | list[str | None] = None,
    rid: str | list[str] | None = None,
    stream: bool = False,
    top_logprobs: int = 0,
    return_logprob: bool = True,
    logprob_start_len: int | None = None,
) -> dict[str, Any]:
    """A ``/generate`` body: the prompt as ids (one, or a batch with a list of
    ``sampling``/``adapter`` per prompt; a batch of strings is sent as SGLang's ``text``,
    which the engine tokenizes), the adapter named explicitly (SGLang uses the base model
    for a missing ``lora_path``), logprobs returned."""
    params = [s.params() for s in sampling] if isinstance(sampling, list) else sampling.params()
    texts = bool(input_ids) and all(isinstance(x, str) for x in input_ids)
    body: dict[str, Any] = {
        "text" if texts else "input_ids": input_ids,
        "sampling_params": params,
        "return_logprob": return_logprob,
        "top_logprobs_num": top_logprobs,
        "stream": stream,
        "lora_path": adapter,
    }
    if rid is not None:
        body["rid"] = rid
    if logprob_start_len is not None:  # the prompt's logprobs too, from this position
        body["logprob_start_len"] = logprob_start_len
    return body


def load_body(name: str, path: str) -> dict[str, Any]:
    return {"lora_name": name, "lora_path": path}


def unload_body(name: str) -> dict[str, Any]:
    return {"lora_name": name}


def abort_body(rid: str) -> dict[str, Any]:
    return {"rid": rid}


def pause_body() -> dict[str, Any]:
    """Stop generating; running requests go back to the waiting queue (their KV cache is
    recomputed after the continue), new ones wait there too."""
    return {"mode": "retract"}


def continue_body() -> dict[str, Any]:
    return {}


def memory_body() -> dict[str, Any]:
    """Release or resume every kind of GPU memory (no ``tags``: weights, KV cache and CUDA
    graphs)."""
    return {}


def encode(body: dict[str, Any]) -> bytes:
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


# ---- answers ---------------------------------------------------------------------------


def error_message(body: bytes | Any) -> str:
    """The message of an engine's error answer, in any of its shapes: SGLang's
    ``{"error": {"message"}}`` (the embedded engine's too), its schema check's
    ``{"error": "..."}``, FastAPI's ``{"detail"}``, or plain text."""
    data = body
    if isinstance(body, bytes | bytearray):
        try:
            data = json.loads(body)
        except ValueError:
            return bytes(body).decode(errors="replace")[:500]
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict):
            return str(err.get("message") or err)
        return str(err or data.get("message") or data.get("error_message") or data.get("detail"))
    return str(data)[:500]


@dataclass
class Output:
    """One finished (or, mid-stream, partial) sequence of a ``/generate`` answer."""

    ids: list[int]
    logprobs: list[float]
    top: list[list[tuple[int, float]]] | None
    text: str
    finish_reason: str | None  # stop | length | abort; None while a stream runs
    prompt_tokens: int | None
    cached_tokens: int
    weight_version: str | None
    rid: str | None
    # with ``logprob_start_len`` asked: the prompt's logprobs from there (the first None)
    # and, with top logprobs, their alternatives (None at the first position)
    prompt_logprobs: list[float | None] | None = None
    prompt_top: list[list[tuple[int, float]] | None] | None = None


def top_logprobs(meta: dict[str, Any], start: int = 0) -> list[list[tuple[int, float]]] | None:
    """``meta_info.output_top_logprobs`` from position ``start``: per position, the
    (token id, logprob) alternatives; None when the engine returned none."""
    tops = meta.get("output_top_logprobs")
    if not tops:
        return None
    return [[(int(t[1]), float(t[0])) for t in (pos or [])] for pos in tops[start:]]


def prompt_logprobs_of(meta: dict[str, Any]) -> dict[str, Any]:
    """``meta_info.input_token_logprobs`` / ``input_top_logprobs`` (SGLang's, asked for
    with ``logprob_start_len``) as Output's ``prompt_logprobs`` / ``prompt_top``."""
    given = meta.get("input_token_logprobs")
    if not given:
        return {}
    tops = meta.get("input_top_logprobs")
    return {
        "prompt_logprobs": [None if t[0] is None else float(t[0]) for t in given],
        "prompt_top": [
            None if pos is None else [(int(t[1]), float(t[0])) for t in pos] for pos in tops
        ]
        if tops
        else None,
    }


def _finished(meta: dict[str, Any]) -> dict[str, Any]:
    """The per-sequence facts of a ``meta_info`` (Output's fields besides the tokens)."""
    reason = meta.get("finish_reason")
    prompt = meta.get("prompt_tokens")
    return {
        **prompt_logprobs_of(meta),
        "finish_reason": reason.get("type") if isinstance(reason, dict) else reason,
        "prompt_tokens": int(prompt) if prompt is not None else None,
        "cached_tokens": int(meta.get("cached_tokens") or 0),
        "weight_version": meta.get("weight_version"),
        "rid": meta.get("id"),
    }


def read_output(out: Any, strict: bool = True) -> Output:
    """One item of a ``/generate`` answer; :class:`BadAnswer` when its logprobs do not
    match its tokens (rlgate records both, token-exactly). ``strict=False`` (a reader that
    does not record them, the eval gate) takes zeros for logprobs that are missing."""
    if not isinstance(out, dict):
        raise BadAnswer(f"a /generate answer item is {type(out).__name__}, not an object")
    meta = out.get("meta_info") or {}
    ids = [int(i) for i in out.get("output_ids") or []]
    lps = [float(t[0]) for t in meta.get("output_token_logprobs") or []]
    if len(lps) != len(ids):
        if strict:
            raise BadAnswer("the engine returned logprobs that do not match its tokens")
        lps = [0.0] * len(ids)
    text = str(out.get("text") or "")
    return Output(ids=ids, logprobs=lps, top=top_logprobs(meta), text=text, **_finished(meta))


DONE = object()  # the end of a stream


def stream_event(line: bytes) -> dict[str, Any] | object | None:
    """One line of a ``/generate`` event stream: the chunk (a dict), :data:`DONE`, or None
    for a line that carries none. An error event raises :class:`EngineRefused` with the
    code it carries (SGLang reports an error found after the stream started this way)."""
    if not line.startswith(b"data:"):
        return None
    data = line[5:].strip()
    if data == b"[DONE]":
        return DONE
    chunk = json.loads(data)
    if isinstance(chunk, dict) and "error" in chunk and "output_ids" not in chunk:
        err = chunk["error"]
        code = err.get("code") if isinstance(err, dict) else None
        raise EngineRefused(int(code) if isinstance(code, int) else 400, error_message(chunk))
    return chunk


@dataclass
class Delta:
    """What one stream chunk added to its sequence."""

    ids: list[int]
    logprobs: list[float]
    top: list[list[tuple[int, float]]]
    text: str


@dataclass
class StreamReader:
    """Folds the cumulative chunks of one streamed sequence (SGLang's default: every chunk
    carries the text, ids and logprobs so far) into deltas, and the final output."""

    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[list[tuple[int, float]]] = field(default_factory=list)
    text: str = ""
    last: dict[str, Any] = field(default_factory=dict)

    def feed(self, chunk: dict[str, Any]) -> Delta:
        self.last = chunk
        meta = chunk.get("meta_info") or {}
        start = len(self.ids)
        new_ids = [int(i) for i in (chunk.get("output_ids") or [])[start:]]
        new_lps = [float(t[0]) for t in (meta.get("output_token_logprobs") or [])[start:]]
        new_top = top_logprobs(meta, start) or []
        text = str(chunk.get("text") or "")
        delta = text[len(self.text) :] if text.startswith(self.text) else ""
        self.text = text
        self.ids.extend(new_ids)
        self.logprobs.extend(new_lps)
        self.top.extend(new_top)
        return Delta(new_ids, new_lps, new_top, delta)

    def output(self) -> Output:
        """The sequence as streamed: every id and logprob, the final chunk's meta."""
        if len(self.logprobs) != len(self.ids):
            raise BadAnswer("the engine streamed logprobs that do not match its tokens")
        return Output(
            ids=list(self.ids),
            logprobs=list(self.logprobs),
            top=list(self.top) or None,
            text=self.text,
            **_finished(self.last.get("meta_info") or {}),
        )
