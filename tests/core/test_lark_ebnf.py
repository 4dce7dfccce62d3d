"""Lark and regex -> EBNF (core/lark_ebnf.py, core/regex_ebnf.py): the converted grammar
accepts and refuses the same strings as the original, checked by llguidance reading the
original Lark (an independent reader) and the EBNF the engines get; what the converter
cannot read is refused with a message that says why."""

from __future__ import annotations

import functools
import json
import re

import llguidance
import pytest
from llguidance.gbnf_to_lark import any_to_lark

from core.ebnf_budget import MAX_DEPTH, MAX_EBNF_CHARS, EbnfBudget, GrammarTooDeep, GrammarTooLarge
from core.lark_ebnf import GrammarSyntaxError, lark_to_ebnf
from core.regex_ebnf import regex_to_ebnf
from engine.model_files import PACKAGED_MODEL, resolve_model_dir
from tests.grammar_bombs import LARK_BOMBS, REGEX_BOMBS, nest
from tests.servers import MODEL_CACHE

# Codex CLI's apply_patch grammar (its shape: rules, alternation, literals, regex
# terminals, ?, +, an alias, %import common.LF)
APPLY_PATCH = r"""
start: begin_patch hunk+ end_patch
begin_patch: "*** Begin Patch" LF
end_patch: "*** End Patch" LF?

hunk: add_hunk | delete_hunk | update_hunk
add_hunk: "*** Add File: " filename LF add_line+
delete_hunk: "*** Delete File: " filename LF
update_hunk: "*** Update File: " filename LF change_move? change?

filename: /(.+)/
add_line: "+" /(.*)/ LF -> line

change_move: "*** Move to: " filename LF
change: (change_context | change_line)+ eof_line?
change_context: ("@@" | "@@ " /(.+)/) LF
change_line: ("+" | "-" | " ") /(.*)/ LF
eof_line: "*** End of File" LF

%import common.LF
"""
PATCH = (
    '*** Begin Patch\n*** Update File: a "b".py\n@@ def f():\n-    x = 1\n+    x = "2"\n'
    "*** End Patch\n"
)

NESTED = r"""
// recursion, *, [optional], ranges, a terminal built of terminals, common imports
start: expr
?expr: term (("+" | "-") term)*
term: NUMBER | "(" expr ")" | NAME ["!"]
NAME: ("a".."z")+ DIGIT?
%import common.NUMBER
%import common.DIGIT
"""


def _ebnf_accepts(ebnf: str, text: str) -> bool:
    """Whether llguidance, reading ``ebnf`` as the embedded engine does, accepts ``text``."""
    return _accepts(llguidance.LLMatcher.grammar_from_lark(any_to_lark(ebnf)), text)


def lark_accepts(lark: str, text: str) -> bool:
    """Whether llguidance, reading the Lark grammar itself, accepts ``text``."""
    return _accepts(llguidance.LLMatcher.grammar_from_lark(lark), text)


def _accepts(grammar: str, text: str) -> bool:
    m = llguidance.LLMatcher(_tokenizer(), grammar)
    ok = m.consume_tokens(_tokenizer().tokenize_str(text))
    return bool(ok) and not m.is_error() and m.is_accepting()


@functools.cache
def _tokenizer() -> llguidance.LLTokenizer:
    """The packaged model's tokenizer (any tokenizer would do: acceptance is per text)."""
    path = resolve_model_dir(PACKAGED_MODEL, MODEL_CACHE) / "tokenizer.json"
    return llguidance.LLTokenizer(str(path))


@pytest.mark.parametrize(
    ("lark", "good", "bad"),
    [
        (
            APPLY_PATCH,
            [PATCH, "*** Begin Patch\n*** Delete File: x\n*** End Patch"],
            [
                "*** Begin Patch\n*** End Patch\n",  # hunk+
                "*** Begin Patch\n*** Add File: x\n*** End Patch\n",  # add_line+
                PATCH + "more",
            ],
        ),
        (NESTED, ["1+(ab3-2.5)", "x!", "((7))"], ["1+", "A", "(1", "ab34"]),
    ],
)
def test_converted_grammar_matches_the_original(lark: str, good: list[str], bad: list[str]) -> None:
    ebnf = lark_to_ebnf(lark)
    for text in good:
        assert lark_accepts(lark, text), text
        assert _ebnf_accepts(ebnf, text), text
    for text in bad:
        assert not lark_accepts(lark, text), text
        assert not _ebnf_accepts(ebnf, text), text


@pytest.mark.parametrize(
    ("pattern", "good", "bad"),
    [
        (
            r"^(?P<month>January|May)\s+(?P<day>\d{1,2})(?:st|th)?$",
            ["May 1", "January  12th"],
            ["May", "June 1", "May 123"],
        ),
        (r'[0-9]{3}\n"[a-z]{2,5}"', ['123\n"abc"'], ['123 "abc"', '12\n"ab"', '123\n"a"']),
        (r"[^\]\\-]+\.x*?", ["ab.", "q.xx"], ["a].", "\\.", ".", "a-."]),
    ],
)
def test_regex_matches_like_python(pattern: str, good: list[str], bad: list[str]) -> None:
    ebnf = "root ::= " + regex_to_ebnf(pattern)
    for text in good:
        assert re.fullmatch(pattern, text), text
        assert _ebnf_accepts(ebnf, text), text
    for text in bad:
        assert not re.fullmatch(pattern, text), text
        assert not _ebnf_accepts(ebnf, text), text


