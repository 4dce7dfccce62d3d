"""A shortened `rlgate demo` (until its first swap, not 20 minutes): the whole product on
real parts.

The embedded engine with the real model, the gateway, a real Celery worker with its beat
schedule on the embedded SQLite broker, the OpenAI SDK over HTTP, feedback through
`POST /feedback`, training, hot swap. Asserts the pipeline trained and swapped in at least
one adapter, that the held-out set was evaluated before and after, and that gateway
responses after the swap were recorded with the new policy version. It does not assert
the accuracy target: that is a benchmark (see README), not a test.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys

from tests.servers import MODEL_CACHE, REPO, free_port


def test_short_demo_trains_and_swaps(tmp_path):
    data = tmp_path / "data"
    (data / "demo").mkdir(parents=True)
    (data / "demo" / "models").symlink_to(MODEL_CACHE / "models")  # no second conversion
    out = tmp_path / "out"
    env = {**os.environ, "RLGATE_DATA_DIR": str(data), "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlgate.cli",
            "demo",
            "--minutes",
            "5",
            "--eval-size",
            "8",
            "--port",
            str(free_port()),
            "--engine-port",
            str(free_port()),
            "--out",
            str(out),
            "--until-swap",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    curve = json.loads((out / "curve.json").read_text())
    versions = [p["policy_version"] for p in curve["points"]]
    # --until-swap: the base model's point, then the first adapter's, and the run ends
    assert len(versions) == 2 and versions[0] == "base" and versions[1] != "base", versions
    swapped = versions[1:]
    assert (out / "curve.png").stat().st_size > 1000

    db = sqlite3.connect(data / "demo" / "rlgate.db")
    served = {r[0] for r in db.execute("select distinct policy_version from interactions")}
    assert swapped[0] in served  # the next gateway responses carry the new version
    runs = db.execute("select status from training_runs where status = 'published'").fetchall()
    assert runs


def test_demo_verifier_credits_only_the_exact_number():
    """1 for exactly the number, 0 for anything else: no format or closeness credit that
    a constant answer, or an equation that never answers tersely, could collect."""
    from rlgate.demo_task import score

    assert score("24", 24) == 1.0
    assert score(" 24.\n", 24) == 1.0
    assert score("5 + 19 = 24", 24) == score("= 24", 24) == 0.0
    assert score("23", 24) == score("7", 24) == score("24", 25) == 0.0
    assert score("I think it is twenty-four", 24) == 0.0
    assert score(None, 24) == 0.0


def test_demo_prompt_carries_one_worked_example_never_asked():
    from rlgate.demo_task import EXAMPLE, messages, split_pairs

    chat = messages(5, 17)
    assert [m["role"] for m in chat] == ["user", "assistant", "user"]
    assert chat[1]["content"] == str(sum(EXAMPLE)) and "5 + 17" in chat[2]["content"]
    train, held_out, validation = split_pairs(50, seed=1)
    assert EXAMPLE not in train + held_out + validation


def test_demo_starts_from_a_fresh_state(tmp_path):
    """An earlier run's database, adapters and logs are cleared (a run never starts from
    the adapter an earlier one left serving); the model cache and curves stay."""
    from rlgate.demo_curve import fresh_state

    demo = tmp_path / "demo"
    for d in ("adapters/demo-policy-v3", "logs", "spool", "out", "models/m"):
        (demo / d).mkdir(parents=True)
    for f in ("rlgate.db", "broker.db", "out/curve.json", "models/m/config.json"):
        (demo / f).write_text("x")
    fresh_state(demo)
    assert sorted(p.name for p in demo.iterdir()) == ["models", "out"]
    assert (demo / "out/curve.json").exists() and (demo / "models/m/config.json").exists()
    fresh_state(tmp_path / "missing")  # nothing to clear


def test_demo_splits_are_disjoint_and_seeded():
    """The eval gate's validation questions are never the held-out ones the curve reports,
    nor training questions; --seed changes the split."""
    from rlgate.demo_task import split_pairs

    train, held_out, validation = split_pairs(50, seed=1)
    assert len(held_out) == 50 and len(validation) == 32 and len(train) == 399 - 82
    assert not set(train) & set(held_out) and not set(train) & set(validation)
    assert not set(held_out) & set(validation)
    assert split_pairs(50, seed=1) == (train, held_out, validation)
    assert split_pairs(50, seed=2)[1] != held_out


def test_demo_training_settings_are_the_defaults_but_tempo():
    """The demo trains with trainer/config.py's defaults (README: only the tempo, the seed
    and the eval gate differ), and its eval gate validates with a registered verifier."""
    from rlgate.demo_task import GATE_SIZE, TRAINING, eval_gate
    from tests.servers import MODEL_CACHE
    from trainer.config import TrainConfig
    from trainer.eval_gate import EvalGate
    from trainer.verifiers import get_verifier

    assert set(TRAINING) <= {"schedule_minutes", "threshold", "min_samples", "max_samples"}
    gate = eval_gate(MODEL_CACHE / "models" / "smollm2-135m-instruct", [(2, 3)] * GATE_SIZE)
    cfg = TrainConfig.from_project_settings(
        {"training": {**TRAINING, "seed": 3, "eval_gate": gate}}
    )
    parsed = EvalGate.parse(cfg.eval_gate)
    assert parsed.enabled and get_verifier(parsed.verifier) is not None
    assert parsed.prompts[0].expected == 5 and parsed.prompts[0].input_ids
