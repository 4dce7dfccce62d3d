"""What one grammar conversion may cost (core/regex_ebnf.py, core/lark_ebnf.py).

A bounded repeat (``{m,n}`` in a regex, ``~ m..n`` in Lark) is copied out in full, so
nested repeats multiply: n nested ``{0,100}`` would build about 7 * 10**(2n-2)
characters. The converters therefore spend an :class:`EbnfBudget` as they build: every
string they make (a repeat's copies, a sequence, an alternation, a group) is charged
before it is made, and a conversion that would build more than ``max_chars`` characters
in all stops with :class:`GrammarTooLarge`, before the string exists. The count is of
characters built, which bounds both the grammar's size and the work of making it.

Nesting (groups in a regex, groups and ``[...]`` in Lark, a regex terminal's groups
counted on top of the Lark group it sits in) deeper than ``max_depth`` is
:class:`GrammarTooDeep`: the converters recurse once per level, and Python's own regex
parser, which reads a regex first, overflows its stack at a few hundred levels.

With ``expand=False`` a repeat is not copied out: the grammar is read and checked (syntax,
depth), which costs time linear in its length. That is how an offered tool's grammar is
checked: only a forced call needs the EBNF (gateway/call/custom_tools.py).
"""

from __future__ import annotations

MAX_EBNF_CHARS = 200_000  # characters one conversion may build (all its strings)
MAX_DEPTH = 64  # nesting levels of groups


class GrammarSyntaxError(ValueError):
    """A grammar or regex this converter cannot read; the message says what and where."""


class GrammarTooLarge(GrammarSyntaxError):
    """The conversion would build more than its budget of characters."""


class GrammarTooDeep(GrammarSyntaxError):
    """The grammar nests deeper than the limit."""


class EbnfBudget:
    """The characters one conversion may still build and the nesting it is at."""

    def __init__(
        self, max_chars: int = MAX_EBNF_CHARS, max_depth: int = MAX_DEPTH, *, expand: bool = True
    ) -> None:
        self.max_chars = max_chars
        self.max_depth = max_depth
        self.expand = expand
        self.spent = 0
        self.depth = 0

    def spend(self, chars: int) -> None:
        """Charge ``chars`` characters about to be built; GrammarTooLarge past the budget
        (only when expanding: unexpanded, the strings are as long as the grammar's text)."""
        if self.expand and self.spent + chars > self.max_chars:
            raise GrammarTooLarge(
                f"it expands to more than {self.max_chars} characters of EBNF (bounded "
                "repeats such as {m,n} or ~ m..n are copied out, so nested repeats "
                "multiply); use smaller bounds or nest fewer repeats"
            )
        self.spent += chars  # what was built: never more than max_chars

    def enter(self) -> None:
        """One level deeper (a group opens); GrammarTooDeep past ``max_depth``."""
        self.depth += 1
        if self.depth > self.max_depth:
            raise GrammarTooDeep(f"it nests groups more than {self.max_depth} levels deep")

    def leave(self) -> None:
        self.depth -= 1

    def join(self, sep: str, parts: list[str]) -> str:
        """``sep.join(parts)``, charged first."""
        self.spend(sum(map(len, parts)) + len(sep) * max(len(parts) - 1, 0))
        return sep.join(parts)
