"""schemathesis against a live gateway with the real embedded engine: no generated
request may get a 5xx. Two runs:

- ``test_no_server_errors``: the gateway's OpenAPI document (/openapi.json), on SQLite;
- ``test_no_server_errors_admin_api_and_ids``: on PostgreSQL (which stores no NUL and
  no lone surrogate), the admin API under /admin/api (not in the served document: its
  description is built here from its router's routes, ``admin_document``) and the served
  document's operations with path parameters (sessions, responses, models) plus
  ``GET /v1/feedback``; every GET gets the optional query parameters the list routes
  read (``QUERY_PARAMS``), so filters are fuzzed too.

The document is the one the gateway serves (/openapi.json). Its POST operations read
their JSON bodies themselves, so the document declares no request bodies; without one
schemathesis would only ever send empty bodies. This test therefore adds a request body
to each POST before fuzzing: the pydantic request models for the client APIs (OpenAI
chat, Completions, Anthropic messages, Responses) and "any JSON object" for the others;
where a model leaves a field open, ``RICHER`` gives it shapes worth fuzzing: Responses
custom tools (regex or Lark definitions, grammar-like text included: nested repeats and
groups) and ``tool_choice``, and the Completions API's prompt forms (text, lists of
texts, token ids, lists of token ids). Output
sizes (max_tokens and friends, n) are bounded so that accepted calls stay short on the CPU
engine; everything else is generated freely, in schemathesis's positive and negative
modes. Every operation in the document is fuzzed; none is excluded.

Bounded: RLGATE_FUZZ_EXAMPLES examples per operation and mode (default 6; the second
run RLGATE_FUZZ_ADMIN_EXAMPLES, default 25), no per-example deadline (the engine's
latency is not what is tested), one check: not_a_server_error.
"""

from __future__ import annotations

import copy
import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import not_a_server_error
from schemathesis.errors import FailureGroup
from schemathesis.generation import GenerationMode

from core.db import make_engine, session_factory, transaction
from core.keys import create_key
from core.migrate import upgrade
from tests.gateway.conftest import engine, model_dir, session_pg_url  # noqa: F401 - shared
from tests.servers import gateway

pytestmark = pytest.mark.timeout(900)

EXAMPLES = int(os.environ.get("RLGATE_FUZZ_EXAMPLES", "6"))
# the second run calls no model (its operations only read and write the database), so
# it affords more: 25 finds a NUL in a query parameter that 6 does not
ADMIN_EXAMPLES = int(os.environ.get("RLGATE_FUZZ_ADMIN_EXAMPLES", "25"))
# bounded output so an accepted call is a short generation (the engine is real)
BOUNDS = {
    "max_tokens": 4,
    "max_completion_tokens": 4,
    "max_output_tokens": 4,
    "n": 2,
    "top_logprobs": 3,
}


# regex-like text: nested groups and bounded repeats (nesting bombs, deep nests) as well
# as ordinary patterns, for the custom tools' converters (core/ebnf_budget.py)
_GRAMMARISH = {"type": "string", "pattern": '^[a()|{}0-9,*+?\\[\\]"~.: /]{1,80}$'}
_LARKISH = {"type": "string", "pattern": '^start: [a()|0-9*+?\\[\\]"~. /]{1,80}$'}
_CUSTOM_TOOL = {
    "type": "object",
    "properties": {
        "type": {"enum": ["custom"]},
        "name": {"type": "string"},
        "format": {
            "type": "object",
            "properties": {
                "type": {"enum": ["grammar", "text"]},
                "syntax": {"enum": ["regex", "lark"]},
                "definition": {"anyOf": [_GRAMMARISH, _LARKISH, {"type": "string"}]},
            },
        },
    },
    "required": ["type", "name"],
}
# richer schemas for fields the request models leave open (Any, a list of Any)
RICHER: dict[str, dict[str, dict[str, Any]]] = {
    "/v1/responses": {
        "tools": {"type": "array", "maxItems": 3, "items": {"anyOf": [_CUSTOM_TOOL, {}]}},
        "tool_choice": {
            "anyOf": [
                {"enum": ["auto", "none", "required"]},
                {
                    "type": "object",
                    "properties": {"type": {"enum": ["custom", "function"]}, "name": {}},
                },
            ]
        },
    },
    "/v1/completions": {
        "prompt": {
            "anyOf": [
                {"type": "string"},
                {"type": "array", "maxItems": 17, "items": {"type": "string"}},
                {"type": "array", "items": {"type": "integer"}},
                {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}},
                {},
            ]
        },
    },
}


