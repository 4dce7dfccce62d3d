"""A Lark grammar (the subset custom tools use) as EBNF, the grammar dialect both engines
read: SGLang's xgrammar EBNF, and GBNF that the embedded engine converts to llguidance's
Lark. The gateway sends every custom-tool grammar this way (gateway/call/custom_tools.py).

The subset: rules (``name: ...``, with ``?``/``!`` prefixes) and terminals (``NAME: ...``,
a ``.priority`` is ignored), continuation lines starting with ``|``, alternation, string
literals (``"..."``, and ``"a".."z"`` ranges), regex terminals (``/.../``, flag ``s``;
the regex subset is core/regex_ebnf.py's), groups, ``[...]`` (optional), ``? * +``,
``~ n`` / ``~ n..m``, aliases (``-> name``, ignored), recursion, ``//`` comments, and
``%import common.NAME`` (``-> ALIAS`` too) for common.lark's DIGIT, HEXDIGIT, INT,
SIGNED_INT, DECIMAL, NUMBER, SIGNED_NUMBER, LCASE_LETTER, UCASE_LETTER, LETTER, WORD, CNAME,
WS_INLINE, WS, CR, LF, NEWLINE, ESCAPED_STRING. The grammar is read as a context-free
grammar over characters, as llguidance reads Lark: Lark's lexer priorities do not apply.
Refused with a :class:`GrammarSyntaxError` that says why: ``%ignore`` (it would let
whitespace in anywhere), ``%declare``/``%override``/``%extend``, other imports, templates,
the ``i`` flag, a missing ``start`` rule, a name used and never defined.

The conversion is built within an :class:`~core.ebnf_budget.EbnfBudget` (characters built,
nesting depth; a regex terminal's groups count on top of the Lark groups around it).
"""

from __future__ import annotations

import re

from core.ebnf_budget import EbnfBudget, GrammarSyntaxError
from core.regex_ebnf import class_char, ebnf_string, regex_to_ebnf, repeat

__all__ = ["GrammarSyntaxError", "lark_to_ebnf"]

COMMON = {
    "DIGIT": '"0".."9"',
    "HEXDIGIT": '"a".."f" | "A".."F" | DIGIT',
    "INT": "DIGIT+",
    "SIGNED_INT": '["+"|"-"] INT',
    "DECIMAL": 'INT "." INT? | "." INT',
    "NUMBER": "DECIMAL | INT",
    "SIGNED_NUMBER": '["+"|"-"] NUMBER',
    "LCASE_LETTER": '"a".."z"',
    "UCASE_LETTER": '"A".."Z"',
    "LETTER": "UCASE_LETTER | LCASE_LETTER",
    "WORD": "LETTER+",
    "CNAME": '("_"|LETTER) ("_"|LETTER|DIGIT)*',
    "WS_INLINE": '(" "|/\\t/)+',
    "WS": "/[ \\t\\f\\r\\n]/+",
    "CR": "/\\r/",
    "LF": "/\\n/",
    "NEWLINE": "(CR? LF)+",
    "ESCAPED_STRING": '"\\"" /([^"\\\\]|\\\\.)*/ "\\""',
}

_HEAD = re.compile(r"^([?!]?)([A-Za-z_][A-Za-z0-9_]*)(\.-?\d+)?\s*:(.*)$", re.S)
_TOKEN = re.compile(
    r"""\s*(?:
    (?P<str>"(?:[^"\\\n]|\\.)*"i?)
  | (?P<re>/(?:[^/\\\n]|\\.)+/[a-z]*)
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<op>->|\.\.|[()\[\]|?*+~])
  | (?P<num>\d+)
  | (?P<bad>\S)
)""",
    re.X,
)


def _statements(text: str) -> list[str]:
    """Definitions and directives: a line starting in column 0 opens one; indented lines
    continue it. ``//`` comments outside strings and regexes are dropped."""
    out: list[str] = []
    for line in text.splitlines():
        line = _strip_comment(line)
        if not line.strip():
            continue
        if line[0].isspace() and out:
            out[-1] += "\n" + line
        else:
            out.append(line.strip())
    return out


