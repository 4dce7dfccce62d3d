"""The eval gate on real parts: the embedded engine with the real packaged model (served
from this process), real PEFT adapters, SQLite and PostgreSQL. Two adapters are made
deterministically: the zero adapter (LoRA B = 0: greedy outputs equal the base model's)
and a seeded one (B random: different outputs, checked first). The gate's prompts expect
the base model's own greedy outputs, scored by the registered ``contains`` verifier, so
the zero adapter is the better candidate and the seeded one the worse, whichever is
serving."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from sqlalchemy import select

from core.db import transaction
from core.settings import Settings, get_settings
from schemas.coltypes import utcnow
from schemas.tables import AuditEventRow, PolicyVersionRow, ProjectRow, TrainingRunRow
from tests.servers import in_process_engine
from tests.trainer.helpers import MODEL_DIR, _tokenizer, render
from trainer import publish, runner, runs, serving_switch
from trainer.reward_registry import REGISTRY
from trainer.reward_source import RewardSource

pytestmark = pytest.mark.slow  # loads the real model

QUESTIONS = ["What is the capital of France?", "Name a primary color."]
MAX_NEW = 8


@pytest.fixture(scope="module")
def engine_url() -> Iterator[str]:
    """The embedded engine, served from this process (what the gate asks of it is over
    HTTP all the same; the one test with a worker process reaches it there too)."""
    with in_process_engine(max_lora_rank=8, max_loaded_loras=4, context_length=256) as url:
        yield url


@pytest.fixture(scope="module")
def adapters(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``zero`` (LoRA B = 0) and ``seeded`` (B random, fixed seed), rank 4."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("gate-adapters")
    model = AutoModelForCausalLM.from_pretrained(str(MODEL_DIR), dtype=torch.float32)
    config = LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "o_proj", "down_proj"]
    )
    torch.manual_seed(0)
    peft_model = get_peft_model(model, config)
    peft_model.save_pretrained(str(root / "zero"))
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.5)
    peft_model.save_pretrained(str(root / "seeded"))
    return {"zero": root / "zero", "seeded": root / "seeded"}


def _greedy(engine_url: str, body: dict[str, Any], adapter: str | None) -> str:
    r = httpx.post(
        f"{engine_url}/generate",
        json={
            **body,
            "lora_path": adapter,
            "sampling_params": {"temperature": 0, "max_new_tokens": MAX_NEW},
        },
        timeout=120,
    )
    assert r.status_code == 200, r.text
    return str(r.json()["text"])


@pytest.fixture(scope="module")
def gate_prompts(engine_url: str, adapters: dict[str, Path]) -> list[dict[str, Any]]:
    """One text prompt and one token-id prompt, each expecting the base model's greedy
    output; checked first: the zero adapter gives it, the seeded adapter does not."""
    chat_text = _tokenizer().apply_chat_template(
        [{"role": "user", "content": QUESTIONS[0]}], add_generation_prompt=True, tokenize=False
    )
    bodies = [{"text": chat_text}, {"input_ids": render(QUESTIONS[1])}]
    names = {k: f"gate-probe-{k}" for k in adapters}
    publish.load_everywhere([engine_url], names["zero"], str(adapters["zero"]))
    publish.load_everywhere([engine_url], names["seeded"], str(adapters["seeded"]))
    items = []
    for body in bodies:
        base = _greedy(engine_url, body, None)
        assert base.strip(), body
        assert _greedy(engine_url, body, names["zero"]) == base
        assert base.strip().lower() not in _greedy(engine_url, body, names["seeded"]).lower()
        key = "prompt" if "text" in body else "input_ids"
        items.append({key: body.get("text", body.get("input_ids")), "expected": base.strip()})
    for name in names.values():
        publish.unload_everywhere([engine_url], name)
    return items


@pytest.fixture
def settings(engine_url: str, db_url: str, monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setenv("RLGATE_ENGINE_URLS", engine_url)
    monkeypatch.setenv("RLGATE_DATABASE_URL", db_url)
    get_settings.cache_clear()
    return get_settings()


def _setup(
    factory: Any,
    engine_url: str,
    adapters: dict[str, Path],
    serving_kind: str,
    candidate_kind: str,
    gate: dict[str, Any],
) -> dict[str, str]:
    """A project whose ``serving_kind`` adapter is v1 (serving, loaded in the engine) and
    whose ``candidate_kind`` adapter is v2 (candidate of a trained-not-published run)."""
    pid = f"g{secrets.token_hex(4)}"
    now = utcnow()
    out = {"pid": pid, "run": f"run_{pid}", "v1": f"{pid}-policy-v1", "v2": f"{pid}-policy-v2"}
    with transaction(factory) as db:
        db.add(ProjectRow(id=pid, name=pid, created_at=now, settings={"training": {}}))
        db.flush()
        db.add(
            TrainingRunRow(
                id=out["run"],
                project_id=pid,
                trigger="manual",
                status="trained-not-published",
                config={},
                num_samples=0,
                step_metrics=[],
                created_at=now,
            )
        )
        for v, kind, status in ((1, serving_kind, "serving"), (2, candidate_kind, "candidate")):
            db.add(
                PolicyVersionRow(
                    id=f"pv_{pid}_{v}",
                    project_id=pid,
                    name=out[f"v{v}"],
                    version=v,
                    base_model="SmolLM2-135M-Instruct",
                    path=str(adapters[kind]),
                    lora_config={"r": 4, "lora_alpha": 8, "target_modules": ["q_proj"]},
                    created_by_run_id=out["run"] if v == 2 else None,
                    status=status,
                    created_at=now,
                )
            )
        db.flush()
        db.get(TrainingRunRow, out["run"]).policy_version_id = f"pv_{pid}_2"  # type: ignore[union-attr]
    _store_gate(factory, pid, gate)
    publish.load_everywhere([engine_url], out["v1"], str(adapters[serving_kind]))
    return out


def _store_gate(factory: Any, pid: str, gate: dict[str, Any]) -> None:
    """Written straight to the database, as stored before validation existed (or by an
    operator): the run must hold up even when the admin API's checks were bypassed."""
    with transaction(factory) as db:
        p = db.get(ProjectRow, pid)
        assert p is not None
        p.settings = {"training": {"eval_gate": gate}}


