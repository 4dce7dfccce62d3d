"""Forced tool calls: ``tool_choice`` required or named (Chat Completions ``"required"`` /
``{"type": "function", "function": {"name"}}``, Responses ``"required"`` /
``{"type": "function", "name"}``, Anthropic ``{"type": "any"}`` / ``{"type": "tool"}``)
as a grammar the engine decodes under.

The grammar is SGLang's ``structural_tag`` (core/engine_protocol.py): one or more calls
of the offered tools (the named one only, when one is named), in the gateway's tool-call
format (gateway/call/parsing.py: the text the parser reads back and the template's tool
prompt shows), each call's arguments valid against that tool's own JSON schema (its
``$defs`` included), separated as the format separates calls, and nothing else. With
parallel calls off (Chat/Responses ``parallel_tool_calls: false``, Anthropic
``disable_parallel_tool_use``), or only one tool to call (one offered, or one named),
exactly one call: a grammar that allows another call after each one lets a model that was
never taught to stop (the packaged SmolLM2 is one) repeat the call until ``max_tokens``,
and clients such as pydantic-ai's structured output force a single tool. The engine
masks every other token, so the recorded logprobs are those of the masked distribution,
as for structured output.

A custom tool (Responses, gateway/call/custom_tools.py) is forced the same way, in its own
envelope, its input matching its grammar (or any text for a text format). A tool-call
format without a custom envelope (``llama3_json``) cannot force one: a 400. The forced
custom tools' grammars are converted to EBNF here, within one budget for the request
(core/ebnf_budget.py); ``tool_grammar`` is what the pipeline runs, on its render pool.

A forced call wins over structured output (``response_format``, ``text.format``,
``output_config.format``): those shape a text answer, and a forced turn has none.
"""

from __future__ import annotations

from typing import Any

from core import engine_protocol as proto
from core.ebnf_budget import EbnfBudget
from gateway.call.custom_tools import call_content, check_formats
from gateway.call.parsing import TOOL_PARSERS
from gateway.call.request import GenerationRequest, Tool
from gateway.edge.errors import bad_request


def is_forced(req: GenerationRequest) -> bool:
    """The answer must be tool calls: tools offered and a choice other than auto/none."""
    return bool(req.tools) and req.tool_choice not in ("auto", "none")


def _arguments_schema(tool: Tool) -> dict[str, Any]:
    """A tool's parameters as the arguments' schema; one without a ``type`` describes an
    object (the arguments are a JSON object in every tool-call format)."""
    schema = dict(tool.parameters)
    schema.setdefault("type", "object")
    return schema


def call_grammar(tools: list[Tool], parser: str, *, parallel: bool) -> str:
    """The ``structural_tag`` that admits only calls of ``tools`` in ``parser``'s format."""
    fmt = TOOL_PARSERS[parser]
    budget = EbnfBudget()  # the request's forced custom grammars, together
    tags = []
    for t in tools:
        if t.custom is None:
            begin, end = fmt.frame(t.name)
            tags.append(proto.Tag(begin, _arguments_schema(t), end))
            continue
        if fmt.custom_frame is None:
            raise bad_request(
                f"the gateway's tool-call format ({parser}) has no form for custom tool calls, "
                f"so it cannot force the custom tool '{t.name}'; use tool_choice 'auto'",
                "tool_choice",
            )
        begin, end = fmt.custom_frame(t.name)
        tags.append(proto.Tag(begin, {}, end, content=call_content(t, budget)))
    return proto.structural_tag(
        tags, fmt.separator, at_least_one=True, stop_after_first=not parallel
    )


def forced_grammar(req: GenerationRequest, parser: str | None) -> str | None:
    """The grammar of a request whose tool calls are forced, or None. A 400 when the
    gateway reads no tool calls (``RLGATE_TOOL_PARSER`` is empty): nothing could parse
    the calls it would force."""
    if not is_forced(req):
        return None
    if not parser:
        raise bad_request(
            "this gateway parses no tool calls (RLGATE_TOOL_PARSER is empty), so it cannot "
            "force one; use tool_choice 'auto' or 'none'",
            "tool_choice",
        )
    parallel = req.parallel_tool_calls and len(req.tools) > 1
    return call_grammar(req.tools, parser, parallel=parallel)


def tool_grammar(req: GenerationRequest, parser: str | None) -> str | None:
    """The request's custom tools' grammars checked (offered ones read, not converted),
    then ``forced_grammar``: the work a request's tools drive, bounded by the grammars'
    budgets; the pipeline runs it off the event loop."""
    check_formats(req.tools)
    return forced_grammar(req, parser)