def _body_schema(model: Any, path: str = "") -> tuple[dict[str, Any], dict[str, Any]]:
    """(schema, its $defs) for a pydantic model, refs pointing into components; output
    sizes bounded, ``RICHER``'s fields for ``path`` put in."""
    s = model.model_json_schema(ref_template="#/components/schemas/{model}")
    defs = s.pop("$defs", {})
    for name, bound in BOUNDS.items():
        prop = s.get("properties", {}).get(name)
        if prop is not None:
            s["properties"][name] = {"type": "integer", "minimum": 0, "maximum": bound}
    s.setdefault("properties", {}).update(RICHER.get(path, {}))
    return s, defs


def with_bodies(doc: dict[str, Any]) -> dict[str, Any]:
    from gateway.api.anthropic_messages.protocol import MessagesRequest
    from gateway.api.openai_chat.protocol import ChatRequest
    from gateway.api.openai_completions.protocol import CompletionRequest
    from gateway.api.openai_responses.protocol import ResponsesRequest

    doc = copy.deepcopy(doc)
    comps = doc.setdefault("components", {}).setdefault("schemas", {})
    models = {
        "/v1/chat/completions": ChatRequest,
        "/v1/completions": CompletionRequest,
        "/v1/messages": MessagesRequest,
        "/v1/messages/count_tokens": MessagesRequest,
        "/v1/responses": ResponsesRequest,
    }
    for path, ops in doc["paths"].items():
        post = ops.get("post")
        if post is None or "requestBody" in post:
            continue
        if path in models:
            schema, defs = _body_schema(models[path], path)
            comps.update(defs)
        else:
            schema = {"type": "object"}
        post["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": schema}},
        }
    return doc


@pytest.fixture(scope="module")
def live(engine, tmp_path_factory) -> Iterator[tuple[str, str]]:  # noqa: F811
    data_dir = tmp_path_factory.mktemp("fuzz")
    db_url = f"sqlite:///{data_dir / 'rlgate.db'}"
    upgrade(db_url)
    db = make_engine(db_url)
    with transaction(session_factory(db)) as s:
        _, admin = create_key(s, "fuzz", "admin")
    # calls that name no output limit get 4 tokens (RLGATE_DEFAULT_MAX_TOKENS), so an
    # accepted call is short on the CPU engine
    with gateway(data_dir, db_url, engine.url, default_max_tokens="4") as gw:
        yield gw.url, admin
    db.dispose()


@pytest.fixture(scope="module")
def api_schema(live):  # type: ignore[no-untyped-def]
    url, admin = live
    headers = {"Authorization": f"Bearer {admin}"}
    r = httpx.get(url + "/openapi.json", headers=headers, timeout=30)
    assert r.status_code == 200, r.text
    schema = schemathesis.openapi.from_dict(with_bodies(r.json()))
    schema.config.update(base_url=url, headers=headers)
    return schema


