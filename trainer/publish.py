"""Publishing adapters: load into every engine, switch the serving pointer, unload the old.

- ``load_everywhere``: ``POST /load_lora_adapter {lora_name, lora_path}`` on each engine
  (``engines``: the engine list, or the workers an sglang-router lists that the operator
  named); an engine that already has that name counts as loaded, so a retried publish
  is idempotent; an engine that cannot be connected to is skipped when another one
  loaded it (every gateway's adapter sync, and the tick's ``sync_engines``, load it when
  it is back). ``warm``: one greedy token through a new version on each engine that loaded
  it, before its publish switches to it, so the first client request on it does not pay
  its first use.
- ``serve_from``: the path engines load a version from, its *live* directory
  (core/live_adapters.py), created here and only here; ``retire`` removes it, then
  unloads the version everywhere, so no engine can re-load a retired version on demand
  (SGLang does that for a request naming an unloaded adapter).
- ``switch_serving``: one transaction: the project's ``serving`` version -> ``retired``,
  the new one -> ``serving``, plus an AuditEvent (``adapter.promote`` / ``adapter.rollback``).
- ``sync_engines`` (the tick): every engine holds the serving versions and none that is
  retired or rejected (core/engine_protocol.py ``sync_plan``, as the gateway's sync).
- Optional eval gate (``training.eval_gate``, schema in trainer/eval_gate.py): held-out
  prompts, greedy through the engine with the new and the serving adapter, scored by a
  registered verifier (by name); promote only if ``new >= serving - margin``. It fails
  closed: a gate that cannot score (unknown or failing verifier) rejects the candidate.

Every engine call goes through core/engine_http.py and sends ``headers``; by default the
settings' ``engine_headers`` (``Authorization: Bearer <RLGATE_ENGINE_API_KEY>`` when the
engines run with ``--api-key``).
"""

from __future__ import annotations

import logging
from typing import Any

import httpx
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from core import engine_adapters, serving_events
from core import engine_protocol as proto
from core.db import transaction
from core.engine_http import EngineHTTP, RouterError, control_urls
from core.keys import audit
from core.live_adapters import drop_live, make_live
from core.serving_version import BASE, BASE_TARGET_TYPE, adapters_in_service, serving_in
from core.settings import Settings
from schemas.atdp import PolicyStatus, RunStatus
from schemas.coltypes import utcnow
from schemas.tables import PolicyVersionRow, TrainingRunRow
from trainer import time_budget
from trainer.eval_gate import EvalGate, GateConfigError, GateError, resolve, score_output

log = logging.getLogger("rlgate.trainer")
TIMEOUT_S = 660.0  # an unload waits for the requests still using the adapter (600 s)


class PublishError(Exception):
    """An engine refused or could not be reached; the message says which and why."""


class RefusedVersion(ValueError):
    """A version that may not serve (rejected by the eval gate); the message says why."""


def _engine(url: str, timeout: float, headers: dict[str, str] | None) -> EngineHTTP:
    """An engine client sending ``headers``, or the settings' engine key when None."""
    if headers is None:
        from core.settings import get_settings  # the trainer's one Settings object

        headers = get_settings().engine_headers
    return EngineHTTP(url, headers, timeout)


def engines(settings: Settings) -> list[str]:
    """Every engine to load adapters into (core/engine_http.py: the engine list, or the
    operator-named workers behind the router); a router that cannot list them is a
    PublishError."""
    try:
        return control_urls(settings)
    except RouterError as e:
        raise PublishError(str(e)) from e


def serve_from(path: str) -> str:
    """The path engines load the version stored at ``path`` from (created now); a
    version whose files are gone is a PublishError."""
    try:
        return str(make_live(path))
    except OSError as e:
        raise PublishError(f"the adapter files of {path} cannot be served: {e}") from e


