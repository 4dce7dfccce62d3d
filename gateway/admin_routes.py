"""The admin dashboard (``/admin``) and its JSON API (``/admin/api``).

Auth: an admin key logs in once (form); the browser then holds a signed session cookie
(``rlgate_admin``: HMAC-SHA256, HttpOnly, SameSite=Strict, Path=/admin, 12 h). The signing
secret is derived from ``RLGATE_ADMIN_KEY`` when set (every replica with the same key
accepts the same cookies), else read from ``<data_dir>/admin_secret`` (created once, 0600).
Every POST carries the session's CSRF token (hidden ``csrf`` form field, or the
``X-CSRF-Token`` header for the JSON API with a cookie); the JSON API also accepts an admin
key as ``Authorization: Bearer`` (no cookie, so no CSRF token needed).

Scope: the bootstrap admin (``RLGATE_ADMIN_KEY``) sees every project; an admin key
created for a project sees and acts on that project only.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import os
import secrets
import time
import urllib.parse
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from jinja2 import Environment, FileSystemLoader, select_autoescape

from gateway import admin_actions as actions
from gateway.admin import charts, queries
from gateway.admin_actions import ActionError
from gateway.auth import BOOTSTRAP_ADMIN_ID, Principal, presented_secret
from gateway.errors import APIError
from gateway.routing import gw_of
from schemas.tables import ApiKeyRow

router = APIRouter(include_in_schema=False)

HERE = Path(__file__).resolve().parent / "admin"
COOKIE = "rlgate_admin"
PRE_COOKIE = "rlgate_admin_login"
SESSION_TTL_S = 12 * 3600
CSP = (
    "default-src 'none'; style-src 'unsafe-inline'; script-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
RUN_LIVE = ("queued", "running")

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
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}g}" if abs(value) < 1e5 else f"{value:.3e}"
    return str(value)


def _dur(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def _tok_bg(p: float) -> str:
    return f"hsl({max(0.0, min(1.0, p)) * 120:.0f},75%,82%)"


def _qs(args: Any, **override: Any) -> str:
    merged = {k: v for k, v in dict(args).items() if v not in (None, "")}
    merged.update({k: str(v) for k, v in override.items()})
    return urllib.parse.urlencode(merged)


env.filters.update(when=_when, num=_num, dur=_dur, tokbg=_tok_bg)
env.globals["qs"] = _qs
env.globals["json_dumps"] = lambda v: json.dumps(queries.jsonable(v), indent=2, ensure_ascii=False)


# ---- session cookie -----------------------------------------------------------------

_secrets: dict[str, bytes] = {}


def signing_secret(request: Request) -> bytes:
    settings = gw_of(request).settings
    if settings.admin_key:
        raw = settings.admin_key.get_secret_value().encode()
        return hmac.new(b"rlgate-admin-session-v1", raw, hashlib.sha256).digest()
    path = Path(settings.data_dir) / "admin_secret"
    cached = _secrets.get(str(path))
    if cached:
        return cached
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        value = path.read_text().strip()
    else:
        value = secrets.token_hex(32)
        with os.fdopen(fd, "w") as fh:
            fh.write(value + "\n")
    if len(value) < 32:
        raise RuntimeError(f"{path} holds no usable secret; delete it to make a new one")
    _secrets[str(path)] = value.encode()
    return _secrets[str(path)]


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def sign(secret: bytes, payload: dict[str, Any]) -> str:
    body = _b64(json.dumps(payload, separators=(",", ":")).encode())
    mac = hmac.new(secret, body.encode(), hashlib.sha256).digest()
    return f"{body}.{_b64(mac)}"


def unsign(secret: bytes, value: str | None) -> dict[str, Any] | None:
    if not value or "." not in value:
        return None
    body, _, mac = value.partition(".")
    want = hmac.new(secret, body.encode(), hashlib.sha256).digest()
    try:
        if not hmac.compare_digest(_unb64(mac), want):
            return None
        payload = json.loads(_unb64(body))
    except (ValueError, TypeError):
        return None
    if not isinstance(payload, dict) or float(payload.get("exp", 0)) < time.time():
        return None
    return payload


def _secure(request: Request) -> bool:
    proto = request.headers.get("x-forwarded-proto") or request.url.scheme
    return proto == "https"


@dataclass(frozen=True)
class Ctx:
    principal: Principal
    csrf: str | None  # None: bearer-key API call (no cookie, no CSRF needed)

    @property
    def scope(self) -> list[str] | None:
        return None if self.principal.key_id == BOOTSTRAP_ADMIN_ID else [self.principal.project_id]

    @property
    def actor(self) -> str:
        return f"admin:{self.principal.key_id}"


def _still_valid(request: Request, payload: dict[str, Any]) -> Principal | None:
    gw = gw_of(request)
    key_id = str(payload.get("k", ""))
    if key_id == BOOTSTRAP_ADMIN_ID:
        if not gw.settings.admin_key:
            return None
        return Principal(BOOTSTRAP_ADMIN_ID, gw.settings.default_project, "admin")
    with gw.factory() as db:
        row = db.get(ApiKeyRow, key_id)
        if row is None or row.revoked_at is not None or row.kind != "admin":
            return None
        return Principal(row.id, row.project_id, "admin")


async def cookie_ctx(request: Request) -> Ctx | None:
    payload = unsign(signing_secret(request), request.cookies.get(COOKIE))
    if payload is None:
        return None
    p = await asyncio.to_thread(_still_valid, request, payload)
    return Ctx(p, str(payload["c"])) if p else None


async def api_ctx(request: Request, *, post: bool = False) -> Ctx:
    """Cookie (plus X-CSRF-Token on POST) or an admin bearer key; 401 / 403 otherwise."""
    secret = presented_secret(request)
    if secret:
        p = await asyncio.to_thread(gw_of(request).auth.resolve, secret)
        if p.kind != "admin":
            raise APIError(403, f"the admin API needs an admin key, not a {p.kind} key")
        return Ctx(p, None)
    ctx = await cookie_ctx(request)
    if ctx is None:
        raise APIError(401, "log in at /admin/login or send 'Authorization: Bearer <admin key>'")
    if post and not hmac.compare_digest(
        request.headers.get("x-csrf-token", "").encode(), (ctx.csrf or "").encode()
    ):
        raise APIError(403, "missing or wrong X-CSRF-Token header")
    return ctx


def _to_login(request: Request) -> RedirectResponse:
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse(
        "/admin/login?" + urllib.parse.urlencode({"next": target}), status_code=303
    )


async def page_ctx(request: Request) -> Ctx | Response:
    ctx = await cookie_ctx(request)
    return ctx if ctx is not None else _to_login(request)


async def read_form(request: Request) -> dict[str, str]:
    """An urlencoded form body (the dashboard's forms), parsed without python-multipart."""
    raw = await request.body()
    if len(raw) > 64 * 1024:
        raise APIError(413, "form too large")
    try:
        pairs = urllib.parse.parse_qsl(raw.decode(), keep_blank_values=True)
    except UnicodeDecodeError:
        raise APIError(400, "the form is not valid UTF-8") from None
    return dict(pairs)


async def form_ctx(request: Request) -> tuple[Ctx, dict[str, str]] | Response:
    """A POSTed dashboard form: logged-in session and a matching CSRF token."""
    ctx = await cookie_ctx(request)
    if ctx is None:
        return _to_login(request)
    form = await read_form(request)
    if not hmac.compare_digest(form.get("csrf", "").encode(), (ctx.csrf or "").encode()):
        return HTMLResponse(
            render(request, "error.html", None, message="CSRF token missing or wrong"), 403
        )
    return ctx, form


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


def _safe_next(target: str | None) -> str:
    if target and target.startswith("/admin") and not target.startswith("//"):
        return target
    return "/admin"


# ---- params -------------------------------------------------------------------------


def _int(request: Request, name: str, default: int, lo: int = 1, hi: int = 10**9) -> int:
    try:
        return max(lo, min(hi, int(request.query_params.get(name, default))))
    except ValueError:
        raise APIError(400, f"{name} must be an integer") from None


def _time(request: Request, name: str) -> datetime | None:
    raw = request.query_params.get(name)
    if not raw:
        return None
    try:
        t = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        raise APIError(400, f"{name} must be an ISO 8601 time, e.g. 2025-01-31T12:00") from None
    return t if t.tzinfo else t.replace(tzinfo=UTC)


def _q(request: Request, name: str) -> str | None:
    return request.query_params.get(name) or None


def _paging(request: Request) -> dict[str, int]:
    return {
        "page": _int(request, "page", 1),
        "size": _int(request, "page_size", queries.PAGE_SIZE, 1, queries.MAX_PAGE_SIZE),
    }


def _session_filters(request: Request) -> dict[str, Any]:
    return {
        "project": _q(request, "project"),
        "status": _q(request, "status"),
        "rated": _q(request, "rated"),
        "agent": _q(request, "agent"),
        "since": _time(request, "since"),
        "until": _time(request, "until"),
    }


def _feedback_filters(request: Request) -> dict[str, Any]:
    return {
        "project": _q(request, "project"),
        "source": _q(request, "source"),
        "target_type": _q(request, "target_type"),
        "session_id": _q(request, "session_id"),
        "since": _time(request, "since"),
        "until": _time(request, "until"),
    }


def _run_filters(request: Request) -> dict[str, Any]:
    return {
        "project": _q(request, "project"),
        "status": _q(request, "status"),
        "trigger": _q(request, "trigger"),
    }


def _key_filters(request: Request) -> dict[str, Any]:
    return {
        "project": _q(request, "project"),
        "kind": _q(request, "kind"),
        "include_revoked": request.query_params.get("revoked") in ("1", "true", "yes"),
        "include_session_keys": request.query_params.get("session_keys") in ("1", "true", "yes"),
    }


async def _db(request: Request, fn: Any, *args: Any, **kw: Any) -> Any:
    gw = gw_of(request)

    def work() -> Any:
        with gw.factory() as db:
            return fn(db, *args, **kw)

    return await asyncio.to_thread(work)


def _project_for(ctx: Ctx, project: str | None) -> str:
    project = project or ctx.principal.project_id
    if ctx.scope is not None and project not in ctx.scope:
        raise ActionError(404, f"no project {project!r}")
    return project


def _decoder(request: Request) -> Any:
    tok = getattr(gw_of(request), "tokenizer", None)
    return tok.decode if tok is not None else None


def _run_charts(run: dict[str, Any]) -> list[str]:
    steps = [str(s.get("step", i)) for i, s in enumerate(run["step_metrics"])]
    return [
        charts.line_chart(
            label, {key: run["series"][key]}, x_labels=steps or None, chart_id=f"chart-{key}"
        )
        for key, label in queries.STEP_METRICS
    ]


def _overview_charts(ov: dict[str, Any]) -> list[str]:
    s = ov["series"]
    return [
        charts.line_chart(
            "requests per hour",
            {"requests": s["requests"]},
            x_labels=s["labels"],
            chart_id="chart-requests",
        ),
        charts.line_chart(
            "mean reward (rated interactions)",
            {"mean reward": s["mean_reward"]},
            x_labels=s["labels"],
            chart_id="chart-reward",
        ),
        charts.line_chart(
            "feedback rate (rated / all)",
            {"rate": s["feedback_rate"]},
            x_labels=s["labels"],
            chart_id="chart-feedback-rate",
        ),
    ]


# ---- login / logout -----------------------------------------------------------------


@router.get("/admin/login")
async def login_page(request: Request) -> Response:
    token = secrets.token_urlsafe(24)
    secret = signing_secret(request)
    resp = html(
        render(request, "login.html", None, pre=token, next=_safe_next(_q(request, "next")))
    )
    resp.set_cookie(
        PRE_COOKIE,
        sign(secret, {"t": token, "exp": time.time() + 3600}),
        max_age=3600,
        httponly=True,
        samesite="strict",
        secure=_secure(request),
        path="/admin",
    )
    return resp


@router.post("/admin/login")
async def login(request: Request) -> Response:
    form = await read_form(request)
    secret = signing_secret(request)
    pre = unsign(secret, request.cookies.get(PRE_COOKIE))
    if pre is None or not hmac.compare_digest(
        form.get("csrf", "").encode(), str(pre.get("t", "")).encode()
    ):
        return html(render(request, "error.html", None, message="CSRF token missing or wrong"), 403)
    nxt = _safe_next(form.get("next"))

    def fail(message: str, status: int) -> Response:
        return html(
            render(request, "login.html", None, pre=pre["t"], next=nxt, error=message), status
        )

    key = form.get("key", "").strip()
    if not key:
        return fail("enter an admin key", 400)
    try:
        p = await asyncio.to_thread(gw_of(request).auth.resolve, key)
    except APIError:
        return fail("unknown or revoked key", 401)
    if p.kind != "admin":
        return fail(f"this is a {p.kind} key; the dashboard needs an admin key", 403)
    payload = {"k": p.key_id, "c": secrets.token_urlsafe(24), "exp": time.time() + SESSION_TTL_S}
    resp = RedirectResponse(nxt, status_code=303)
    resp.set_cookie(
        COOKIE,
        sign(secret, payload),
        max_age=SESSION_TTL_S,
        httponly=True,
        samesite="strict",
        secure=_secure(request),
        path="/admin",
    )
    resp.delete_cookie(PRE_COOKIE, path="/admin")
    return resp


@router.post("/admin/logout")
async def logout(request: Request) -> Response:
    got = await form_ctx(request)
    if isinstance(got, Response):
        return got
    resp = RedirectResponse("/admin/login", status_code=303)
    resp.delete_cookie(COOKIE, path="/admin")
    return resp


@router.get("/admin/static/{name}")
async def static(name: str) -> Response:
    path = HERE / "static" / name
    if "/" in name or name.startswith(".") or not path.is_file():
        raise APIError(404, "not found")
    kind = {"js": "text/javascript", "css": "text/css"}.get(path.suffix[1:], "text/plain")
    return Response(path.read_bytes(), media_type=kind, headers={"Cache-Control": "max-age=300"})


# ---- pages --------------------------------------------------------------------------


@router.get("/admin")
@router.get("/admin/")
async def overview_page(request: Request) -> Response:
    ctx = await page_ctx(request)
    if isinstance(ctx, Response):
        return ctx
    ov = await _db(request, queries.overview, ctx.scope)
    return html(render(request, "overview.html", ctx, ov=ov, charts=_overview_charts(ov)))


@router.get("/admin/sessions")
async def sessions_page(request: Request) -> Response:
    ctx = await page_ctx(request)
    if isinstance(ctx, Response):
        return ctx
    f = _session_filters(request)
    page = await _db(request, queries.sessions, ctx.scope, **f, **_paging(request))
    projects = await _db(request, queries.projects, ctx.scope)
    agents = await _db(request, queries.agents, ctx.scope)
    return html(
        render(
            request,
            "sessions.html",
            ctx,
            page=page,
            projects=projects,
            agents=agents,
            f=request.query_params,
        )
    )


@router.get("/admin/sessions/{session_id}")
async def session_page(session_id: str, request: Request) -> Response:
    ctx = await page_ctx(request)
    if isinstance(ctx, Response):
        return ctx
    detail = await _db(request, queries.session_detail, ctx.scope, session_id, _decoder(request))
    if detail is None:
        return html(render(request, "error.html", ctx, message=f"no session {session_id}"), 404)
    return html(render(request, "session.html", ctx, d=detail))


@router.get("/admin/feedback")
async def feedback_page(request: Request) -> Response:
    ctx = await page_ctx(request)
    if isinstance(ctx, Response):
        return ctx
    page = await _db(
        request, queries.feedback, ctx.scope, **_feedback_filters(request), **_paging(request)
    )
    projects = await _db(request, queries.projects, ctx.scope)
    return html(
        render(request, "feedback.html", ctx, page=page, projects=projects, f=request.query_params)
    )


@router.get("/admin/runs")
async def runs_page(request: Request) -> Response:
    ctx = await page_ctx(request)
    if isinstance(ctx, Response):
        return ctx
    page = await _db(request, queries.runs, ctx.scope, **_run_filters(request), **_paging(request))
    ov = await _db(request, queries.overview, ctx.scope, 1)
    return html(
        render(
            request, "runs.html", ctx, page=page, projects=ov["projects"], f=request.query_params
        )
    )


@router.get("/admin/runs/{run_id}")
async def run_page(run_id: str, request: Request) -> Response:
    ctx = await page_ctx(request)
    if isinstance(ctx, Response):
        return ctx
    run = await _db(request, queries.run_detail, ctx.scope, run_id, **_paging(request))
    if run is None:
        return html(render(request, "error.html", ctx, message=f"no run {run_id}"), 404)
    return html(
        render(
            request,
            "run.html",
            ctx,
            run=run,
            charts=_run_charts(run),
            live=run["status"] in RUN_LIVE,
        )
    )


@router.get("/admin/adapters")
async def adapters_page(request: Request) -> Response:
    ctx = await page_ctx(request)
    if isinstance(ctx, Response):
        return ctx
    items = await _db(request, queries.adapters, ctx.scope, project=_q(request, "project"))
    projects = await _db(request, queries.projects, ctx.scope)
    return html(
        render(
            request, "adapters.html", ctx, items=items, projects=projects, f=request.query_params
        )
    )


async def _keys_html(
    request: Request, ctx: Ctx, created: dict[str, Any] | None = None, status: int = 200
) -> Response:
    page = await _db(request, queries.keys, ctx.scope, **_key_filters(request), **_paging(request))
    projects = await _db(request, queries.projects, ctx.scope)
    return html(
        render(
            request,
            "keys.html",
            ctx,
            page=page,
            projects=projects,
            created=created,
            f=request.query_params,
        ),
        status,
    )


@router.get("/admin/keys")
async def keys_page(request: Request) -> Response:
    ctx = await page_ctx(request)
    if isinstance(ctx, Response):
        return ctx
    return await _keys_html(request, ctx)


# ---- actions (forms and JSON) -------------------------------------------------------

ACTIONS = ("train-now", "pause", "resume", "promote", "rollback", "retire")


def do_action(
    request: Request, ctx: Ctx, action: str, project: str | None, target: str | None
) -> dict[str, Any]:
    """Blocking; run in a thread."""
    gw = gw_of(request)
    if action not in ACTIONS:
        raise ActionError(404, f"unknown action {action!r}; one of {', '.join(ACTIONS)}")
    pid = _project_for(ctx, project)
    if action == "train-now":
        return actions.train_now(gw.factory, pid, ctx.actor)
    if action in ("pause", "resume"):
        return actions.set_paused(gw.factory, pid, action == "pause", ctx.actor)
    if action == "rollback":
        return actions.rollback(gw.factory, gw.settings, pid, ctx.actor, target or None)
    if not target:
        raise ActionError(400, f"{action} needs a target version (name, id or number)")
    if action == "promote":
        return actions.promote(gw.factory, gw.settings, pid, target, ctx.actor)
    return actions.retire(gw.factory, pid, target, ctx.actor)


def _back(form: dict[str, str], default: str, **q: str) -> RedirectResponse:
    target = _safe_next(form.get("next") or default)
    sep = "&" if "?" in target else "?"
    return RedirectResponse(target + sep + urllib.parse.urlencode(q), status_code=303)


@router.post("/admin/actions/{action}")
async def action_form(action: str, request: Request) -> Response:
    got = await form_ctx(request)
    if isinstance(got, Response):
        return got
    ctx, form = got
    try:
        result = await asyncio.to_thread(
            do_action, request, ctx, action, form.get("project_id"), form.get("target")
        )
    except ActionError as e:
        return _back(form, "/admin", err=e.message)
    if action == "train-now":
        return RedirectResponse(
            "/admin/runs/" + urllib.parse.quote(result["run_id"]) + "?msg=run+queued",
            status_code=303,
        )
    text = {
        "pause": "training paused",
        "resume": "training resumed",
        "retire": f"{result.get('name')} retired",
    }.get(action, f"{result.get('name')} is serving")
    return _back(form, "/admin", msg=text)


@router.post("/admin/keys")
async def key_create_form(request: Request) -> Response:
    got = await form_ctx(request)
    if isinstance(got, Response):
        return got
    ctx, form = got
    gw = gw_of(request)
    try:
        pid = _project_for(ctx, form.get("project_id"))
        created = await asyncio.to_thread(
            actions.new_key,
            gw.factory,
            pid,
            form.get("kind", "agent"),
            form.get("name"),
            ctx.actor,
        )
    except ActionError as e:
        return _back(form, "/admin/keys", err=e.message)
    return await _keys_html(request, ctx, created, 201)


@router.post("/admin/keys/{key_id}/revoke")
async def key_revoke_form(key_id: str, request: Request) -> Response:
    got = await form_ctx(request)
    if isinstance(got, Response):
        return got
    ctx, form = got
    gw = gw_of(request)
    try:
        await asyncio.to_thread(actions.drop_key, gw.factory, key_id, ctx.actor, ctx.scope)
    except ActionError as e:
        return _back(form, "/admin/keys", err=e.message)
    gw.auth.forget()
    return _back(form, "/admin/keys", msg=f"key {key_id} revoked")


# ---- JSON API -----------------------------------------------------------------------


def _api_error(e: ActionError) -> APIError:
    return APIError(e.status, e.message)


@router.get("/admin/api/overview")
async def api_overview(request: Request) -> JSONResponse:
    ctx = await api_ctx(request)
    hours = _int(request, "hours", 24, 1, 24 * 14)
    return JSONResponse(queries.jsonable(await _db(request, queries.overview, ctx.scope, hours)))


@router.get("/admin/api/sessions")
async def api_sessions(request: Request) -> JSONResponse:
    ctx = await api_ctx(request)
    page = await _db(
        request, queries.sessions, ctx.scope, **_session_filters(request), **_paging(request)
    )
    return JSONResponse(page.as_json())


@router.get("/admin/api/sessions/{session_id}")
async def api_session(session_id: str, request: Request) -> JSONResponse:
    ctx = await api_ctx(request)
    decode = _decoder(request) if request.query_params.get("tokens") in ("1", "true") else None
    detail = await _db(request, queries.session_detail, ctx.scope, session_id, decode)
    if detail is None:
        raise APIError(404, f"no session {session_id}")
    return JSONResponse(queries.jsonable(detail))


@router.get("/admin/api/feedback")
async def api_feedback(request: Request) -> JSONResponse:
    ctx = await api_ctx(request)
    page = await _db(
        request, queries.feedback, ctx.scope, **_feedback_filters(request), **_paging(request)
    )
    return JSONResponse(page.as_json())


@router.get("/admin/api/runs")
async def api_runs(request: Request) -> JSONResponse:
    ctx = await api_ctx(request)
    page = await _db(request, queries.runs, ctx.scope, **_run_filters(request), **_paging(request))
    return JSONResponse(page.as_json())


@router.get("/admin/api/runs/{run_id}")
async def api_run(run_id: str, request: Request) -> JSONResponse:
    ctx = await api_ctx(request)
    run = await _db(request, queries.run_detail, ctx.scope, run_id, **_paging(request))
    if run is None:
        raise APIError(404, f"no run {run_id}")
    run["samples"] = run["samples"].as_json()
    return JSONResponse(queries.jsonable(run))


@router.get("/admin/api/adapters")
async def api_adapters(request: Request) -> JSONResponse:
    ctx = await api_ctx(request)
    items = await _db(request, queries.adapters, ctx.scope, project=_q(request, "project"))
    return JSONResponse({"items": queries.jsonable(items)})


@router.get("/admin/api/keys")
async def api_keys(request: Request) -> JSONResponse:
    ctx = await api_ctx(request)
    page = await _db(request, queries.keys, ctx.scope, **_key_filters(request), **_paging(request))
    return JSONResponse(page.as_json())


async def _json_body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except ValueError:
        raise APIError(400, "the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object")
    return body


@router.post("/admin/api/keys")
async def api_key_create(request: Request) -> JSONResponse:
    ctx = await api_ctx(request, post=True)
    body = await _json_body(request)
    gw = gw_of(request)
    try:
        pid = _project_for(ctx, body.get("project_id"))
        created = await asyncio.to_thread(
            actions.new_key,
            gw.factory,
            pid,
            str(body.get("kind", "agent")),
            body.get("name"),
            ctx.actor,
        )
    except ActionError as e:
        raise _api_error(e) from None
    return JSONResponse(created, status_code=201)


@router.post("/admin/api/keys/{key_id}/revoke")
async def api_key_revoke(key_id: str, request: Request) -> JSONResponse:
    ctx = await api_ctx(request, post=True)
    gw = gw_of(request)
    try:
        out = await asyncio.to_thread(actions.drop_key, gw.factory, key_id, ctx.actor, ctx.scope)
    except ActionError as e:
        raise _api_error(e) from None
    gw.auth.forget()
    return JSONResponse(out)


@router.get("/admin/api/projects/{project_id}/training")
async def api_training_get(project_id: str, request: Request) -> JSONResponse:
    ctx = await api_ctx(request)
    try:
        pid = _project_for(ctx, project_id)
        out = await asyncio.to_thread(actions.training_settings, gw_of(request).factory, pid)
    except ActionError as e:
        raise _api_error(e) from None
    return JSONResponse(out)


@router.patch("/admin/api/projects/{project_id}/training")
async def api_training_patch(project_id: str, request: Request) -> JSONResponse:
    ctx = await api_ctx(request, post=True)
    body = await _json_body(request)
    try:
        pid = _project_for(ctx, project_id)
        out = await asyncio.to_thread(
            actions.update_training_settings, gw_of(request).factory, pid, body, ctx.actor
        )
    except ActionError as e:
        raise _api_error(e) from None
    return JSONResponse(out)


@router.post("/admin/api/actions/{action}")
async def api_action(action: str, request: Request) -> JSONResponse:
    ctx = await api_ctx(request, post=True)
    body = await _json_body(request)
    target = body.get("target")
    try:
        out = await asyncio.to_thread(
            do_action,
            request,
            ctx,
            action,
            body.get("project_id"),
            str(target) if target is not None else None,
        )
    except ActionError as e:
        raise _api_error(e) from None
    return JSONResponse(out, status_code=202 if action == "train-now" else 200)
