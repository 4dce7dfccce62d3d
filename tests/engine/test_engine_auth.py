"""The engine with ``--api-key`` (SGLang's flag and behaviour), ``--allowed-lora-dir``, and
a refused request that must not keep an adapter in use (a 2**64 seed once leaked the use
count, so the adapter's unload hung and, with every slot taken, nothing new could load).

One engine subprocess with the real packaged model, a key, and room for ONE adapter, so
"a new adapter loads" proves the previous one was really unloaded. The trainer's publish
functions run against it too.
"""

from __future__ import annotations

import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from core.db import make_engine, session_factory, transaction
from core.keys import create_key
from core.migrate import upgrade
from tests.gateway.fake_engine import in_process_gateway
from tests.servers import Proc, engine_cmd, free_port, running
from trainer import publish

KEY = secrets.token_urlsafe(24)
AUTH = {"Authorization": f"Bearer {KEY}"}
PROMPT = [1, 504, 3458, 314]


@pytest.fixture(scope="module")
def lora_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("allowed-adapters")


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory, lora_root: Path) -> Iterator[Proc]:
    port = free_port()
    log = tmp_path_factory.mktemp("keyed-engine") / "engine.log"
    cmd = engine_cmd(
        port,
        "--api-key",
        KEY,
        "--allowed-lora-dir",
        str(lora_root),
        "--max-loaded-loras",
        "1",
        "--max-lora-rank",
        "16",
        "--max-running-requests",
        "4",
        "--context-length",
        "512",
    )
    with running(cmd, {}, log, port) as p:
        yield p


@pytest.fixture(scope="module")
def allowed(adapter_dirs: dict[str, Path], lora_root: Path) -> dict[str, str]:
    """The session's test adapters, copied under the engine's --allowed-lora-dir."""
    out = {}
    for key in ("a", "b"):
        shutil.copytree(adapter_dirs[key], lora_root / key, dirs_exist_ok=True)
        out[key] = str(lora_root / key)
    return out


def _post(url: str, path: str, body: object, headers: dict[str, str] | None = None):  # noqa: ANN202
    return httpx.post(url + path, json=body, headers=headers, timeout=120)


def test_routes_refuse_requests_without_the_key(keyed: Proc, allowed: dict[str, str]) -> None:
    gen = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 2}}
    load = {"lora_name": "intruder", "lora_path": allowed["a"]}
    for headers in (None, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        for path, body in (
            ("/generate", gen),
            ("/load_lora_adapter", load),
            ("/unload_lora_adapter", {"lora_name": "intruder"}),
            ("/abort_request", {"abort_all": True}),
        ):
            r = _post(keyed.url, path, body, headers)
            assert r.status_code == 401, (path, headers, r.text)
            assert r.json() == {"error": "Unauthorized"}
        for path in ("/get_server_info", "/v1/models", "/get_model_info"):
            assert httpx.get(keyed.url + path, headers=headers).status_code == 401
    # the health probe stays open; /health_generate runs a generation, so it needs the
    # key (issue 26, finding 8: SGLang's open "/health" prefix matched it)
    assert httpx.get(keyed.url + "/health").status_code == 200
    for headers in (None, {"Authorization": "Bearer wrong"}):
        for path in ("/health_generate", "/healthz", "/metrics_x"):
            r = httpx.get(keyed.url + path, headers=headers, timeout=120)
            assert r.status_code == 401, (path, headers, r.text)
    assert httpx.get(keyed.url + "/health_generate", headers=AUTH, timeout=120).status_code == 200
    # nothing was loaded by the refused call
    info = httpx.get(keyed.url + "/get_server_info", headers=AUTH).json()
    assert info["lora_use_counts"] == {}


def test_the_key_opens_every_route(keyed: Proc) -> None:
    r = _post(
        keyed.url,
        "/generate",
        {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 3, "temperature": 0}},
        AUTH,
    )
    assert r.status_code == 200, r.text
    assert r.json()["meta_info"]["completion_tokens"] == 3
    assert _post(keyed.url, "/abort_request", {"rid": "nothing"}, AUTH).status_code == 200
    assert httpx.get(keyed.url + "/v1/models", headers=AUTH).json()["data"][0]["object"]


def test_adapter_outside_the_allowed_dir_is_refused(
    keyed: Proc, adapter_dirs: dict[str, Path], lora_root: Path
) -> None:
    outside = _post(
        keyed.url,
        "/load_lora_adapter",
        {"lora_name": "outside", "lora_path": str(adapter_dirs["a"])},
        AUTH,
    )
    assert outside.status_code == 400
    assert "outside the engine's adapter directory" in outside.json()["error_message"]
    dotdot = str(lora_root / ".." / adapter_dirs["a"].parent.name / "a")
    r = _post(keyed.url, "/load_lora_adapter", {"lora_name": "dd", "lora_path": dotdot}, AUTH)
    assert r.status_code == 400 and r.json()["loaded_adapters"] == {}


