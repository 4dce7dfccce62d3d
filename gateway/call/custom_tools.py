"""Responses ``custom`` tools: free-form text input, optionally in a grammar.

A request's tool ``{"type": "custom", "name", "description", "format"}``, with ``format``
``{"type": "text"}`` (the default) or ``{"type": "grammar", "syntax": "lark" | "regex",
"definition": "..."}``, becomes a :class:`~gateway.call.request.Tool` whose ``custom`` holds the
format and its grammar as EBNF (core/lark_ebnf.py, core/regex_ebnf.py): the one dialect
both engines read, so the same language is enforced on SGLang (xgrammar) and on the
embedded engine (llguidance). A definition outside the supported subset, or one that does
not parse, is a 400 naming ``tools[i].format.definition``.

How a custom call looks in the text (gateway/call/parsing.py ``HermesToolParser.custom_frame``):
the tool-call envelope with the name as an attribute and the input raw, never
JSON-escaped, so a grammar constrains the input itself (newlines and quotes included)::

    <tool_call name="apply_patch">
    *** Begin Patch
    ...
    </tool_call>

When a custom call is forced (gateway/call/forced_tools.py), the call's content is the
tool's grammar (``grammar`` in SGLang's ``structural_tag``), or any text up to the end of
the envelope for a text format (``any_text``).
"""

from __future__ import annotations

import re
from typing import Any

from core.ebnf_budget import EbnfBudget, GrammarSyntaxError
from core.lark_ebnf import lark_to_ebnf
from core.regex_ebnf import regex_to_ebnf
from gateway.call.request import CustomFormat, Tool
from gateway.edge.errors import bad_request

MAX_DEFINITION_CHARS = 100_000
SYNTAXES = ("lark", "regex")


def _format(fmt: Any, where: str) -> CustomFormat:
    """The format's shape checked; its grammar is read later (``check_formats``)."""
    if fmt is None:
        return CustomFormat()
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "grammar"):
        raise bad_request(
            f"{where}.type must be 'text' or 'grammar' (a format is {{'type': 'text'}} or "
            "{'type': 'grammar', 'syntax': 'lark' | 'regex', 'definition': '...'})",
            f"{where}.type",
        )
    if fmt["type"] == "text":
        return CustomFormat()
    syntax, definition = fmt.get("syntax"), fmt.get("definition")
    if syntax not in SYNTAXES:
        raise bad_request(
            f"{where}.syntax must be 'lark' or 'regex' (got {syntax!r})", f"{where}.syntax"
        )
    at = f"{where}.definition"
    if not isinstance(definition, str) or not definition.strip():
        raise bad_request(f"{at} must be a non-empty {syntax} grammar", at)
    if len(definition) > MAX_DEFINITION_CHARS:
        raise bad_request(f"{at} is longer than {MAX_DEFINITION_CHARS} characters", at)
    return CustomFormat(syntax=syntax, definition=definition, at=at)


def grammar_ebnf(fmt: CustomFormat, budget: EbnfBudget) -> str:
    """The EBNF of a grammar format, built within ``budget`` (with ``budget.expand`` off:
    only read and checked). A 400 naming ``fmt.at`` for a definition that cannot be used."""
    at = fmt.at
    try:
        if fmt.syntax == "lark":
            return lark_to_ebnf(fmt.definition, budget)
        ebnf = "root ::= " + regex_to_ebnf(fmt.definition, budget=budget) + "\n"
        # a regex Python cannot read is no regex at all (read after the converter, which
        # bounds its nesting: Python's parser recurses once per group)
        re.compile(fmt.definition)
        return ebnf
    except re.error as e:
        raise bad_request(f"{at} is not a valid regex: {e}", at) from None
    except GrammarSyntaxError as e:
        raise bad_request(
            f"{at} cannot be used: {e}. rlgate converts {fmt.syntax} grammars to EBNF for its "
            "engines and supports a subset (docs/gateway.md, 'Custom tools')",
            at,
        ) from None


def check_formats(tools: list[Tool]) -> None:
    """Every custom tool's grammar read and checked, not converted (a 400 naming the
    first that cannot be used). Linear in the definitions' length; run off the event
    loop (the pipeline's render pool)."""
    budget = EbnfBudget(expand=False)
    for t in tools:
        if t.custom is not None and t.custom.syntax != "text":
            budget.depth = 0
            grammar_ebnf(t.custom, budget)


def custom_tool(raw: dict[str, Any], where: str, check_name: Any) -> Tool:
    """A ``{"type": "custom"}`` tool, its name (``check_name(name, where)``) and format
    checked."""
    name = check_name(raw.get("name"), f"{where}.name")
    description = raw.get("description")
    if description is not None and not isinstance(description, str):
        raise bad_request(f"{where}.description must be a string", f"{where}.description")
    fmt = _format(raw.get("format"), f"{where}.format")
    return Tool(name, description or "", {}, custom=fmt)


def call_content(tool: Tool, budget: EbnfBudget) -> dict[str, Any]:
    """The content of a forced call of custom ``tool`` in SGLang's ``structural_tag``: its
    grammar converted within ``budget`` (one budget for a request's forced tools)."""
    assert tool.custom is not None
    if tool.custom.syntax == "text":
        return {"type": "any_text"}
    budget.depth = 0
    return {"type": "grammar", "grammar": grammar_ebnf(tool.custom, budget)}


def custom_names(tools: list[Tool]) -> frozenset[str]:
    """The names of the custom tools among ``tools`` (the parser reads calls of these in
    the custom envelope)."""
    return frozenset(t.name for t in tools if t.custom is not None)
