"""A shortened `rlgate demo` (minutes, not 20): the whole product on real parts.

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
            "gateway.cli",
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
            "--require-swap",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    curve = json.loads((out / "curve.json").read_text())
    versions = [p["policy_version"] for p in curve["points"]]
    assert versions[0] == "base" and len(curve["points"]) >= 2
    swapped = [v for v in versions[1:] if v != "base"]
    assert swapped, versions
    assert (out / "curve.png").stat().st_size > 1000

    db = sqlite3.connect(data / "demo" / "rlgate.db")
    served = {r[0] for r in db.execute("select distinct policy_version from interactions")}
    assert swapped[0] in served  # the next gateway responses carry the new version
    runs = db.execute("select status from training_runs where status = 'published'").fetchall()
    assert runs


def test_demo_verifier_prefers_the_bare_right_number():
    from gateway.demo import score

    assert score("24", 24) == 1.0
    assert score(" 24.\n", 24) == 1.0
    assert 0.25 < score("5 + 19 = 24", 24) < score("= 24", 24) < 1.0  # shorter is better
    assert score("23", 24) == score("7", 24) == 0.1  # the format, not closeness
    assert score("5 + 19 = 23", 24) == 0.0
    assert score("I think it is twenty-four", 24) == 0.0
    assert score(None, 24) == 0.0
