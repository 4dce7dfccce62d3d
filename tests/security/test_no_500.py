"""Issue 26, finding 6: no input gets a 500. On PostgreSQL a NUL character or a lone
UTF-16 surrogate cannot be stored, and used to reach the database from the admin API's
bodies and from ids in URL paths; deeply nested JSON in an admin body raised a
RecursionError. Now the admin API checks its JSON bodies as the client APIs do
(gateway/edge/storable.py: a 400 naming the field) and a NUL in a URL path or query string
is refused before any route runs (gateway/edge/body_limit.py: 404 for a path, since no id holds
a NUL; 400 naming the query parameter).

A gateway on PostgreSQL (served in this process) in front of a fake engine
(tests/gateway/fake_engine.py: no call here reaches an engine; what is tested is what the
gateway answers before one would), the bootstrap admin key (it may act on any project, so
every value reaches the database) and agent keys.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import pytest
from sqlalchemy import func, select

from schemas.tables import ApiKeyRow
from tests.gateway.conftest import session_pg_url  # noqa: F401
from tests.gateway.fake_engine import FakeEngine, serving
from tests.security.live import Live, pg_gateway

ADMIN = "bootstrap-admin-key-" + "n" * 32
NUL = "a\\u0000b"  # JSON escapes, as a client sends them
SURROGATE = "a\\ud800b"
DEEP = 100_000


@pytest.fixture(scope="module")
def live(session_pg_url, tmp_path_factory) -> Iterator[Live]:  # noqa: F811
    with (
        serving(FakeEngine().app()) as engine_url,
        pg_gateway(
            tmp_path_factory.mktemp("no-500"), session_pg_url, engine_url, admin_key=ADMIN
        ) as gw,
    ):
        gw.key("admin", "p1")  # the project the routes name
        yield gw


def _admin_call(live: Live, method: str, path: str, raw: str) -> httpx.Response:
    return httpx.request(
        method,
        live.url + path,
        content=raw.encode(),
        headers={"Authorization": f"Bearer {ADMIN}", "Content-Type": "application/json"},
        timeout=60,
    )


# (method, path, JSON text with a {bad} placeholder for a string value)
ADMIN_BODIES = [
    ("PUT", "/admin/api/projects/p1/verifiers", '{"verifiers": [{"name": "{bad}"}]}'),
    (
        "PUT",
        "/admin/api/projects/p1/verifiers",
        '{"verifiers": [{"name": "contains", "params": {"text": "{bad}"}}]}',
    ),
    (
        "PUT",
        "/admin/api/projects/p1/verifiers",
        '{"verifiers": [{"name": "contains", "{bad}": 1}]}',
    ),
    ("POST", "/admin/api/keys", '{"project_id": "{bad}", "kind": "agent"}'),
    ("POST", "/admin/api/keys", '{"project_id": "p1", "kind": "agent", "name": "{bad}"}'),
    ("POST", "/admin/api/actions/pause", '{"project_id": "{bad}"}'),
    ("POST", "/admin/api/actions/train-now", '{"project_id": "{bad}"}'),
    ("POST", "/admin/api/actions/promote", '{"project_id": "p1", "target": "{bad}"}'),
    ("POST", "/admin/api/actions/rollback", '{"project_id": "p1", "target": "{bad}"}'),
    ("PATCH", "/admin/api/projects/p1/training", '{"lr": "{bad}"}'),
    ("PATCH", "/admin/api/projects/p1/training", '{"{bad}": 1}'),
]


@pytest.mark.parametrize("bad", [NUL, SURROGATE], ids=["nul", "surrogate"])
@pytest.mark.parametrize(("method", "path", "template"), ADMIN_BODIES)
def test_unstorable_characters_in_admin_bodies_are_a_400(
    live: Live, method: str, path: str, template: str, bad: str
) -> None:
    r = _admin_call(live, method, path, template.replace("{bad}", bad))
    assert r.status_code == 400, (method, path, r.status_code, r.text)
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error"
    assert "cannot be stored" in err["message"], err
    assert err["param"], err  # names where it is


def test_a_refused_key_is_not_half_written(live: Live) -> None:
    def count() -> int:
        with live.factory() as db:
            return db.scalar(select(func.count()).select_from(ApiKeyRow))

    before = count()
    raw = '{"project_id": "p1", "kind": "agent", "name": "NAME"}'.replace("NAME", NUL)
    assert _admin_call(live, "POST", "/admin/api/keys", raw).status_code == 400
    assert count() == before


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("PUT", "/admin/api/projects/p1/verifiers"),
        ("POST", "/admin/api/keys"),
        ("POST", "/admin/api/actions/pause"),
        ("PATCH", "/admin/api/projects/p1/training"),
    ],
)
def test_deeply_nested_admin_bodies_are_a_400(live: Live, method: str, path: str) -> None:
    for raw in ('{"a": ' * DEEP + "1" + "}" * DEEP, '{"a": ' + "[" * DEEP + "]" * DEEP + "}"):
        r = _admin_call(live, method, path, raw)
        assert r.status_code == 400, (method, path, r.status_code, r.text[:300])
        assert "nested" in r.json()["error"]["message"]


ADMIN_PATHS = [
    "/admin/api/sessions/a%00b",
    "/admin/api/sessions/a%00b/credit",
    "/admin/api/runs/a%00b",
    "/admin/api/projects/a%00b/verifiers",
    "/admin/api/projects/a%00b/learning-curve",
    "/admin/api/projects/a%00b/training",
]


@pytest.mark.parametrize("path", ADMIN_PATHS)
def test_a_nul_in_an_admin_url_path_is_a_404(live: Live, path: str) -> None:
    r = httpx.get(live.url + path, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=60)
    assert r.status_code == 404, (path, r.status_code, r.text)
    assert r.json()["error"]["type"] == "not_found_error"
    r = _admin_call(live, "POST", "/admin/api/keys/a%00b/revoke", "")
    assert r.status_code == 404, r.text


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/sessions/a%00b"),
        ("GET", "/v1/responses/a%00b"),
        ("POST", "/v1/sessions/a%00b/end"),
        ("GET", "/v1/models/a%00b"),
    ],
)
def test_a_nul_in_an_id_in_the_url_path_is_a_404(live: Live, method: str, path: str) -> None:
    r = httpx.request(
        method, live.url + path, headers={"Authorization": f"Bearer {live.key()}"}, timeout=60
    )
    assert r.status_code == 404, (path, r.status_code, r.text)
    err = r.json()["error"]
    assert err["type"] == "not_found_error" and "NUL" in err["message"], err


@pytest.mark.parametrize(
    "path",
    [
        "/admin/api/sessions?project=a%00b",
        "/admin/api/feedback?session_id=a%00b",
        "/admin/api/keys?project=a%00b",
        "/admin/api/runs?status=a%00b",
        "/v1/feedback?session_id=a%00b",
    ],
)
def test_a_nul_in_a_query_parameter_is_a_400_naming_it(live: Live, path: str) -> None:
    r = httpx.get(live.url + path, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=60)
    assert r.status_code == 400, (path, r.status_code, r.text)
    err = r.json()["error"]
    assert err["param"] == path.split("?")[1].split("=")[0], err


def test_a_nul_in_a_dashboard_form_field_is_a_400_naming_it(live: Live) -> None:
    with httpx.Client(base_url=live.url, follow_redirects=False, timeout=60) as c:
        pre = re.search(r'name="csrf" value="([^"]+)"', c.get("/admin/login").text).group(1)
        r = c.post("/admin/login", data={"key": ADMIN, "csrf": pre, "next": "/admin"})
        assert r.status_code == 303, r.text
        csrf = re.search(r'name="csrf" value="([^"]+)"', c.get("/admin/keys").text).group(1)
        for path, form in (
            ("/admin/keys", {"csrf": csrf, "project_id": "p1", "kind": "agent", "name": "a\x00b"}),
            ("/admin/keys", {"csrf": csrf, "project_id": "a\x00b", "kind": "agent"}),
            ("/admin/actions/pause", {"csrf": csrf, "project_id": "a\x00b"}),
        ):
            r = c.post(path, data=form)
            assert r.status_code == 400, (path, form, r.status_code, r.text)
            assert "cannot be stored" in r.json()["error"]["message"]
