"""Server-side rendering of the dashboard: the Jinja environment and the page response."""

from __future__ import annotations

import json
import urllib.parse
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fastapi import Request
from fastapi.responses import HTMLResponse
from jinja2 import Environment, FileSystemLoader, select_autoescape

from gateway.admin import queries
from gateway.admin.auth import Ctx
from schemas.atdp import (
    FeedbackSource,
    FeedbackTarget,
    KeyKind,
    PolicyStatus,
    RunStatus,
    RunTrigger,
    SessionStatus,
)

HERE = Path(__file__).resolve().parent
CSP = (
    "default-src 'none'; style-src 'unsafe-inline'; script-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)

env = Environment(
    loader=FileSystemLoader(str(HERE / "templates")),
    autoescape=select_autoescape(["html"]),
    trim_blocks=True,
    lstrip_blocks=True,
)


def _when(value: Any) -> str:
    if not isinstance(value, datetime):
        return "" if value is None else str(value)
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def _num(value: Any, digits: int = 3) -> str:
    """``digits`` significant digits; no exponent between 1e-4 and 1e9 (a latency of
    5240.3 ms is ``5240``, not ``5.24e+03``)."""
    if value is None:
        return "–"
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return str(value)
        size = abs(value)
        if size >= 1e9 or (0 < size < 1e-4):
            return f"{value:.{max(digits - 1, 0)}e}"
        if size >= 10 ** (digits - 1):  # as many digits as the integer part has
            return f"{value:.0f}"
        return f"{value:.{digits}g}"
    return str(value)


def _plural(n: Any, word: str, many: str | None = None) -> str:
    """``1 interaction``, ``2 interactions`` (``many``: an irregular plural)."""
    count = len(n) if isinstance(n, list | tuple | dict) else n
    return f"{count} {word if count == 1 else (many or word + 's')}"


def _dur(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


_UP = ("up", "thumbs_up", "true", "1")


def _rating(value: Any, scale: str | None) -> str:
    """A rating's value as sent, a binary one as ``up`` or ``down`` (stored as the bool the
    client's true/1/"up" or false/0/-1/"down" became: gateway/routes/feedback.py)."""
    if scale != "binary":
        return _num(value)
    if isinstance(value, str):
        return "up" if value.strip().lower() in _UP else "down"
    return "up" if value is True or value == 1 else "down"


def _tok_bg(p: float) -> str:
    return f"hsl({max(0.0, min(1.0, p)) * 120:.0f},75%,82%)"


def _qs(args: Any, **override: Any) -> str:
    merged = {k: v for k, v in dict(args).items() if v not in (None, "")}
    merged.update({k: str(v) for k, v in override.items()})
    return urllib.parse.urlencode(merged)


env.filters.update(when=_when, num=_num, dur=_dur, tokbg=_tok_bg, plural=_plural, rating=_rating)
# the binary scale's mapping, said where ratings are listed (gateway/routes/feedback.py normalize)
env.globals["binary_note"] = (
    'binary ratings show as up or down: up (true, 1, "up") is reward 1, down (false, 0, -1, '
    '"down") is reward -1, since rewards run from -1 to 1: a thumbs-down steers away from '
    "that answer rather than just not rewarding it"
)
env.globals["qs"] = _qs
# the list filters' choices, from the enums the rows hold (schemas/atdp.py), never retyped
env.globals["choices"] = {
    e.__name__: [m.value for m in e]
    for e in (FeedbackSource, FeedbackTarget, KeyKind, RunStatus, RunTrigger, SessionStatus)
}
# each status's badge colour, by what it tells an operator; every member of the status enums
# has one (tests/admin/test_render_filters.py)
TONES: dict[str, str] = {
    **dict.fromkeys((PolicyStatus.serving, RunStatus.published, SessionStatus.open), "good"),
    **dict.fromkeys((PolicyStatus.candidate, RunStatus.queued, RunStatus.running), "busy"),
    **dict.fromkeys((PolicyStatus.rejected, RunStatus.failed), "bad"),
    RunStatus.trained_not_published: "warn",
    **dict.fromkeys(
        (PolicyStatus.retired, RunStatus.cancelled, SessionStatus.closed, SessionStatus.expired),
        "done",
    ),
}
env.globals["tone"] = lambda status: TONES.get(status, "done")
env.globals["json_dumps"] = lambda v: json.dumps(queries.jsonable(v), indent=2, ensure_ascii=False)


def render(request: Request, template: str, ctx: Ctx | None, **values: Any) -> str:
    return env.get_template(template).render(
        request=request,
        csrf=ctx.csrf if ctx else None,
        who=ctx.principal if ctx else None,
        msg=request.query_params.get("msg"),
        err=request.query_params.get("err"),
        **values,
    )


def html(content: str, status: int = 200) -> HTMLResponse:
    """A page with the dashboard's security headers (CSP, no framing, no caching)."""
    return HTMLResponse(
        content,
        status,
        headers={
            "Content-Security-Policy": CSP,
            "X-Frame-Options": "DENY",
            "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "same-origin",
            "Cache-Control": "no-store",
        },
    )
