"""Checking and compiling the custom redaction patterns (settings ``redact_patterns``
and ``Project.settings["redaction"]["patterns"]``).

Patterns are data, never code: a pattern that can backtrack catastrophically, compile
huge, or match the empty string is refused with a :class:`RedactionConfigError` that
says what to change. The settings validate ``redact_patterns`` with
:func:`compile_patterns`; the redaction itself is gateway/recording/redaction.py.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

MAX_PATTERNS = 32
MAX_PATTERN_LEN = 500
MAX_REPEAT_BOUND = 1000


class RedactionConfigError(ValueError):
    """A redaction pattern that cannot be used; the message says which and why."""


# ---- validating patterns -------------------------------------------------------------


def _parse(pattern: str) -> Any:
    from re import _parser  # type: ignore[attr-defined]  # the stdlib's own parser (3.11+)

    return _parser.parse(pattern)


def _walk(sub: Any, outer_repeat: str | None, pattern: str) -> None:
    """Reject what can backtrack catastrophically or compile huge: a quantified group
    holding another quantifier or an alternation where either side is unbounded,
    backreferences, and repeat bounds over MAX_REPEAT_BOUND."""
    from re import _constants as c  # type: ignore[attr-defined]

    repeats = {c.MAX_REPEAT, c.MIN_REPEAT, getattr(c, "POSSESSIVE_REPEAT", c.MAX_REPEAT)}
    for op, av in sub:
        if op in repeats:
            lo, hi, body = av
            unbounded = hi == c.MAXREPEAT
            if lo > MAX_REPEAT_BOUND or (not unbounded and hi > MAX_REPEAT_BOUND):
                raise RedactionConfigError(
                    f"redaction pattern {pattern!r}: a repeat bound above "
                    f"{MAX_REPEAT_BOUND} is not allowed"
                )
            many = unbounded or hi > 1
            if many and outer_repeat is not None and (outer_repeat == "unbounded" or unbounded):
                raise RedactionConfigError(
                    f"redaction pattern {pattern!r}: a quantified group contains another "
                    "quantifier, which can backtrack catastrophically; rewrite it without "
                    "nesting (e.g. [a-z0-9.]+ instead of ([a-z0-9]+\\.)+)"
                )
            inner = ("unbounded" if unbounded else "bounded") if many else outer_repeat
            _walk(body, inner, pattern)
        elif op is c.BRANCH:
            if outer_repeat == "unbounded":
                raise RedactionConfigError(
                    f"redaction pattern {pattern!r}: an alternation inside an unbounded "
                    "repeat can backtrack catastrophically; use a character class or "
                    "separate patterns"
                )
            for branch in av[1]:
                _walk(branch, outer_repeat, pattern)
        elif op is c.SUBPATTERN:
            _walk(av[3], outer_repeat, pattern)
        elif op in (c.ASSERT, c.ASSERT_NOT):
            _walk(av[1], outer_repeat, pattern)
        elif op is getattr(c, "ATOMIC_GROUP", None):
            _walk(av, outer_repeat, pattern)
        elif op in (c.GROUPREF, c.GROUPREF_EXISTS):
            raise RedactionConfigError(
                f"redaction pattern {pattern!r}: backreferences are not allowed"
            )


def check_pattern(pattern: Any) -> re.Pattern[str]:
    """Compile one custom pattern or raise RedactionConfigError saying what to fix."""
    if not isinstance(pattern, str) or not pattern:
        raise RedactionConfigError(
            f"redaction pattern {pattern!r}: must be a non-empty string (a regular expression)"
        )
    if len(pattern) > MAX_PATTERN_LEN:
        raise RedactionConfigError(
            f"redaction pattern {pattern[:40]!r}...: longer than {MAX_PATTERN_LEN} characters"
        )
    try:
        compiled = re.compile(pattern)
        _walk(_parse(pattern), None, pattern)
    except re.error as e:
        raise RedactionConfigError(f"redaction pattern {pattern!r}: invalid regex: {e}") from None
    except RecursionError:
        raise RedactionConfigError(f"redaction pattern {pattern!r}: nested too deeply") from None
    if compiled.search("") is not None:
        raise RedactionConfigError(
            f"redaction pattern {pattern!r}: matches the empty string; it must match something"
        )
    return compiled


def compile_patterns(patterns: Iterable[Any]) -> tuple[re.Pattern[str], ...]:
    items = list(patterns)
    if len(items) > MAX_PATTERNS:
        raise RedactionConfigError(
            f"at most {MAX_PATTERNS} redaction patterns are allowed, not {len(items)}"
        )
    return tuple(check_pattern(p) for p in items)
