"""Grammar and regex nesting bombs and deep nests (issue 36, findings 1 and 5), shared by
the converters' unit tests (tests/core/test_lark_ebnf.py), the fast gateway tier
(tests/gateway/test_request_budgets.py) and the live stack on PostgreSQL
(tests/security/test_shared_stack.py).

Four nested ``{0,100}`` are about 7 * 10**6 characters when each bounded repeat is
copied out in full (the issue's probe: 15 s and 1.4 GB on the gateway's event loop
before the budget); one more level, 7 * 10**8. Nests 400 and 5000 deep were
``RecursionError`` s (500s).
"""

from __future__ import annotations

from core.ebnf_budget import MAX_DEPTH, MAX_EBNF_CHARS

REGEX_BOMB = "((((a{0,100}){0,100}){0,100}){0,100})"  # the 37 characters
REGEX_BOMBS = [REGEX_BOMB, "(((((a{0,100}){0,100}){0,100}){0,100}){0,100})"]
LARK_BOMB = 'start: (((("a" ~ 0..100) ~ 0..100) ~ 0..100) ~ 0..100)'
LARK_BOMBS = [
    LARK_BOMB,
    f"start: /{REGEX_BOMB}/",
    # no groups: stacked repeats multiply the same way
    'start: "a" ~ 0..100 ~ 0..100 ~ 0..100 ~ 0..100',
]


def nest(depth: int, lark: bool) -> str:
    """``depth`` nested groups around one ``a`` (a regex) or ``"a"`` (a Lark rule)."""
    inner = '"a"' if lark else "a"
    return ("start: " if lark else "") + "(" * depth + inner + ")" * depth


TOO_LARGE = f"more than {MAX_EBNF_CHARS} characters"
TOO_DEEP = f"more than {MAX_DEPTH} levels"

# name -> (syntax of a Responses custom tool, its definition, the limit its 400 names)
BOMBS: dict[str, tuple[str, str, str]] = {
    "regex-bomb": ("regex", REGEX_BOMB, TOO_LARGE),
    "lark-bomb": ("lark", LARK_BOMB, TOO_LARGE),
    "lark-regex-bomb": ("lark", f"start: /{REGEX_BOMB}/", TOO_LARGE),
    "regex-depth-400": ("regex", nest(400, False), TOO_DEEP),
    "regex-depth-5000": ("regex", nest(5000, False), TOO_DEEP),
    "lark-depth-400": ("lark", nest(400, True), TOO_DEEP),
    "lark-depth-5000": ("lark", nest(5000, True), TOO_DEEP),
}


def custom_tool_body(syntax: str, definition: str, forced: bool) -> dict[str, object]:
    """A Responses body offering (or forcing) one custom tool ``t`` with this grammar."""
    tool = {
        "type": "custom",
        "name": "t",
        "format": {"type": "grammar", "syntax": syntax, "definition": definition},
    }
    body: dict[str, object] = {"model": "m", "input": "hi", "tools": [tool], "max_output_tokens": 4}
    if forced:
        body["tool_choice"] = {"type": "custom", "name": "t"}
    return body