def _strip_comment(line: str) -> str:
    i, quote = 0, ""
    while i < len(line):
        ch = line[i]
        if quote:
            if ch == "\\":
                i += 2
                continue
            if ch == quote:
                quote = ""
        elif ch in '"/' and not line.startswith("//", i):
            quote = ch
        elif line.startswith("//", i):
            return line[:i]
        i += 1
    return line


def _string(tok: str) -> str:
    if tok.endswith("i"):
        raise GrammarSyntaxError(f"the case-insensitive flag on {tok} is not supported")
    body = tok[1:-1]
    try:
        value = body.encode("latin-1", "backslashreplace").decode("unicode_escape")
    except UnicodeDecodeError:
        raise GrammarSyntaxError(f"the string {tok} has a malformed escape") from None
    return value


class _Body:
    """One definition's right-hand side, tokenized and parsed to an EBNF expression."""

    def __init__(self, text: str, where: str, names: set[str], budget: EbnfBudget) -> None:
        self.toks: list[tuple[str, str]] = []
        for m in _TOKEN.finditer(text):
            kind = m.lastgroup or ""
            if kind == "bad":
                raise GrammarSyntaxError(f"{where}: unexpected {m.group(kind)!r}")
            self.toks.append((kind, m.group(kind)))
        self.i = 0
        self.where = where
        self.names = names  # every name used, to check each is defined
        self.budget = budget

    def peek(self) -> tuple[str, str]:
        return self.toks[self.i] if self.i < len(self.toks) else ("", "")

    def take(self) -> tuple[str, str]:
        tok = self.peek()
        self.i += 1
        return tok

    def parse(self) -> str:
        out = self.alternatives()
        if self.i != len(self.toks):
            raise GrammarSyntaxError(f"{self.where}: unexpected {self.peek()[1]!r}")
        return out

    def alternatives(self) -> str:
        parts = [self.sequence()]
        while self.peek() == ("op", "|"):
            self.i += 1
            parts.append(self.sequence())
        return parts[0] if len(parts) == 1 else "(" + self.budget.join(" | ", parts) + ")"

    def sequence(self) -> str:
        items: list[str] = []
        while self.peek()[0] and self.peek()[1] not in ("|", ")", "]"):
            if self.peek() == ("op", "->"):
                self.i += 1
                if self.take()[0] != "name":
                    raise GrammarSyntaxError(f"{self.where}: '->' must be followed by a name")
                continue
            items.append(self.quantified())
        return self.budget.join(" ", items) if items else '""'

    def quantified(self) -> str:
        atom = self.atom()
        while True:
            kind, tok = self.peek()
            if kind == "op" and tok in "?*+":
                self.i += 1
                atom = repeat(atom, 1 if tok == "+" else 0, 1 if tok == "?" else None, self.budget)
            elif (kind, tok) == ("op", "~"):
                self.i += 1
                lo = self._num()
                hi = lo
                if self.peek() == ("op", ".."):
                    self.i += 1
                    hi = self._num()
                atom = repeat(atom, lo, hi, self.budget)
            else:
                return atom

    def _num(self) -> int:
        kind, tok = self.take()
        if kind != "num":
            raise GrammarSyntaxError(f"{self.where}: '~' must be followed by a number")
        return int(tok)

    def atom(self) -> str:
        kind, tok = self.take()
        if kind == "op" and tok in "([":
            self.budget.enter()
            inner = self.alternatives()
            close = ")" if tok == "(" else "]"
            if self.take() != ("op", close):
                raise GrammarSyntaxError(f"{self.where}: a '{tok}' is not closed")
            self.budget.leave()
            self.budget.spend(len(inner) + 3)
            return f"({inner})" if tok == "(" else f"({inner})?"
        if kind == "str":
            value = _string(tok)
            if self.peek() == ("op", ".."):
                self.i += 1
                kind2, tok2 = self.take()
                hi = _string(tok2) if kind2 == "str" else ""
                if len(value) != 1 or len(hi) != 1:
                    raise GrammarSyntaxError(f"{self.where}: a range needs two 1-character strings")
                return "[" + class_char(value) + "-" + class_char(hi) + "]"
            return ebnf_string(value)
        if kind == "re":
            pattern, flags = tok[1:].rsplit("/", 1)
            if set(flags) - {"s"}:
                raise GrammarSyntaxError(
                    f"{self.where}: regex flags {flags!r} are not supported (only 's')"
                )
            try:
                inner = regex_to_ebnf(pattern, dotall="s" in flags, whole=False, budget=self.budget)
                self.budget.spend(len(inner) + 2)
                return "(" + inner + ")"
            except GrammarSyntaxError as e:
                raise type(e)(f"{self.where}: /{pattern}/: {e}") from None
        if kind == "name":
            if self.peek() == ("op", "{"):
                raise GrammarSyntaxError(f"{self.where}: templates are not supported")
            self.names.add(tok)
            return _rule_name(tok)
        raise GrammarSyntaxError(f"{self.where}: unexpected {tok or 'end of definition'!r}")