@pytest.mark.parametrize(
    ("lark", "needle"),
    [
        ('start: "a"\n%ignore " "', "%ignore is not supported"),
        ('start: "a" b', "'b' is used but not defined"),
        ('start: "a" LF', "add %import common.LF"),
        ('x: "a"', "no 'start' rule"),
        ('start: "a"\nstart: "b"', "defined twice"),
        ('start: "a"i', "case-insensitive"),
        ("start: /a(?=b)/", "lookaround"),
        ("start: /a/m", "regex flags"),
        ("start: /(a)\\1/", "backreference"),
        ('start: "a"\n%import common.FLOAT', "common.FLOAT is not supported"),
        ('start: "a"\n%import other.X', "only %import common.NAME"),
        ('start: ("a"', "not closed"),
        ('start: "a" ~ 500', "repetition bound"),
    ],
)
def test_unsupported_lark_is_refused(lark: str, needle: str) -> None:
    with pytest.raises(GrammarSyntaxError) as e:
        lark_to_ebnf(lark)
    assert needle in str(e.value)


def test_output_is_plain_ebnf() -> None:
    """Rules and terminals in one namespace, every name defined, the root first."""
    ebnf = lark_to_ebnf(APPLY_PATCH)
    lines = ebnf.strip().splitlines()
    assert lines[0] == "root ::= r_start"
    defined = {line.split(" ::= ")[0] for line in lines}
    used = set(re.findall(r"\b[rt]_[a-z_0-9]+\b", re.sub(r'"(?:[^"\\]|\\.)*"', "", ebnf)))
    assert used <= defined and "t_lf" in defined
    assert json.dumps(ebnf)  # a plain string, sent as it is


# ---- budgets (core/ebnf_budget.py) ----------------------------------------------------


@pytest.mark.parametrize(
    ("lark", "bomb"),
    [(False, b) for b in REGEX_BOMBS] + [(True, b) for b in LARK_BOMBS],
)
def test_a_nesting_bomb_stops_at_the_budget(lark: bool, bomb: str) -> None:
    """Refused while it grows: the budget is charged before each string is built, so
    the conversion stops having built at most the budget (not the bomb)."""
    budget = EbnfBudget()
    with pytest.raises(GrammarTooLarge) as e:
        lark_to_ebnf(bomb, budget) if lark else regex_to_ebnf(bomb, budget=budget)
    assert f"more than {MAX_EBNF_CHARS} characters" in str(e.value)
    assert budget.spent <= MAX_EBNF_CHARS  # what was built; the charge past it never was


@pytest.mark.parametrize("lark", [False, True], ids=["regex", "lark"])
@pytest.mark.parametrize("depth", [400, 5000])
def test_a_deep_nest_is_refused_not_a_recursion_error(lark: bool, depth: int) -> None:
    """Depth 400 and 5000 were RecursionErrors (500s); the limit is checked on the way
    down, long before Python's stack."""
    with pytest.raises(GrammarTooDeep) as e:
        lark_to_ebnf(nest(depth, True)) if lark else regex_to_ebnf(nest(depth, False))
    assert f"more than {MAX_DEPTH} levels" in str(e.value)


def test_a_regex_terminal_nests_inside_its_lark_groups() -> None:
    half = MAX_DEPTH // 2 + 1
    regex = "(" * half + "a" + ")" * half
    assert lark_to_ebnf("start: /" + regex + "/")  # alone: within the limit
    with pytest.raises(GrammarTooDeep):
        lark_to_ebnf("start: " + "(" * half + "/" + regex + "/" + ")" * half)


def test_within_the_limits_all_is_converted() -> None:
    """The limits leave real grammars alone: depth at the limit, a list of up to 41
    words of up to 32 letters."""
    assert regex_to_ebnf(nest(MAX_DEPTH, False))
    assert len(regex_to_ebnf("([a-z_]{1,32}, ){0,40}[a-z_]{1,32}")) < MAX_EBNF_CHARS
    assert lark_to_ebnf(nest(MAX_DEPTH, True))


def test_unexpanded_a_bomb_is_only_read() -> None:
    """``expand=False`` (an offered tool's check): read and checked, nothing copied out;
    nesting is still limited."""
    budget = EbnfBudget(expand=False)
    assert len(regex_to_ebnf(REGEX_BOMBS[1], budget=budget)) < 100
    assert len(lark_to_ebnf(LARK_BOMBS[0], EbnfBudget(expand=False))) < 200
    with pytest.raises(GrammarTooDeep):
        regex_to_ebnf(nest(400, False), budget=EbnfBudget(expand=False))
