"""A regular expression as an EBNF expression (the dialect both engines read: xgrammar's
EBNF in SGLang, GBNF converted to Lark in the embedded engine).

Supported: literals, ``.``, escapes (``\\n \\t \\r \\f \\v \\0 \\xHH \\uHHHH``, ``\\d \\w \\s``
and their negations, escaped punctuation), character classes with ranges and negation,
groups (plain, ``(?:...)``, named ``(?P<n>...)`` / ``(?<n>...)``), alternation, and the
quantifiers ``? * + {n} {n,} {n,m}`` (a lazy ``?`` suffix is accepted: it does not change
which strings match). A leading ``^`` and a trailing ``$`` are accepted (the whole input is
matched anyway). Anything else (anchors inside, backreferences, lookaround, word
boundaries, inline flags) is a :class:`GrammarSyntaxError` that names it.

What a conversion may build, and how deep it may nest, is its
:class:`~core.ebnf_budget.EbnfBudget`'s to say: past it, ``GrammarTooLarge`` or
``GrammarTooDeep`` (both GrammarSyntaxErrors), raised before the string is built.
"""

from __future__ import annotations

from core.ebnf_budget import EbnfBudget, GrammarSyntaxError

__all__ = ["GrammarSyntaxError", "regex_to_ebnf", "repeat"]

MAX_REPEAT = 100  # {n,m} is expanded; a larger bound is refused


_CLASS_ESC = {
    "d": "0-9",
    "w": "a-zA-Z0-9_",
    "s": " \\t\\n\\r\\x0c\\x0b",
}
_CHAR_ESC = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "0": "\0"}


def ebnf_string(s: str) -> str:
    """An EBNF string literal."""
    out = []
    for ch in s:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\r":
            out.append("\\r")
        elif ord(ch) < 0x20:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def class_char(ch: str) -> str:
    """One character inside an EBNF character class (``-`` and ``^`` as hex: GBNF readers
    take no other escape for them)."""
    if ch in "]\\[":
        return "\\" + ch
    if ch in "-^":
        return f"\\x{ord(ch):02x}"
    if ch == "\n":
        return "\\n"
    if ch == "\t":
        return "\\t"
    if ch == "\r":
        return "\\r"
    if ord(ch) < 0x20:
        return f"\\x{ord(ch):02x}"
    return ch


def repeat(atom: str, lo: int, hi: int | None, budget: EbnfBudget) -> str:
    """``atom`` repeated ``lo`` to ``hi`` (None: unbounded) times, expanded (its size
    charged to ``budget`` first; with ``budget.expand`` off, not expanded: the result
    then only stands for the repeat)."""
    if lo > MAX_REPEAT or (hi is not None and hi > MAX_REPEAT):
        raise GrammarSyntaxError(f"a repetition bound over {MAX_REPEAT} is not supported")
    if hi is not None and hi < lo:
        raise GrammarSyntaxError(f"a repetition {{{lo},{hi}}} has its bounds reversed")
    short = {(0, None): "*", (1, None): "+", (0, 1): "?"}.get((lo, hi))
    if short is not None or not budget.expand:
        budget.spend(len(atom) + 3)
        return f"({atom}){short or '*'}"
    copies = lo + (1 if hi is None else hi - lo)
    budget.spend(copies * (len(atom) + 4) + 2)
    parts = [atom] * lo
    if hi is None:
        parts.append(f"({atom})*")
    else:
        parts += [f"({atom})?"] * (hi - lo)
    return "(" + " ".join(parts) + ")" if parts else '""'