def test_out_of_range_seed_is_400_and_leaves_the_adapter_free(
    keyed: Proc, allowed: dict[str, str]
) -> None:
    r = _post(
        keyed.url, "/load_lora_adapter", {"lora_name": "seeded", "lora_path": allowed["a"]}, AUTH
    )
    assert r.status_code == 200, r.text
    for params in (
        {"seed": 2**64, "temperature": 1.0},
        {"sampling_seed": -(2**63) - 1},
        {"seed": 2**64, "n": 3},
    ):
        bad = _post(
            keyed.url,
            "/generate",
            {"input_ids": PROMPT, "lora_path": "seeded", "sampling_params": params},
            AUTH,
        )
        assert bad.status_code == 400, bad.text
        assert "64-bit signed integer" in bad.json()["error"]["message"]
    # a batch whose second prompt is refused after the first one's adapter was named
    batch = _post(
        keyed.url,
        "/generate",
        {
            "input_ids": [PROMPT, PROMPT],
            "lora_path": ["seeded", "no-such-adapter"],
            "sampling_params": {"max_new_tokens": 1},
        },
        AUTH,
    )
    assert batch.status_code == 400 and "unknown LoRA adapter" in batch.text
    # the largest valid seed works, with the adapter
    ok = _post(
        keyed.url,
        "/generate",
        {
            "input_ids": PROMPT,
            "lora_path": "seeded",
            "sampling_params": {"seed": 2**63 - 1, "max_new_tokens": 2},
        },
        AUTH,
    )
    assert ok.status_code == 200, ok.text
    info = httpx.get(keyed.url + "/get_server_info", headers=AUTH).json()
    assert info["lora_use_counts"] == {"seeded": 0}
    # so the unload does not wait for a use that never ends, and the one slot frees up
    un = _post(keyed.url, "/unload_lora_adapter", {"lora_name": "seeded"}, AUTH)
    assert un.status_code == 200 and un.json()["success"], un.text
    again = _post(
        keyed.url, "/load_lora_adapter", {"lora_name": "next", "lora_path": allowed["b"]}, AUTH
    )
    assert again.status_code == 200 and again.json()["loaded_adapters"] == {"next": allowed["b"]}
    un = _post(keyed.url, "/unload_lora_adapter", {"lora_name": "next"}, AUTH)
    assert un.status_code == 200 and un.json()["success"], un.text


def test_trainer_publish_sends_the_key(keyed: Proc, allowed: dict[str, str]) -> None:
    """trainer/publish.py against the keyed engine: refused without the key, works with it
    (explicit headers, and the settings' RLGATE_ENGINE_API_KEY by default)."""
    with pytest.raises(publish.PublishError, match="Unauthorized"):
        publish.load_everywhere([keyed.url], "pub", allowed["a"], headers={})
    publish.load_everywhere([keyed.url], "pub", allowed["a"], headers=AUTH)
    assert httpx.get(keyed.url + "/v1/models", headers=AUTH).json()["data"][1]["id"] == "pub"
    assert publish.unload_everywhere([keyed.url], "pub", headers=AUTH) == []
    assert httpx.get(keyed.url + "/v1/models", headers=AUTH).json()["data"][1:] == []


def test_trainer_publish_reads_the_key_from_settings(
    keyed: Proc, allowed: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from core.settings import get_settings

    monkeypatch.setenv("RLGATE_ENGINE_API_KEY", KEY)
    get_settings.cache_clear()
    try:
        publish.load_everywhere([keyed.url], "pub2", allowed["b"])
        assert publish.unload_everywhere([keyed.url], "pub2") == []
    finally:
        monkeypatch.delenv("RLGATE_ENGINE_API_KEY")
        get_settings.cache_clear()
    refused = publish.unload_everywhere([keyed.url], "pub2")  # no key now
    assert len(refused) == 1 and "Unauthorized" in refused[0]


def test_gateway_sends_the_key(keyed: Proc, tmp_path: Path) -> None:
    """A gateway with RLGATE_ENGINE_API_KEY serves chats through the keyed engine and
    refuses an out-of-range seed itself (OpenAI's error format); one without the key
    answers 503 saying which setting to fix, not a client error."""
    db_url = f"sqlite:///{tmp_path / 'rlgate.db'}"
    upgrade(db_url)
    with transaction(session_factory(make_engine(db_url))) as db:
        _, secret = create_key(db, "p1", "agent")
    chat = {"model": "rlgate-policy", "messages": [{"role": "user", "content": "Hi"}]}
    bearer = {"Authorization": f"Bearer {secret}"}
    with in_process_gateway(tmp_path / "gw", db_url, keyed.url, engine_api_key=KEY) as gw:
        url = gw.url + "/v1/chat/completions"
        r = httpx.post(url, json={**chat, "max_tokens": 3, "seed": 7}, headers=bearer, timeout=120)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] >= 1
        for seed, n in ((2**64, 1), (2**63 - 1, 2)):
            bad = httpx.post(url, json={**chat, "seed": seed, "n": n}, headers=bearer, timeout=60)
            assert bad.status_code == 400, bad.text
            err = bad.json()["error"]
            assert err["type"] == "invalid_request_error" and err["param"] == "seed"
            assert "64-bit signed integer" in err["message"]
    with in_process_gateway(tmp_path / "gw2", db_url, keyed.url) as gw:
        r = httpx.post(gw.url + "/v1/chat/completions", json=chat, headers=bearer, timeout=120)
        assert r.status_code == 503, r.text
        assert "RLGATE_ENGINE_API_KEY" in r.json()["error"]["message"]