def load_everywhere(
    engine_urls: list[str], name: str, path: str, headers: dict[str, str] | None = None
) -> None:
    """Load ``name`` from ``path`` into every engine. An engine that cannot be reached at
    all (dead or restarting) is skipped once another engine has loaded the adapter: one
    dead engine must not hold every publish back, and the adapter syncs load it when it
    is back. An engine that answers and refuses, or no engine loading it, is a
    PublishError."""
    errors, unreachable, loaded = [], [], []
    for url in engine_urls:
        with _engine(url, TIMEOUT_S, headers) as engine:
            try:
                ok, message = engine.load(name, path)
                if ok:  # loaded now, or by an earlier attempt
                    loaded.append(url)
                    continue
                errors.append(f"{url}: {message}")
            except httpx.ConnectError as e:
                unreachable.append(f"{url}: {type(e).__name__}: {e}")
            except (httpx.HTTPError, ValueError) as e:
                errors.append(f"{url}: {type(e).__name__}: {e}")
    if errors or not loaded:
        raise PublishError(f"engine refused adapter {name}: " + "; ".join(errors + unreachable))
    for u in unreachable:
        log.warning("adapter %s not loaded into an unreachable engine (the sync will): %s", name, u)


# one token of one prompt token: enough to bring a loaded adapter into the engine's batch
# memory (SGLang's LoRA memory pool, the embedded engine's per-adapter weights) before the
# switch, so no client request pays its first use
WARM = proto.generate_body([0], proto.Sampling(max_new_tokens=1, values=proto.GREEDY), adapter=None)
WARM_TIMEOUT_S = 10.0


def warm(engine_urls: list[str], name: str, headers: dict[str, str] | None = None) -> None:
    """One greedy token through ``name`` on each engine, by a new version's publish
    (trainer/serving_switch.py), never by an operator's rollback or promote: on an engine
    whose slots are all busy the token waits its turn, and those must answer at once. Best
    effort, within ``WARM_TIMEOUT_S``: an engine that fails it still serves the adapter
    (its first request then pays the first use)."""
    for url in engine_urls:
        try:
            with _engine(url, WARM_TIMEOUT_S, headers) as engine:
                engine.generate({**WARM, "lora_path": name})
        except (httpx.HTTPError, proto.EngineRefused) as e:
            log.warning("warming adapter %s on %s failed (serving it anyway): %s", name, url, e)


def unload_everywhere(
    engine_urls: list[str], name: str, headers: dict[str, str] | None = None
) -> list[str]:
    """Unload ``name`` from every engine (one that does not hold it counts as done);
    returns the failures, which are logged."""
    errors = []
    for url in engine_urls:
        with _engine(url, TIMEOUT_S, headers) as engine:
            try:
                ok, message = engine.unload(name)
                if not ok:
                    errors.append(f"{url}: {message[:300]}")
            except httpx.HTTPError as e:
                errors.append(f"{url}: {e}")
    for e in errors:
        log.warning("unload of %s failed: %s", name, e)
    return errors


def retire(
    engine_urls: list[str], name: str, path: str, headers: dict[str, str] | None = None
) -> list[str]:
    """Take a version out of every engine for good: its live directory first (so no
    engine can re-load it on demand), then the unloads."""
    drop_live(path)
    return unload_everywhere(engine_urls, name, headers)


def sync_engines(
    factory: sessionmaker[Session], engine_urls: list[str], headers: dict[str, str] | None = None
) -> list[str]:
    """Bring every engine to the serving versions (an engine that restarted lacks them)
    and unload retired or rejected ones it still holds; returns 'url:name' loaded or
    '-url:name' unloaded. The serving versions' live directories are (re)created."""
    with factory() as db:
        serving, out = adapters_in_service(db)
    sources = {}
    for name, path in serving.items():
        try:
            sources[name] = serve_from(path)
        except PublishError as e:  # its files are gone: nothing to load it from
            log.warning("serving version %s: %s", name, e)
    done = []
    for url in engine_urls:
        with _engine(url, 30, headers) as engine:
            try:
                plan = engine_adapters.sync_plan(sources, engine.adapters(), out)
            except (httpx.HTTPError, proto.EngineRefused, ValueError):
                continue
        for name, src in plan.load:
            try:
                load_everywhere([url], name, src, headers)
                done.append(f"{url}:{name}")
            except PublishError as e:
                log.warning("%s", e)
        for name in plan.unload:
            if not unload_everywhere([url], name, headers):
                done.append(f"-{url}:{name}")
    return done