class _Regex:
    def __init__(self, src: str, dotall: bool, budget: EbnfBudget) -> None:
        self.s = src
        self.i = 0
        self.dotall = dotall
        self.budget = budget

    def fail(self, what: str) -> GrammarSyntaxError:
        return GrammarSyntaxError(f"{what} at position {self.i} of the regex is not supported")

    def peek(self) -> str:
        return self.s[self.i] if self.i < len(self.s) else ""

    def alt(self) -> str:
        parts = [self.concat()]
        while self.peek() == "|":
            self.i += 1
            parts.append(self.concat())
        return parts[0] if len(parts) == 1 else "(" + self.budget.join(" | ", parts) + ")"

    def concat(self) -> str:
        items: list[str] = []
        while self.peek() not in ("", "|", ")"):
            items.append(self.quantified())
        return self.budget.join(" ", items) if items else '""'

    def _int(self) -> int | None:
        start = self.i
        while self.peek().isdigit():
            self.i += 1
        return int(self.s[start : self.i]) if self.i > start else None

    def quantified(self) -> str:
        atom = self.atom()
        while True:
            ch = self.peek()
            if ch in ("*", "+", "?"):
                self.i += 1
                atom = repeat(atom, 0 if ch != "+" else 1, 1 if ch == "?" else None, self.budget)
            elif ch == "{" and self.i + 1 < len(self.s) and self.s[self.i + 1].isdigit():
                self.i += 1
                lo = self._int() or 0
                hi: int | None = lo
                if self.peek() == ",":
                    self.i += 1
                    hi = self._int()
                if self.peek() != "}":
                    raise self.fail("an unclosed {m,n}")
                self.i += 1
                atom = repeat(atom, lo, hi, self.budget)
            else:
                return atom
            if self.peek() == "?":  # lazy: the same strings match
                self.i += 1
            elif self.peek() == "+":
                raise self.fail("a possessive quantifier")

    def atom(self) -> str:
        ch = self.peek()
        self.i += 1
        if ch == "(":
            self.budget.enter()
            if self.s.startswith("?:", self.i):
                self.i += 2
            elif self.s.startswith("?P<", self.i) or (
                self.s.startswith("?<", self.i) and self.s[self.i + 2 : self.i + 3] not in "=!"
            ):
                close = self.s.find(">", self.i)
                if close < 0:
                    raise self.fail("an unclosed group name")
                self.i = close + 1
            elif self.peek() == "?":
                raise self.fail("a lookaround, inline flag or other (?...) group")
            inner = self.alt()
            if self.peek() != ")":
                raise self.fail("an unclosed group")
            self.i += 1
            self.budget.leave()
            self.budget.spend(len(inner) + 2)
            return f"({inner})"
        if ch == "[":
            return self.char_class()
        if ch == ".":
            return '([^\\n] | "\\n")' if self.dotall else "[^\\n]"
        if ch == "\\":
            return self.escape(in_class=False)
        if ch in ("^", "$"):
            raise self.fail(f"an anchor {ch!r} (allowed only at the very start or end)")
        if ch in ("*", "+", "?", "{"):
            raise self.fail(f"a quantifier {ch!r} with nothing to repeat")
        return ebnf_string(ch)

    def escape(self, in_class: bool) -> str:
        ch = self.peek()
        if not ch:
            raise self.fail("a trailing backslash")
        self.i += 1
        if ch in _CLASS_ESC:
            return _CLASS_ESC[ch] if in_class else f"[{_CLASS_ESC[ch]}]"
        if ch.upper() in _CLASS_ESC and ch.isupper():
            if in_class:
                raise self.fail(f"\\{ch} inside a character class")
            return f"[^{_CLASS_ESC[ch.lower()]}]"
        if ch in _CHAR_ESC:
            lit = _CHAR_ESC[ch]
        elif ch in ("x", "u"):
            width = 2 if ch == "x" else 4
            digits = self.s[self.i : self.i + width]
            try:
                lit = chr(int(digits, 16))
            except ValueError:
                raise self.fail(f"a malformed \\{ch} escape") from None
            self.i += width
        elif ch.isalnum():
            raise self.fail(f"the escape \\{ch} (a backreference, boundary or class)")
        else:
            lit = ch
        return class_char(lit) if in_class else ebnf_string(lit)

    def char_class(self) -> str:
        negate = self.peek() == "^"
        if negate:
            self.i += 1
        items: list[str] = []
        first = True
        while True:
            ch = self.peek()
            if not ch:
                raise self.fail("an unclosed character class")
            if ch == "]" and not first:
                self.i += 1
                break
            first = False
            self.i += 1
            item = self.escape(in_class=True) if ch == "\\" else class_char(ch)
            if self.peek() == "-" and self.s[self.i + 1 : self.i + 2] not in ("]", ""):
                self.i += 1
                hi_ch = self.peek()
                self.i += 1
                hi = self.escape(in_class=True) if hi_ch == "\\" else class_char(hi_ch)
                item = f"{item}-{hi}"
            items.append(item)
        return "[" + ("^" if negate else "") + "".join(items) + "]"


def regex_to_ebnf(
    pattern: str,
    *,
    dotall: bool = False,
    whole: bool = True,
    budget: EbnfBudget | None = None,
) -> str:
    """The EBNF expression of ``pattern``, built within ``budget`` (a fresh one: the
    default limits). With ``whole`` (a pattern that is the whole input), a leading ``^``
    and trailing ``$`` are dropped."""
    if whole:
        if pattern.startswith("^"):
            pattern = pattern[1:]
        if pattern.endswith("$") and not pattern.endswith("\\$"):
            pattern = pattern[:-1]
    r = _Regex(pattern, dotall, budget or EbnfBudget())
    out = r.alt()
    if r.i != len(pattern):
        raise r.fail(f"an unmatched {r.peek()!r}")
    return out
