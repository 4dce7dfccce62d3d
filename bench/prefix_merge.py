"""Prefix merge: training runs on recorded multi-turn tool-style sessions, each session's
turns forwarded as one sequence (``merge_turns`` on) vs one row per turn (off).

    python bench/prefix_merge.py [--questions 4] [--sessions 4] [--turns 4] [--pairs 2]
    python bench/prefix_merge.py --db sqlite:////tmp/x/rlgate.db --project P   # reuse
    python bench/prefix_merge.py --db sqlite:///demo.db --project demo --max-samples 64

Recording (real traffic, not synthetic ids): an embedded engine (packaged SmolLM2-135M)
and a gateway on a fresh SQLite database. A scripted agent runs ``--sessions`` sessions per
question (``X-Session-Id``), each ``--turns`` requests with two tools in the request
(``lookup``, ``add``; the gateway renders them Hermes-style). After every answer the next
request of the session resends the history with the assistant message as the gateway
returned it (content and parsed ``tool_calls``) and a ``tool`` message: the results of
the calls the model made, or, when it made none, the ``lookup`` result the task needs
(the base model rarely emits a parseable call; the script then plays the tool-using
framework). Each session then gets one rating at its end through ``POST /feedback``
(a thumbs up, reward +1, when the last answer contains the right number, else a
thumbs down, -1), and the product's
credit assignment (gamma 0.8) carries it to the turns.

Training: the recorded rows as a run selects them (trainer/data.py, advantages as in a
run), the default TrainConfig; the same run with ``merge_turns`` on and off, alternated
(on, off, off, on, ...) in one process, each from a freshly loaded model. Printed per
run: wall time, tokens forwarded (all passes: proximal, base-model KL, training), merged
turns, steps; then the ratios and the largest step-loss difference between the modes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from core.db import make_engine, session_factory, transaction  # noqa: E402
from core.keys import create_key  # noqa: E402
from schemas.tables import InteractionRow, ProjectRow  # noqa: E402

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "The price of an item in the shop's catalogue",
            "parameters": {
                "type": "object",
                "properties": {"item": {"type": "string"}},
                "required": ["item"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    },
]
ITEMS = ["apple", "kettle", "lamp", "pencil", "rope", "scarf", "teapot", "wrench"]


def _price(item: str) -> int:
    return 3 + 7 * (sum(map(ord, item)) % 13)


def _tool_result(name: str, args: dict[str, Any], item: str) -> str:
    if name == "add":
        try:
            return str(int(args.get("a", 0)) + int(args.get("b", 0)))
        except (TypeError, ValueError):
            return "error: a and b must be integers"
    return json.dumps({"item": args.get("item", item), "price": _price(str(args.get("item")))})


def _session(gw: str, key: str, sid: str, q: int, turns: int, seed: int) -> dict[str, Any]:
    item, extra = ITEMS[q % len(ITEMS)], 2 + q
    ask = f"How much do a {item} and {extra} more coins cost? Use the tools."
    messages: list[dict[str, Any]] = [{"role": "user", "content": ask}]
    headers = {"Authorization": f"Bearer {key}", "X-Session-Id": sid}
    calls_made, internal_sid, text = 0, None, ""
    with httpx.Client(base_url=gw, headers=headers, timeout=300) as client:
        for t in range(turns):
            body = {
                "model": "rlgate-policy",
                "messages": messages,
                "tools": TOOLS,
                "temperature": 1.0,
                "max_tokens": 40,
                "seed": seed * 100 + t,
            }
            r = client.post("/v1/chat/completions", json=body)
            r.raise_for_status()
            internal_sid = r.headers.get("x-rlgate-session-id")
            msg = r.json()["choices"][0]["message"]
            text = msg.get("content") or ""
            calls = msg.get("tool_calls") or []
            calls_made += len(calls)
            reply: dict[str, Any] = {"role": "assistant", "content": msg.get("content")}
            if calls:
                reply["tool_calls"] = calls
            messages.append(reply)
            if t == turns - 1:
                break
            if calls:
                for c in calls:
                    try:
                        args = json.loads(c["function"]["arguments"] or "{}")
                    except ValueError:
                        args = {}
                    result = _tool_result(c["function"]["name"], args, item)
                    messages.append({"role": "tool", "tool_call_id": c["id"], "content": result})
            else:
                result = _tool_result("lookup", {"item": item}, item)
                messages.append({"role": "tool", "tool_call_id": f"call_{t}", "content": result})
        reward = 1.0 if str(_price(item) + extra) in text else -1.0
        fb = client.post("/feedback", json={"session_id": internal_sid, "value": reward > 0})
        fb.raise_for_status()
    return {"tool_calls": calls_made, "reward": reward}


def record(args: argparse.Namespace) -> tuple[str, str]:
    from core.migrate import upgrade
    from tests.servers import MODEL_CACHE, engine_cmd, free_port, gateway, running

    data = Path(args.keep or tempfile.mkdtemp(prefix="prefix-merge-"))
    data.mkdir(parents=True, exist_ok=True)
    db_url = f"sqlite:///{data / 'rlgate.db'}"
    upgrade(db_url)
    factory = session_factory(make_engine(db_url))
    project = "pmerge"
    with transaction(factory) as db:
        _, key = create_key(db, project, "agent")
        p = db.get(ProjectRow, project)
        assert p is not None
        p.settings = {**(p.settings or {}), "credit_assignment": {"gamma": 0.8}}
    port = free_port()
    cmd = engine_cmd(port, "--context-length", "2048", "--max-running-requests", "8")
    started = time.perf_counter()
    with running(cmd, {}, data / "engine.log", port) as eng, gateway(data, db_url, eng.url) as gw:
        jobs = [(q, s) for q in range(args.questions) for s in range(args.sessions)]
        with ThreadPoolExecutor(8) as pool:
            results = list(
                pool.map(
                    lambda j: _session(
                        gw.url, key, f"q{j[0]}s{j[1]}", j[0], args.turns, j[0] * 50 + j[1]
                    ),
                    jobs,
                )
            )
        time.sleep(2)  # the recorder's last writes
    print(
        f"recorded {len(jobs)} sessions x {args.turns} turns in "
        f"{time.perf_counter() - started:.0f} s: {sum(r['tool_calls'] for r in results)} tool "
        f"calls by the model, {sum(r['reward'] > 0 for r in results)} sessions rated +1 "
        f"(data: {data}, model cache {MODEL_CACHE})",
        flush=True,
    )
    return db_url, project


def samples_of(db_url: str, project: str, max_kept: int | None = None) -> list[Any]:
    from trainer.advantages import Baselines, compute_advantages
    from trainer.config import TrainConfig
    from trainer.data import select_samples

    cfg = TrainConfig()
    factory = session_factory(make_engine(db_url))
    with factory() as db:
        rated = db.query(InteractionRow).filter(InteractionRow.reward.is_not(None)).count()
        sel = select_samples(
            db, project, max_staleness=2, max_samples=8192, group_by_prompt=cfg.group_by_prompt
        )
    kept, _, stats = compute_advantages(
        sel.samples, Baselines(), max_kept=max_kept or cfg.max_samples
    )
    print(f"{rated} rated rows, {len(sel.samples)} selected, {len(kept)} kept ({vars(stats)})")
    return kept


def one_run(samples: list[Any], merge: bool) -> dict[str, Any]:
    import torch

    from engine.model_files import PACKAGED_MODEL, resolve_model_dir
    from tests.servers import MODEL_CACHE
    from trainer.config import TrainConfig
    from trainer.merge import chains
    from trainer.policy import Policy
    from trainer.runner import run_metrics
    from trainer.train import train

    torch.manual_seed(0)
    cfg = TrainConfig(merge_turns=merge)
    policy = Policy.load(resolve_model_dir(PACKAGED_MODEL, MODEL_CACHE), cfg)
    opt = policy.make_optimizer(cfg, None)
    started = time.perf_counter()
    steps = train(policy, opt, samples, cfg, progress=False)
    wall = time.perf_counter() - started
    m = run_metrics(steps, 0.0)
    rows = chains(samples)
    return {
        "merge": merge,
        "wall_s": wall,
        "forward_tokens": m["forward_tokens"],
        "saved": m["forward_tokens_saved"],
        "merged_turns": m["merged_turns"],
        "steps": len(steps),
        "losses": [s["loss"] for s in steps],
        "sessions_as_rows": sum(len(r) > 1 for r in rows),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--questions", type=int, default=4)
    ap.add_argument("--sessions", type=int, default=4, help="sessions per question")
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--pairs", type=int, default=2, help="merged/per-turn run pairs")
    ap.add_argument("--keep", help="data dir to record into (kept)")
    ap.add_argument("--db", help="a recorded database URL: skip recording")
    ap.add_argument("--project", default="pmerge")
    ap.add_argument(
        "--max-samples", type=int, default=0, help="samples per run (0: the default config's)"
    )
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = ap.parse_args()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    db_url, project = (args.db, args.project) if args.db else record(args)
    samples = samples_of(db_url, project, args.max_samples or None)
    from trainer.merge import chains

    rows = chains(samples)
    extending = sum(len(r) - 1 for r in rows)
    print(
        f"{len(samples)} turns: {extending} extend the turn before them token-exactly, "
        f"{sum(len(r) > 1 for r in rows)} merged rows, {len(rows)} rows in all",
        flush=True,
    )
    order = [m for i in range(args.pairs) for m in ((True, False) if i % 2 == 0 else (False, True))]
    runs = []
    for merge in order:
        r = one_run(samples, merge)
        runs.append(r)
        print(
            f"  merge={'on ' if merge else 'off'} {r['wall_s']:7.1f} s  "
            f"{r['forward_tokens']:>8,} tokens forwarded  ({r['saved']:,} saved, "
            f"{r['merged_turns']} merged turns, {r['steps']} steps)",
            flush=True,
        )
    on = [r for r in runs if r["merge"]]
    off = [r for r in runs if not r["merge"]]
    wall_on, wall_off = (statistics.median(r["wall_s"] for r in rs) for rs in (on, off))
    tok_on, tok_off = on[0]["forward_tokens"], off[0]["forward_tokens"]
    diff = max(
        abs(a - b)
        for x, y in zip(on, off, strict=True)
        for a, b in zip(x["losses"], y["losses"], strict=False)
    )
    print(
        f"tokens forwarded per run: {tok_on:,} merged vs {tok_off:,} per turn = "
        f"{tok_off / tok_on:.2f}x fewer; wall time (median of {len(on)}): {wall_on:.1f} s vs "
        f"{wall_off:.1f} s = {wall_off / wall_on:.2f}x faster; "
        f"largest step-loss difference {diff:.2e}"
    )


if __name__ == "__main__":
    main()
