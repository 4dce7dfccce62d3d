"""SGLang's ``structural_tag`` sampling param, the subset rlgate sends, as an llguidance
Lark grammar.

SGLang 0.5.23 hands ``structural_tag`` to xgrammar (``compile_structural_tag``): a JSON
text ``{"type": "structural_tag", "format": F}``. The embedded engine accepts these
formats ``F`` (xgrammar's names and fields) and refuses any other with a message naming
them:

- ``{"type": "const_string", "value": s}``: exactly ``s``;
- ``{"type": "json_schema", "json_schema": schema}``: a JSON value valid against
  ``schema`` (its ``$defs`` stay its own: each schema is its own ``%json`` rule);
- ``{"type": "grammar", "grammar": ebnf}``: text of the EBNF (GBNF) grammar, which
  becomes its own llguidance subgrammar (its rule names stay its own);
- ``{"type": "any_text"}``, only as a tag's content: any text up to the first of the
  tag's ends (a custom tool's free-form input, gateway/call/custom_tools.py);
- ``{"type": "sequence", "elements": [F, ...]}`` and ``{"type": "or", "elements": [...]}``;
- ``{"type": "tag", "begin": s, "content": F, "end": s | [s, ...]}``;
- ``{"type": "tags_with_separator", "tags": [tag, ...], "separator": s,
  "at_least_one": bool, "stop_after_first": bool}``: tags separated by ``separator``
  and no other text (zero or more; one or more with ``at_least_one``; at most one with
  ``stop_after_first``).

The older shape (``structures`` + ``triggers``) cannot force anything and is refused.
"""

from __future__ import annotations

import json
from typing import Any

from llguidance.gbnf_to_lark import any_to_lark

SUPPORTED = (
    "const_string",
    "json_schema",
    "grammar",
    "any_text",
    "sequence",
    "or",
    "tag",
    "tags_with_separator",
)
_REGEX_SPECIAL = set("\\.^$|?*+()[]{}/-&~")


def _regex_literal(s: str) -> str:
    """``s`` matched literally inside a Lark ``/.../`` regex (llguidance's syntax)."""
    out = []
    for ch in s:
        if ch in _REGEX_SPECIAL:
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\r":
            out.append("\\r")
        else:
            out.append(ch)
    return "".join(out)


class StructuralTagError(ValueError):
    """A structural tag outside the supported subset, or malformed."""


def _lit(s: Any, where: str) -> str:
    if not isinstance(s, str):
        raise StructuralTagError(f"{where} must be a string")
    return json.dumps(s)  # a Lark string literal (JSON escapes)


def _elements(fmt: dict[str, Any], where: str) -> list[Any]:
    elements = fmt.get("elements")
    if not isinstance(elements, list) or not elements:
        raise StructuralTagError(f"{where}.elements must be a non-empty list")
    return elements


