"""schemathesis over the gateway's OpenAPI document, against a live gateway with the
real embedded engine: no generated request may get a 5xx.

The document is the one the gateway serves (/openapi.json). Its POST operations read
their JSON bodies themselves, so the document declares no request bodies; without one
schemathesis would only ever send empty bodies. This test therefore adds a request body
to each POST before fuzzing: the pydantic request models for the three client APIs
(OpenAI chat, Anthropic messages, Responses) and "any JSON object" for the others. Output
sizes (max_tokens and friends, n) are bounded so that accepted calls stay short on the CPU
engine; everything else is generated freely, in schemathesis's positive and negative
modes. Every operation in the document is fuzzed; none is excluded.

Bounded: RLGATE_FUZZ_EXAMPLES examples per operation (default 6), no per-example
deadline (the engine's latency is not what is tested), one check: not_a_server_error.
"""

from __future__ import annotations

import copy
import os
from collections import Counter
from collections.abc import Iterator
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
from tests.gateway.conftest import engine, model_dir  # noqa: F401 - shared fixtures
from tests.servers import gateway

pytestmark = pytest.mark.timeout(900)

EXAMPLES = int(os.environ.get("RLGATE_FUZZ_EXAMPLES", "6"))
# bounded output so an accepted call is a short generation (the engine is real)
BOUNDS = {
    "max_tokens": 4,
    "max_completion_tokens": 4,
    "max_output_tokens": 4,
    "n": 2,
    "top_logprobs": 3,
}


def _body_schema(model: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(schema, its $defs) for a pydantic model, refs pointing into components."""
    s = model.model_json_schema(ref_template="#/components/schemas/{model}")
    defs = s.pop("$defs", {})
    for name, bound in BOUNDS.items():
        prop = s.get("properties", {}).get(name)
        if prop is not None:
            s["properties"][name] = {"type": "integer", "minimum": 0, "maximum": bound}
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
            schema, defs = _body_schema(models[path])
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


def test_no_server_errors(api_schema, live):  # type: ignore[no-untyped-def]
    """Every operation, positive and negative examples; all 5xx are collected, then shown.

    schemathesis's own pytest loader (schemathesis.pytest.from_fixture) does not run under
    pytest 9 (it reads ``request.node._nodeid``), so the operations' strategies are driven
    with hypothesis here, and each response goes through the not_a_server_error check.
    """
    url, admin = live
    headers = {"Authorization": f"Bearer {admin}"}
    server_errors: list[str] = []
    fuzzed: list[str] = []
    no_negative: list[str] = []
    statuses: Counter[int] = Counter()
    for result in api_schema.get_all_operations():
        op = result.ok()  # an operation the document cannot describe fails here
        fuzzed.append(f"{op.method.upper()} {op.path}")
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @settings(
                max_examples=EXAMPLES,
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
                    server_errors.append(
                        f"{case.method} {case.formatted_path} -> no answer in 60 s; "
                        f"body sent: {str(case.body)[:200]}"
                    )
                    return
                statuses[response.status_code] += 1
                try:
                    case.validate_response(response, checks=[not_a_server_error])
                except FailureGroup:
                    server_errors.append(
                        f"{case.method} {case.formatted_path} -> {response.status_code} "
                        f"{response.text[:200]!r}; body sent: {str(case.body)[:200]}"
                    )

            try:
                run()
            except Unsatisfiable:
                # an operation with no parameters and no body has no invalid input
                assert mode is GenerationMode.NEGATIVE, op.path
                no_negative.append(f"{op.method.upper()} {op.path}")
    print(f"fuzzed {len(fuzzed)} operations, responses by status {dict(sorted(statuses.items()))}")
    print(f"no negative examples exist for {no_negative}")
    assert len(fuzzed) >= 10, fuzzed  # the document lists the gateway's operations
    assert statuses[200] > 0, statuses  # some generated calls got through to the engine
    assert not server_errors, f"{len(server_errors)} server errors:\n" + "\n".join(
        sorted(set(server_errors))[:40]
    )