def switch_serving(
    factory: sessionmaker[Session],
    project_id: str,
    version_id: str | None,
    *,
    actor: str,
    action: str,
    run_id: str | None = None,
    require_newer: bool = False,
    details: dict[str, Any] | None = None,
) -> str | None:
    """Atomically make ``version_id`` the project's serving version (None: the base model,
    core/serving_version.py ``BASE``: no version serves); returns the name of the version
    it replaced (None if none). ``require_newer``: only if its version number is above the
    serving one (a late publish retry never replaces a newer version). ``details`` are
    added to the audit event (a guard's reason and figures); its ``previous`` is the
    replaced version's name, or ``base``."""
    with transaction(factory) as db:
        target = db.get(PolicyVersionRow, version_id) if version_id is not None else None
        if version_id is not None and (target is None or target.project_id != project_id):
            raise LookupError(f"no policy version {version_id} in project {project_id}")
        others = (*serving_in(project_id), PolicyVersionRow.id != (version_id or ""))
        old = db.scalars(
            select(PolicyVersionRow).where(*others).order_by(PolicyVersionRow.version.desc())
        ).all()
        if require_newer and target is not None and any(o.version > target.version for o in old):
            raise PublishError(
                f"{target.name} is older than the serving {old[0].name}; not promoted"
            )
        db.execute(update(PolicyVersionRow).where(*others).values(status=PolicyStatus.retired))
        if target is not None:
            target.status = PolicyStatus.serving
            target.promoted_at = utcnow()
        serving_events.announce(db, project_id)  # every gateway drops its cached pointer
        if run_id:
            db.execute(
                update(TrainingRunRow)
                .where(TrainingRunRow.id == run_id)
                .values(status=RunStatus.published, error=None, finished_at=utcnow())
            )
        previous = old[0].name if old else None
        what = (
            ("policy_version", target.id, target.name, target.version)
            if target is not None
            else (BASE_TARGET_TYPE, BASE, BASE, 0)
        )
        audit(
            db,
            actor,
            action,
            project_id,
            what[0],
            what[1],
            {
                "name": what[2],
                "version": what[3],
                "previous": previous or BASE,
                "run_id": run_id,
                **(details or {}),
            },
        )
        return previous


# ---- eval gate ----------------------------------------------------------------------


def eval_scores(
    engine_url: str,
    adapters: list[str | None],
    gate: EvalGate,
    headers: dict[str, str] | None = None,
    params: dict[str, Any] | None = None,
    project_id: str = "eval-gate",
    budget_s: float | None = None,
) -> list[tuple[float, int]]:
    """(mean score, abstentions) of each adapter (None: the base model) on the gate's
    prompts: greedy ``/generate`` through the engine, each output scored by the gate's
    registered verifier (an abstention scores 0). :class:`GateError` when the verifier
    is missing, fails, or abstains on every prompt, the engine refuses a prompt (4xx), or
    the scoring runs past ``budget_s`` seconds in all (RLGATE_EVAL_GATE_BUDGET_S: a
    command verifier is killed then); a transport error or 5xx is a
    :class:`PublishError` (retried by the next tick)."""
    verify = resolve(gate.verifier)
    # one batched /generate per kind of prompt for all adapters together (SGLang takes a
    # list of input_ids or of texts, each with its own lora_path), so the engine runs them
    # in one batch instead of one adapter after another
    jobs = [(a, i) for a in range(len(adapters)) for i in range(len(gate.prompts))]
    outputs: dict[tuple[int, int], dict[str, Any]] = {}
    with _engine(engine_url, TIMEOUT_S, headers) as engine:
        for kind in ("input_ids", "text"):
            idx = [
                job
                for job in jobs
                if (gate.prompts[job[1]].input_ids is not None) == (kind == "input_ids")
            ]
            if not idx:
                continue
            batch = [
                list(gate.prompts[i].input_ids or [])
                if kind == "input_ids"
                else gate.prompts[i].prompt
                for _, i in idx
            ]
            # greedy; logprobs returned: the verifier sees a complete Interaction
            greedy = proto.Sampling(max_new_tokens=gate.max_new_tokens, values=proto.GREEDY)
            body = proto.generate_body(batch, greedy, adapter=[adapters[a] for a, _ in idx])
            where = f"eval prompts {idx[0][1]}..{idx[-1][1]}"
            try:
                answer = engine.generate(body)
            except httpx.HTTPError as e:
                raise PublishError(f"{where}: {engine_url}: {type(e).__name__}: {e}") from e
            except proto.EngineRefused as e:
                if 400 <= e.status < 500:
                    raise GateError(f"the engine refused {where}: {e.message[:300]}") from e
                raise PublishError(f"{where}: {engine_url}: {e}") from e
            outputs.update(zip(idx, answer, strict=True))
    with time_budget.within(budget_s):
        return _scores(verify, adapters, gate, outputs, params or {}, project_id, budget_s)


