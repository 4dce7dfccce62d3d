"""The sampling fields of a call, each declared once: one :class:`CallField` row of
:data:`FIELDS` says everything rlgate needs to know of it outside its meaning.

A row declares:
- ``name``, ``type``, ``default``, ``range``: the internal field, a key of ``values`` in
  ``gateway/call/request.py``'s ``Sampling`` and ``core/engine_protocol.py``'s;
- ``apis``: the client APIs that take it (``ClientProtocol`` values), each with its request
  field's name and the range that API accepts, where they differ from the row's (an API
  not listed refuses the field as an unsupported parameter); ``off``: an API value that
  means the default, as null does;
- ``sglang``, ``sent``: its key in SGLang's ``sampling_params``, sent ``always`` or only
  when ``set`` (not the default);
- ``column``: the ATDP ``Interaction`` column it is recorded in (None: not recorded);
- ``logprobs``: what it does to the logprobs the engine reports for the sampled tokens:
  ``policy`` nothing (SGLang computes them before top-p, top-k and min-p filtering),
  ``scaled`` they are of the logits divided by it (the trainer reads the recorded
  temperature), ``penalized`` they are not the policy's: a record where it is set is never
  trained on, skipped under that reason (trainer/data.py);
- ``trace``, ``traced``: the attribute of the call's span (gateway/call/tracing.py), set
  ``always`` or when ``set``.

Derived from the table: the API request models' fields and bounds
(``gateway/api/base.py`` ``with_call_fields``), the internal ``Sampling`` built from a
parsed request (``base.call_values``), SGLang's ``sampling_params`` (core/engine_protocol.py),
the interaction record (gateway/call/generation.py), the span's attributes and the
trainer's filter. Consumers read ``FIELDS`` through this module at call time, so a test may
extend the table. What a field means is the engine's (engine/sampling.py), and a recorded
field needs its column (schemas/atdp.py, schemas/tables.py, a migration); docs/architecture.md
lists the files a new field touches.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from schemas.atdp import ClientProtocol

CHAT = ClientProtocol.openai_chat.value
COMPLETIONS = ClientProtocol.openai_completions.value
RESPONSES = ClientProtocol.openai_responses.value
MESSAGES = ClientProtocol.anthropic_messages.value

When = Literal["always", "set"]
Logprobs = Literal["policy", "scaled", "penalized"]


@dataclass(frozen=True)
class Range:
    """Inclusive ``ge``/``le`` and exclusive ``gt`` bounds (pydantic's names); None: open."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None

    def __contains__(self, value: float) -> bool:
        return (
            (self.ge is None or value >= self.ge)
            and (self.gt is None or value > self.gt)
            and (self.le is None or value <= self.le)
        )


@dataclass(frozen=True)
class ApiField:
    """The field as one client API takes it: its name there and the range it accepts
    (None, in a row as written: the row's own)."""

    name: str
    range: Range | None = None


def on(*apis: str, range: Range | None = None, name: str = "") -> dict[str, ApiField]:
    """``apis`` take the field under ``name`` ("": the internal one) in ``range`` (None: the
    row's range)."""
    return {api: ApiField(name, range) for api in apis}


@dataclass(frozen=True)
class CallField:
    """One sampling field of a call (the module's docstring says what each part means)."""

    name: str
    type: type[int] | type[float]
    default: float
    range: Range
    help: str
    apis: Mapping[str, ApiField]
    off: float | None = None
    sglang: str = ""  # "": the internal name
    sent: When = "set"
    column: str | None = None
    logprobs: Logprobs = "policy"
    trace: str | None = None
    traced: When = "set"

    def __post_init__(self) -> None:
        apis = {
            a: ApiField(f.name or self.name, f.range or self.range) for a, f in self.apis.items()
        }
        object.__setattr__(self, "apis", apis)
        object.__setattr__(self, "sglang", self.sglang or self.name)
        if self.logprobs == "penalized" and self.column is None:
            raise ValueError(f"{self.name}: a penalized field must be recorded (column)")

    def from_api(self, value: float | None) -> float:
        """The internal value of what a client sent (None: not sent)."""
        return self.default if value is None or value == self.off else value

    def is_set(self, value: float) -> bool:
        return value != self.default

    def sends(self, value: float) -> bool:
        return self.sent == "always" or self.is_set(value)

    def traces(self, value: float) -> bool:
        return self.trace is not None and (self.traced == "always" or self.is_set(value))


OPENAI = (CHAT, COMPLETIONS, RESPONSES)

FIELDS: tuple[CallField, ...] = (
    CallField(
        "temperature",
        float,
        1.0,
        Range(ge=0, le=2),
        "0: greedy",
        apis={**on(*OPENAI), **on(MESSAGES, range=Range(ge=0, le=1))},
        sent="always",
        column="temperature",
        logprobs="scaled",
        trace="gen_ai.request.temperature",
        traced="always",
    ),
    CallField(
        "top_p",
        float,
        1.0,
        Range(gt=0, le=1),
        "sample from the likeliest tokens whose probabilities add up to top_p",
        apis=on(*OPENAI, MESSAGES),
        sent="always",
        column="top_p",
        trace="gen_ai.request.top_p",
        traced="always",
    ),
    CallField(
        "top_k",
        int,
        -1,
        Range(ge=-1),
        "sample from the k likeliest tokens; -1 (0 in an API): all (vLLM's and SGLang's "
        "extension of OpenAI's APIs)",
        apis={**on(CHAT, COMPLETIONS), **on(MESSAGES, range=Range(ge=0))},
        off=0,
        sent="always",
        trace="gen_ai.request.top_k",
    ),
    CallField(
        "min_p",
        float,
        0.0,
        Range(ge=0, le=1),
        "drop tokens less likely than min_p times the likeliest; 0: off (vLLM's and SGLang's)",
        apis=on(CHAT, RESPONSES),
        column="min_p",
        trace="rlgate.request.min_p",
    ),
    CallField(
        "frequency_penalty",
        float,
        0.0,
        Range(ge=-2, le=2),
        "OpenAI's: minus this times the count of the token in the output so far",
        apis=on(*OPENAI),
        column="frequency_penalty",
        logprobs="penalized",
        trace="gen_ai.request.frequency_penalty",
    ),
    CallField(
        "presence_penalty",
        float,
        0.0,
        Range(ge=-2, le=2),
        "OpenAI's: minus this once the token is in the output",
        apis=on(*OPENAI),
        column="presence_penalty",
        logprobs="penalized",
        trace="gen_ai.request.presence_penalty",
    ),
)


def defaults() -> dict[str, float]:
    """Every field at its default (a call that sets none)."""
    return {f.name: f.default for f in FIELDS}


def of_api(api: str) -> list[tuple[CallField, ApiField]]:
    """The fields ``api`` takes, each with its name and range there."""
    return [(f, f.apis[api]) for f in FIELDS if api in f.apis]


def recorded(values: Mapping[str, float]) -> dict[str, float]:
    """The ATDP columns of a call's ``values`` (missing ones: default)."""
    return {f.column: values.get(f.name, f.default) for f in FIELDS if f.column}


def penalizing() -> list[CallField]:
    """The fields whose setting makes a record's logprobs not the policy's."""
    return [f for f in FIELDS if f.logprobs == "penalized"]