# the query parameters the list routes read (gateway/admin/params.py, /v1/feedback):
# offered, optional, to every GET of the second run
QUERY_PARAMS = (
    "project",
    "project_id",
    "status",
    "rated",
    "agent",
    "source",
    "target_type",
    "session_id",
    "interaction_id",
    "trigger",
    "kind",
    "revoked",
    "session_keys",
    "since",
    "until",
    "hours",
    "tokens",
    "page",
    "page_size",
    "limit",
    "offset",
    "cursor",
)
# richer bodies where the admin API reads named fields ("any object" elsewhere)
ADMIN_BODIES: dict[str, dict[str, Any]] = {
    "/admin/api/keys": {
        "type": "object",
        "properties": {
            "project_id": {"type": "string"},
            "kind": {"type": "string"},
            "name": {"type": "string"},
        },
    },
    "/admin/api/actions/{action}": {
        "type": "object",
        "properties": {"project_id": {"type": "string"}, "target": {"type": "string"}},
    },
    "/admin/api/projects/{project_id}/verifiers": {
        "type": "object",
        "properties": {"verifiers": {"type": ["array", "null"], "items": {"type": "object"}}},
        "required": ["verifiers"],
    },
    "/admin/api/projects/{project_id}/feedback": {
        "type": "object",
        "properties": {"agent_keys_rate": {"type": "boolean"}},
    },
}