def _scores(
    verify: Any,
    adapters: list[str | None],
    gate: EvalGate,
    outputs: dict[tuple[int, int], dict[str, Any]],
    params: dict[str, Any],
    project_id: str,
    budget_s: float | None,
) -> list[tuple[float, int]]:
    """The scoring part of :func:`eval_scores`, inside its time budget."""
    results = []
    for a, adapter in enumerate(adapters):
        total, abstained = 0.0, 0
        for i, item in enumerate(gate.prompts):
            out = outputs[(a, i)]
            if time_budget.remaining() == 0.0:
                raise GateError(_over(budget_s, i))
            try:
                score = score_output(
                    verify, gate.verifier, params, i, item, adapter, out, project_id
                )
            except GateError as e:
                if isinstance(e.__cause__, time_budget.OverBudget):
                    raise GateError(_over(budget_s, i)) from e
                raise
            if score is None:
                abstained += 1
            else:
                total += score
        if abstained == len(gate.prompts):
            raise GateError(
                f"verifier {gate.verifier!r} abstained on every eval prompt (give each prompt "
                "an 'expected' value the verifier can check)"
            )
        results.append((total / len(gate.prompts), abstained))
    return results


def _over(budget_s: float | None, index: int) -> str:
    return (
        f"the eval gate's scoring ran past its time budget of {budget_s:g} s "
        f"(RLGATE_EVAL_GATE_BUDGET_S) at eval prompt {index}: use fewer eval prompts or "
        "a faster verifier"
    )


def eval_gate(
    engine_url: str,
    new: str,
    serving: str | None,
    gate: dict[str, Any],
    headers: dict[str, str] | None = None,
    *,
    project_settings: dict[str, Any] | None = None,
    project_id: str = "eval-gate",
    budget_s: float | None = None,
) -> tuple[bool, dict[str, Any]]:
    """(promote?, metrics). Off unless ``gate["enabled"]``. Scores the new and the serving
    adapter (None: the base model); promotes only if ``new >= serving - margin``. Fails
    closed: settings that do not validate, an unknown verifier, a verifier that raises or
    always abstains, an engine refusing a prompt, or scoring past ``budget_s`` ->
    (False, ``{"eval_error": why}``).
    The verifier's parameters come from the project's ``settings["verifiers"]`` only."""
    try:
        cfg = EvalGate.parse(gate)
    except GateConfigError as e:
        return False, {"eval_error": f"eval_gate settings invalid: {e}"}
    if not cfg.enabled:
        return True, {}
    from trainer.verifiers import project_params  # the worker's Celery app; not at import

    params = project_params(project_settings, cfg.verifier)
    metrics: dict[str, Any] = {
        "eval_verifier": cfg.verifier,
        "eval_prompts": len(cfg.prompts),
        "eval_margin": cfg.margin,
        "eval_serving_adapter": serving or BASE,
    }
    try:
        scores = eval_scores(engine_url, [new, serving], cfg, headers, params, project_id, budget_s)
        (new_score, new_abstained), (old_score, old_abstained) = scores
    except GateError as e:
        log.warning("eval gate failed closed for %s: %s", new, e)
        return False, {**metrics, "eval_error": str(e)}
    ok = new_score >= old_score - cfg.margin
    return ok, {
        **metrics,
        "eval_new": new_score,
        "eval_serving": old_score,
        "eval_abstained_new": new_abstained,
        "eval_abstained_serving": old_abstained,
    }