def _state(factory: Any, ids: dict[str, str]) -> tuple[str, str, TrainingRunRow, dict[str, Any]]:
    with factory() as db:
        v1 = db.get(PolicyVersionRow, f"pv_{ids['pid']}_1")
        v2 = db.get(PolicyVersionRow, f"pv_{ids['pid']}_2")
        run = db.get(TrainingRunRow, ids["run"])
        assert v1 is not None and v2 is not None and run is not None
        return v1.status, v2.status, run, dict(v2.eval_metrics or {})


def _loaded(engine_url: str) -> set[str]:
    return {m["id"] for m in httpx.get(f"{engine_url}/v1/models").json()["data"][1:]}


def _cleanup(engine_url: str, ids: dict[str, str]) -> None:
    for name in {ids["v1"], ids["v2"]} & _loaded(engine_url):
        publish.unload_everywhere([engine_url], name)


def _gate(prompts: list[dict[str, Any]], verifier: str = "contains") -> dict[str, Any]:
    return {"enabled": True, "verifier": verifier, "prompts": prompts, "max_new_tokens": MAX_NEW}


def test_worse_candidate_is_rejected(
    migrated_db, settings: Settings, engine_url: str, adapters, gate_prompts
) -> None:  # type: ignore[no-untyped-def]
    ids = _setup(migrated_db, engine_url, adapters, "zero", "seeded", _gate(gate_prompts))
    try:
        assert serving_switch.publish_version(migrated_db, settings, f"pv_{ids['pid']}_2") is False
        v1, v2, run, metrics = _state(migrated_db, ids)
        assert (v1, v2) == ("serving", "rejected")
        assert metrics["eval_new"] == -1.0 and metrics["eval_serving"] == 1.0
        assert (
            metrics["eval_verifier"] == "contains" and metrics["eval_serving_adapter"] == ids["v1"]
        )
        assert run.status == "trained-not-published"
        assert "rejected" in run.error and "eval_new" in run.error
        assert ids["v2"] not in _loaded(engine_url)  # the rejected adapter is unloaded
        with migrated_db() as db:
            actions = db.scalars(
                select(AuditEventRow.action).where(AuditEventRow.project_id == ids["pid"])
            ).all()
        assert "adapter.reject" in actions and "adapter.promote" not in actions
    finally:
        _cleanup(engine_url, ids)


def test_better_candidate_is_served(
    migrated_db, settings: Settings, engine_url: str, adapters, gate_prompts
) -> None:  # type: ignore[no-untyped-def]
    ids = _setup(migrated_db, engine_url, adapters, "seeded", "zero", _gate(gate_prompts))
    try:
        assert serving_switch.publish_version(migrated_db, settings, f"pv_{ids['pid']}_2") is True
        v1, v2, run, metrics = _state(migrated_db, ids)
        assert (v1, v2) == ("retired", "serving")
        assert metrics["eval_new"] == 1.0 and metrics["eval_serving"] == -1.0
        assert run.status == "published" and run.error is None
        assert ids["v2"] in _loaded(engine_url) and ids["v1"] not in _loaded(engine_url)
    finally:
        _cleanup(engine_url, ids)