def admin_document() -> dict[str, Any]:
    """An OpenAPI document for the admin JSON API, from its router's routes (they are
    left out of the served document): each path parameter a string, each POST / PUT / PATCH
    a JSON object body."""
    from fastapi.routing import APIRoute

    from gateway.admin.api import router

    paths: dict[str, dict[str, Any]] = {}
    for route in router.routes:
        assert isinstance(route, APIRoute) and route.path.startswith("/admin/api/"), route
        for method in sorted(route.methods):
            op: dict[str, Any] = {
                "operationId": f"{method.lower()}:{route.path}",
                "parameters": [
                    {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
                    for name in route.param_convertors
                ],
                "responses": {"200": {"description": "ok"}},
            }
            if method in ("POST", "PUT", "PATCH"):
                schema = ADMIN_BODIES.get(route.path, {"type": "object"})
                op["requestBody"] = {
                    "required": False,
                    "content": {"application/json": {"schema": schema}},
                }
            paths.setdefault(route.path, {})[method.lower()] = op
    return {"openapi": "3.0.3", "info": {"title": "admin", "version": "0"}, "paths": paths}


def admin_and_id_document(served: dict[str, Any]) -> dict[str, Any]:
    """The admin document plus the served document's operations that take path
    parameters, and GET /v1/feedback; every GET offered ``QUERY_PARAMS``."""
    doc = admin_document()
    picked = with_bodies(served)
    doc["components"] = picked.get("components", {})
    for path, ops in picked["paths"].items():
        if "{" in path or path == "/v1/feedback":
            keep = {m: op for m, op in ops.items() if "{" in path or m == "get"}
            doc["paths"].setdefault(path, {}).update(keep)
    for ops in doc["paths"].values():
        get = ops.get("get")
        if get is None:
            continue
        named = {p["name"] for p in get.get("parameters", [])}
        get.setdefault("parameters", []).extend(
            {"name": n, "in": "query", "required": False, "schema": {"type": "string"}}
            for n in QUERY_PARAMS
            if n not in named
        )
    return doc


@dataclass
class Report:
    fuzzed: list[str] = field(default_factory=list)
    server_errors: list[str] = field(default_factory=list)
    no_negative: list[str] = field(default_factory=list)
    statuses: Counter[int] = field(default_factory=Counter)

    def check(self) -> None:
        print(
            f"fuzzed {len(self.fuzzed)} operations, responses by status "
            f"{dict(sorted(self.statuses.items()))}"
        )
        print(f"no negative examples exist for {self.no_negative}")
        assert not self.server_errors, f"{len(self.server_errors)} server errors:\n" + "\n".join(
            sorted(set(self.server_errors))[:40]
        )


def fuzz(schema: Any, url: str, headers: dict[str, str], examples: int) -> Report:
    """Every operation of ``schema``, positive and negative examples; all 5xx are
    collected in the report.

    schemathesis's own pytest loader (schemathesis.pytest.from_fixture) does not run under
    pytest 9 (it reads ``request.node._nodeid``), so the operations' strategies are driven
    with hypothesis here, and each response goes through the not_a_server_error check.
    """
    report = Report()
    for result in schema.get_all_operations():
        op = result.ok()  # an operation the document cannot describe fails here
        report.fuzzed.append(f"{op.method.upper()} {op.path}")
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @settings(
                max_examples=examples,
                deadline=None,
                suppress_health_check=list(HealthCheck),
                derandomize=True,
                database=None,
            )
            @given(case=op.as_strategy(generation_mode=mode))
            def run(case) -> None:  # type: ignore[no-untyped-def]
                try:
                    response = case.call(base_url=url, headers=headers, timeout=60)
                except requests.Timeout:
                    report.server_errors.append(
                        f"{case.method} {case.formatted_path} -> no answer in 60 s; "
                        f"body sent: {str(case.body)[:200]}"
                    )
                    return
                report.statuses[response.status_code] += 1
                try:
                    case.validate_response(response, checks=[not_a_server_error])
                except FailureGroup:
                    report.server_errors.append(
                        f"{case.method} {case.formatted_path} "
                        f"query={case.query} -> {response.status_code} "
                        f"{response.text[:200]!r}; body sent: {str(case.body)[:200]}"
                    )

            try:
                run()
            except Unsatisfiable:
                # an operation with no parameters and no body has no invalid input
                assert mode is GenerationMode.NEGATIVE, op.path
                report.no_negative.append(f"{op.method.upper()} {op.path}")
    return report


def test_no_server_errors(api_schema, live):  # type: ignore[no-untyped-def]
    url, admin = live
    report = fuzz(api_schema, url, {"Authorization": f"Bearer {admin}"}, EXAMPLES)
    assert len(report.fuzzed) >= 10, report.fuzzed  # the document lists the gateway's operations
    assert report.statuses[200] > 0, report.statuses  # some calls got through to the engine
    report.check()


BOOTSTRAP_ADMIN = "bootstrap-fuzz-" + "f" * 32


@pytest.fixture(scope="module")
def live_pg(engine, session_pg_url, tmp_path_factory) -> Iterator[str]:  # noqa: F811
    """A gateway on PostgreSQL whose bootstrap admin key may act on every project, so
    each generated value reaches the database; a project p1 with an agent key."""
    data_dir = tmp_path_factory.mktemp("fuzz-pg")
    upgrade(session_pg_url)
    db = make_engine(session_pg_url)
    with transaction(session_factory(db)) as s:
        create_key(s, "p1", "agent")
    with gateway(
        data_dir, session_pg_url, engine.url, default_max_tokens="4", admin_key=BOOTSTRAP_ADMIN
    ) as gw:
        yield gw.url
    db.dispose()


def test_no_server_errors_admin_api_and_ids(live_pg):  # type: ignore[no-untyped-def]
    headers = {"Authorization": f"Bearer {BOOTSTRAP_ADMIN}"}
    r = httpx.get(live_pg + "/openapi.json", headers=headers, timeout=30)
    assert r.status_code == 200, r.text
    doc = admin_and_id_document(r.json())
    schema = schemathesis.openapi.from_dict(doc)
    schema.config.update(base_url=live_pg, headers=headers)
    report = fuzz(schema, live_pg, headers, ADMIN_EXAMPLES)
    fuzzed = set(report.fuzzed)
    for op in (
        "PUT /admin/api/projects/{project_id}/verifiers",
        "PUT /admin/api/projects/{project_id}/feedback",
        "POST /admin/api/keys",
        "POST /admin/api/actions/{action}",
        "PATCH /admin/api/projects/{project_id}/training",
        "GET /admin/api/sessions/{session_id}/credit",
        "GET /v1/sessions/{session_id}",
        "POST /v1/sessions/{session_id}/end",
        "GET /v1/responses/{response_id}",
        "GET /v1/feedback",
    ):
        assert op in fuzzed, (op, sorted(fuzzed))
    report.check()