class _Lark:
    """Builds the rules of one grammar; each format becomes an expression."""

    def __init__(self) -> None:
        self.rules: list[str] = []
        self.subgrammars: list[str] = []  # Lark of each ``grammar`` format, named g0, g1...

    def rule(self, body: str) -> str:
        name = f"r{len(self.rules)}"
        self.rules.append(f"{name}: {body}")
        return name

    def tag(self, fmt: Any, where: str) -> str:
        if not isinstance(fmt, dict) or fmt.get("type", "tag") != "tag":
            raise StructuralTagError(f"{where} must be a tag")
        end = fmt.get("end")
        ends = end if isinstance(end, list) else [end]
        if not ends:
            raise StructuralTagError(f"{where}.end must be a string or a non-empty list")
        tail = " | ".join(_lit(e, f"{where}.end") for e in ends)
        begin = _lit(fmt.get("begin"), f"{where}.begin")
        body = fmt.get("content")
        if isinstance(body, dict) and body.get("type") == "any_text":
            # one lazy lexeme: any text, ended by the first end string
            for e in ends:
                _lit(e, f"{where}.end")
            alts = "|".join(_regex_literal(e) for e in ends)
            return self.rule(f"{begin} {self.rule_lazy(f'/(?s:.*)({alts})/')}")
        content = self.format(body, f"{where}.content")
        return self.rule(f"{begin} {content} ({tail})")

    def rule_lazy(self, body: str) -> str:
        name = f"r{len(self.rules)}"
        self.rules.append(f"{name}[lazy]: {body}")
        return name

    def format(self, fmt: Any, where: str) -> str:
        if not isinstance(fmt, dict):
            raise StructuralTagError(f"{where} must be an object with a 'type'")
        kind = fmt.get("type")
        if kind == "const_string":
            return _lit(fmt.get("value"), f"{where}.value")
        if kind == "json_schema":
            if fmt.get("style", "json") != "json":
                raise StructuralTagError(f"{where}.style must be 'json'")
            schema = fmt.get("json_schema", {})
            if schema is True:
                schema = {}
            if not isinstance(schema, dict):
                raise StructuralTagError(f"{where}.json_schema must be a JSON Schema object")
            return self.rule("%json " + json.dumps(schema))
        if kind == "grammar":
            ebnf = fmt.get("grammar")
            if not isinstance(ebnf, str) or not ebnf.strip():
                raise StructuralTagError(f"{where}.grammar must be a non-empty EBNF string")
            try:
                lark = any_to_lark(ebnf)
            except Exception as e:  # noqa: BLE001 - the converter's own errors vary
                raise StructuralTagError(f"{where}.grammar cannot be read: {e}") from None
            self.subgrammars.append(lark)
            return f"@g{len(self.subgrammars) - 1}"
        if kind == "any_text":
            raise StructuralTagError(f"{where}: any_text is supported only as a tag's content")
        if kind == "sequence":
            parts = [
                self.format(e, f"{where}.elements[{i}]")
                for i, e in enumerate(_elements(fmt, where))
            ]
            return self.rule(" ".join(parts))
        if kind == "or":
            parts = [
                self.format(e, f"{where}.elements[{i}]")
                for i, e in enumerate(_elements(fmt, where))
            ]
            return self.rule(" | ".join(parts))
        if kind == "tag":
            return self.tag(fmt, where)
        if kind == "tags_with_separator":
            tags = fmt.get("tags")
            if not isinstance(tags, list) or not tags:
                raise StructuralTagError(f"{where}.tags must be a non-empty list")
            one = self.rule(
                " | ".join(self.tag(t, f"{where}.tags[{i}]") for i, t in enumerate(tags))
            )
            sep = _lit(fmt.get("separator"), f"{where}.separator")
            body = one if fmt.get("stop_after_first") else f"{one} ({sep} {one})*"
            return self.rule(body if fmt.get("at_least_one") else f"({body})?")
        raise StructuralTagError(
            f"{where}.type {kind!r} is not supported by the embedded engine "
            f"(supported: {', '.join(SUPPORTED)})"
        )


def to_grammar(source: str) -> str:
    """The llguidance grammar (JSON: the main Lark grammar, ``%json`` for schemas, then
    one subgrammar per ``grammar`` format) of a structural tag."""
    try:
        tag = json.loads(source)
    except json.JSONDecodeError as e:
        raise StructuralTagError(f"structural_tag is not JSON: {e}") from None
    if not isinstance(tag, dict):
        raise StructuralTagError("structural_tag must be a JSON object")
    if "structures" in tag or "triggers" in tag:
        raise StructuralTagError(
            "the legacy structural_tag shape (structures + triggers) is not supported by the "
            "embedded engine; send {'type': 'structural_tag', 'format': {...}}"
        )
    if tag.get("type", "structural_tag") != "structural_tag" or "format" not in tag:
        raise StructuralTagError(
            "structural_tag must be {'type': 'structural_tag', 'format': {...}}"
        )
    lark = _Lark()
    top = lark.format(tag["format"], "format")
    main = "\n".join([f"start: {top}", *lark.rules]) + "\n"
    grammars = [{"lark_grammar": main}]
    grammars += [{"name": f"g{i}", "lark_grammar": g} for i, g in enumerate(lark.subgrammars)]
    return json.dumps({"grammars": grammars})