def _crash(ctx: Any, answer: Any) -> float:
    raise RuntimeError("verifier crashed")


@pytest.mark.parametrize(
    ("verifier", "reason"),
    [
        ("crashing", "verifier 'crashing' raised RuntimeError: verifier crashed on eval prompt 0"),
        ("not_installed", "verifier 'not_installed' is not registered"),
        ("exact_number", "abstained on every eval prompt"),  # the prompts expect no number
    ],
)
def test_broken_verifier_fails_closed(
    migrated_db,
    settings: Settings,
    engine_url: str,
    adapters,
    gate_prompts,
    monkeypatch: pytest.MonkeyPatch,
    verifier: str,
    reason: str,
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setitem(REGISTRY, "crashing", RewardSource("crashing", (), score=_crash))
    prompts = gate_prompts
    if verifier == "exact_number":
        prompts = [{k: v for k, v in p.items() if k != "expected"} for p in gate_prompts]
    # the zero adapter is the better one: only the broken verifier keeps it out
    ids = _setup(migrated_db, engine_url, adapters, "seeded", "zero", _gate(prompts, verifier))
    try:
        assert serving_switch.publish_version(migrated_db, settings, f"pv_{ids['pid']}_2") is False
        v1, v2, run, metrics = _state(migrated_db, ids)
        assert (v1, v2) == ("serving", "rejected")
        assert reason in metrics["eval_error"] and "eval_new" not in metrics
        assert run.status == "trained-not-published" and reason in run.error
        assert ids["v2"] not in _loaded(engine_url)
    finally:
        _cleanup(engine_url, ids)


def test_stored_module_name_runs_nothing(
    migrated_db, settings: Settings, engine_url: str, adapters, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """The reported attack, stored as it was accepted before: ``pydoc:pipepager`` with a
    prompt item whose first key is a shell command. Publishing rejects the candidate with
    the reason and runs nothing; a new run fails at once on the invalid settings."""
    marker = tmp_path / "pwned"
    gate = {
        "enabled": True,
        "verifier": "pydoc:pipepager",
        "prompts": [{f"touch {marker}; true": 1, "prompt": "hi", "answer": "x"}],
    }
    ids = _setup(migrated_db, engine_url, adapters, "seeded", "zero", gate)
    try:
        assert serving_switch.publish_version(migrated_db, settings, f"pv_{ids['pid']}_2") is False
        v1, v2, run, metrics = _state(migrated_db, ids)
        assert (v1, v2) == ("serving", "rejected")
        assert "eval_gate settings invalid" in metrics["eval_error"]
        assert "pydoc:pipepager" in run.error
        run_id = runs.create_queued(migrated_db, ids["pid"], "manual")
        result = runner.run_training(ids["pid"], "manual", run_id, settings=settings)
        assert result["status"] == "failed" and "training settings invalid" in result["error"]
        with migrated_db() as db:
            row = db.get(TrainingRunRow, run_id)
            assert row is not None and row.status == "failed"
            assert "pydoc:pipepager" in (row.error or "")
        assert not marker.exists()
    finally:
        _cleanup(engine_url, ids)


def test_a_slow_gate_fails_its_own_run_within_the_budget(
    migrated_db,
    settings: Settings,
    engine_url: str,
    adapters,
    gate_prompts,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # type: ignore[no-untyped-def]
    """Issue 36, finding 2: a project's gate runs a granted command per eval prompt inside
    the training task. Each takes 5 s (2 prompts x 2 adapters: 20 s before); with a 2 s
    budget the publish gives up within it, and the candidate is rejected (fails closed,
    audited), its run trained-not-published."""
    import json
    import time

    monkeypatch.setenv("RLGATE_COMMANDS", json.dumps({"slow": {"command": "sleep 5",
                                                                "timeout_s": 60}}))  # fmt: skip
    monkeypatch.setenv("RLGATE_EVAL_GATE_BUDGET_S", "2")
    get_settings.cache_clear()
    settings = get_settings()
    ids = _setup(
        migrated_db, engine_url, adapters, "seeded", "zero", _gate(gate_prompts, "command")
    )
    with transaction(migrated_db) as db:
        p = db.get(ProjectRow, ids["pid"])
        assert p is not None
        p.settings = {**p.settings, "verifiers": [{"name": "command", "use": "slow"}]}
    try:
        started = time.monotonic()
        assert serving_switch.publish_version(migrated_db, settings, f"pv_{ids['pid']}_2") is False
        took = time.monotonic() - started
        assert took < 2 + 8, took  # the budget, plus generation and loading (not 20 s)
        v1, v2, run, metrics = _state(migrated_db, ids)
        assert (v1, v2) == ("serving", "rejected")
        assert "time budget of 2 s" in metrics["eval_error"], metrics
        assert run.status == "trained-not-published" and "time budget" in run.error
        with migrated_db() as db:
            actions = db.scalars(
                select(AuditEventRow.action).where(AuditEventRow.project_id == ids["pid"])
            ).all()
        assert "adapter.reject" in actions and "adapter.promote" not in actions
    finally:
        _cleanup(engine_url, ids)


def test_a_slow_gate_does_not_hold_another_projects_run(
    pg_url: str, engine_url: str, adapters, gate_prompts, tmp_path: Path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """Issue 36, finding 2, with a real ``rlgate worker`` on PostgreSQL: p1's candidate is
    published with a gate whose granted command sleeps 10 s per eval prompt (40 s for 2
    prompts x 2 adapters); p2's run is queued 1 s after it on the same trainer. With a
    3 s budget p1's publish ends within it (rejected, audited) and p2's run lands a few
    seconds later, not after p1's 40 s."""
    import json
    import os
    import subprocess
    import sys
    import time

    import redis

    from core.db import make_engine, session_factory
    from core.migrate import upgrade
    from tests.servers import REPO
    from trainer import api
    from trainer.celery_base import make_celery

    broker = f"redis://127.0.0.1:6379/{os.environ.get('RLGATE_TEST_GATE_REDIS_DB', '12')}"
    env = {
        "RLGATE_DATABASE_URL": pg_url,
        "RLGATE_BROKER_URL": broker,
        "RLGATE_ENGINE_URLS": engine_url,
        "RLGATE_COMMANDS": json.dumps({"slow": {"command": "sleep 10", "timeout_s": 60}}),
        "RLGATE_EVAL_GATE_BUDGET_S": "3",
        "RLGATE_VERIFY_WORKERS": "1",
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    get_settings.cache_clear()
    upgrade(pg_url)
    engine = make_engine(pg_url)
    factory = session_factory(engine)
    ids = _setup(factory, engine_url, adapters, "seeded", "zero", _gate(gate_prompts, "command"))
    with transaction(factory) as db:
        p = db.get(ProjectRow, ids["pid"])
        assert p is not None
        p.settings = {**p.settings, "verifiers": [{"name": "command", "use": "slow"}]}
        db.add(ProjectRow(id="p2", name="p2", created_at=utcnow(), settings={}))
    redis.Redis.from_url(broker).flushdb()
    log = tmp_path / "worker.log"
    with open(log, "wb") as fh:
        worker = subprocess.Popen(
            [sys.executable, "-m", "rlgate.cli", "worker", "-n", f"gate-{secrets.token_hex(3)}@%h"],
            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO),
                           "RLGATE_DATA_DIR": str(tmp_path / "w")},
            stdout=fh, stderr=subprocess.STDOUT,
        )  # fmt: skip

    def until(what: Any, timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if got := what():
                return got
            time.sleep(0.2)
        raise AssertionError(f"timed out; worker log:\n{log.read_text()[-4000:]}")

    def decided() -> Any:
        state = _state(factory, ids)
        return state if state[1] != "candidate" else None

    try:
        until(lambda: b" ready." in log.read_bytes(), 120)
        make_celery().send_task("rlgate.retry_publish")  # p1's publish, with its gate
        time.sleep(1)
        queued = time.monotonic()
        run_id = api.train_now("p2", "test", factory=factory)

        def finished() -> str | None:
            with factory() as db:
                status = db.get(TrainingRunRow, run_id).status  # type: ignore[union-attr]
            return None if status in ("queued", "running") else str(status)

        assert until(finished, 120) == "cancelled"  # p2 has nothing to train on
        waited = time.monotonic() - queued
        assert waited < 20, waited  # behind p1's gate for at most its budget, not 40 s
        v1, v2, run, metrics = until(decided, 60)
        assert (v1, v2) == ("serving", "rejected")
        assert "time budget of 3 s" in metrics["eval_error"]
        assert run.status == "trained-not-published"
    finally:
        worker.terminate()
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
        _cleanup(engine_url, ids)
        engine.dispose()