def _rule_name(name: str) -> str:
    """Rules and terminals live in one namespace in EBNF: ``foo`` -> ``r_foo``,
    ``FOO`` -> ``t_foo``."""
    return ("t_" + name.lower()) if name.isupper() else ("r_" + name)


def _imports(stmt: str) -> dict[str, str]:
    """``%import common.NAME [-> ALIAS]`` and ``%import common (A, B)``: name -> source."""
    m = re.fullmatch(r"%import\s+common\.(\w+)(?:\s*->\s*(\w+))?", stmt)
    if m:
        names = [(m.group(1), m.group(2) or m.group(1))]
    else:
        m = re.fullmatch(r"%import\s+common\s*\(([\w\s,]+)\)", stmt)
        if not m:
            raise GrammarSyntaxError(
                f"{stmt.split(chr(10))[0]!r}: only %import common.NAME is supported"
            )
        names = [(n.strip(), n.strip()) for n in m.group(1).split(",") if n.strip()]
    out = {}
    for name, alias in names:
        if name not in COMMON:
            raise GrammarSyntaxError(
                f"%import common.{name} is not supported (supported: {', '.join(COMMON)})"
            )
        out[alias] = COMMON[name]
        deps = [name]
        while deps:  # what it is built of, by their own names
            for dep in re.findall(r"[A-Z_]+", COMMON[deps.pop()]):
                if dep in COMMON and dep not in out:
                    out[dep] = COMMON[dep]
                    deps.append(dep)
    return out


def lark_to_ebnf(text: str, budget: EbnfBudget | None = None) -> str:
    """The EBNF grammar (``root ::= ...``) of the Lark grammar ``text``, built within
    ``budget`` (a fresh one: the default limits)."""
    budget = budget or EbnfBudget()
    sources: dict[str, str] = {}
    defined: set[str] = set()
    for stmt in _statements(text):
        if stmt.startswith("%"):
            word = stmt.split()[0]
            if word != "%import":
                raise GrammarSyntaxError(
                    f"{word} is not supported"
                    + (" (it would allow whitespace anywhere)" if word == "%ignore" else "")
                )
            for name, src in _imports(stmt).items():
                sources.setdefault(name, src)
            continue
        m = _HEAD.match(stmt)
        if not m:
            raise GrammarSyntaxError(f"cannot read the definition {stmt.split(chr(10))[0]!r}")
        name = m.group(2)
        if name in defined:
            raise GrammarSyntaxError(f"'{name}' is defined twice")
        defined.add(name)
        sources[name] = m.group(4)
    if "start" not in sources:
        raise GrammarSyntaxError("the grammar has no 'start' rule")
    rules: dict[str, str] = {}
    pending = ["start"]
    while pending:  # only what start reaches, common terminals included on use
        name = pending.pop()
        if name in rules:
            continue
        if name not in sources:
            missing = f"'{name}' is used but not defined"
            hint = " (add %import common." + name + ")" if name in COMMON else ""
            raise GrammarSyntaxError(missing + hint)
        names: set[str] = set()
        rules[name] = _Body(sources[name], f"'{name}'", names, budget).parse()
        pending += sorted(names - set(rules))
    lines = ["root ::= r_start"]
    lines += [f"{_rule_name(n)} ::= {body}" for n, body in rules.items()]
    return budget.join("\n", lines) + "\n"
