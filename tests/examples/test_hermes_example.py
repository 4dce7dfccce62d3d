"""examples/hermes without network, Hermes or a gateway: the tools of its Hermes plugin,
the tasks and the simulated user's ratings, the Hermes config it writes, the plot."""

from __future__ import annotations

import importlib.util
import json
import random
import sys
import tempfile
from pathlib import Path
from types import ModuleType

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "hermes"


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def run() -> ModuleType:
    return _load("hermes_example_run", EXAMPLE / "run.py")


@pytest.fixture(scope="module")
def runner(run: ModuleType) -> ModuleType:
    """hermes_runner.py, which run.py imports from its own folder."""
    return sys.modules["hermes_runner"]


@pytest.fixture(scope="module")
def plugin() -> ModuleType:
    return _load(
        "hermes_example_calc_tools", EXAMPLE / "hermes_plugin" / "calc_tools" / "__init__.py"
    )


def test_calculator(plugin: ModuleType) -> None:
    assert json.loads(plugin.handle_calculator({"expression": "37*41"})) == {"result": "1517"}
    assert json.loads(plugin.handle_calculator({"expression": "(12+5)/4"})) == {"result": "4.25"}
    assert json.loads(plugin.handle_calculator({"expression": "2^10"})) == {"result": "1024"}
    assert "error" in json.loads(plugin.handle_calculator({"expression": "__import__('os')"}))
    assert "error" in json.loads(plugin.handle_calculator({"expression": "1/0"}))


def test_convert_units(plugin: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "tools.jsonl"
    monkeypatch.setenv("CALC_TOOLS_LOG", str(log))
    out = json.loads(
        plugin.handle_convert_units({"value": 12, "from_unit": "miles", "to_unit": "km"})
    )
    assert out == {"result": "19.3121", "unit": "km"}
    assert plugin.convert(20, "C", "F") == pytest.approx(68.0)
    assert plugin.convert(1, "gal", "l") == pytest.approx(3.785411784)
    bad = json.loads(plugin.handle_convert_units({"value": 1, "from_unit": "kg", "to_unit": "km"}))
    assert "cannot convert mass to length" in bad["error"]
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert [c["tool"] for c in calls] == ["convert_units", "convert_units"]


def test_plugin_registers_the_calc_toolset(plugin: ModuleType) -> None:
    registered: list[tuple[str, str]] = []

    class Ctx:
        def register_tool(self, *, name: str, toolset: str, **_: object) -> None:
            registered.append((name, toolset))

    plugin.register(Ctx())
    assert registered == [("calculator", "calc"), ("convert_units", "calc")]
    manifest = yaml.safe_load(
        (EXAMPLE / "hermes_plugin" / "calc_tools" / "plugin.yaml").read_text()
    )
    assert manifest["name"] == "calc_tools"
    assert set(manifest["provides_tools"]) == {"calculator", "convert_units"}


def test_tasks_and_ratings(run: ModuleType) -> None:
    rng = random.Random(0)
    tasks = [run.make_task(rng) for _ in range(200)]
    assert {t.kind for t in tasks} == {"add", "mul", "convert"}
    mul = run.Task("mul", "What is 48 * 24?", 1152.0)
    assert run.rate("48 * 24 = 1,152.", mul, False) == (5, "correct")
    assert run.rate("48 * 24 = 1156", mul, False)[0] == 2  # arithmetic must be exact
    assert run.rate("I could not compute it", mul, True)[0] == 3
    assert run.rate("", mul, False)[0] == 1
    conv = run.Task("convert", "Convert 12 miles to km.", 19.312128, rel_tol=5e-3)
    assert run.rate("12 miles is about 19.3 km", conv, True)[0] == 5
    assert run.rate("19 km", conv, True)[0] == 3
    assert [run.stars_to_reward(s) for s in (1, 2, 3, 5)] == [-1.0, -0.5, 0.0, 1.0]


def test_hermes_home(run: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "mkdtemp", lambda prefix: str(tmp_path / "h"))
    hermes = run.Hermes("hermes", "http://gw:8000/", 256, 4, "\n\n")
    cfg = yaml.safe_load((hermes.home / "config.yaml").read_text())
    provider = cfg["providers"][cfg["model"]["provider"]]
    assert provider["base_url"] == "http://gw:8000/v1"
    assert provider["key_env"] == "RLGATE_SESSION_KEY"
    assert provider["extra_body"] == {"stop": ["\n\n"]}
    assert cfg["model"]["max_tokens"] == 256 and cfg["agent"]["max_turns"] == 4
    assert cfg["plugins"]["enabled"] == ["calc_tools"]
    assert (hermes.home / "plugins" / "calc_tools" / "plugin.yaml").exists()
    assert (hermes.home / "SOUL.md").read_text().startswith("You are a precise assistant")
    monkeypatch.setattr(tempfile, "mkdtemp", lambda prefix: str(tmp_path / "h2"))
    no_stop = run.Hermes("hermes", "http://gw:8000", 512, 6, "")
    cfg = yaml.safe_load((no_stop.home / "config.yaml").read_text())
    assert cfg["providers"]["rlgate"]["extra_body"] == {}
    hermes.cleanup()
    assert not (tmp_path / "h").exists()


def test_summary_and_plot(run: ModuleType, tmp_path: Path) -> None:
    record = run.Record(started_at="now", args={})
    for i in range(10):
        version = "base" if i < 5 else "default-policy-v1"
        stars = 5 if i % 3 == 0 else 2
        record.points.append(
            run.Point(
                index=i,
                t_s=float(i),
                kind="mul",
                prompt="q",
                expected=1.0,
                answer="a",
                stars=stars,
                reward=run.stars_to_reward(stars),
                comment="",
                used_tool=i % 2 == 0,
                turns=1,
                policy_version=version,
                session_id=f"s{i}",
                hermes_seconds=1.0,
                hermes_exit=0,
            )
        )
    record.training.append(
        run.TrainEvent(5, 5.0, "run_1", "published", 5, "default-policy-v1", 3.0, None)
    )
    rows = run.summary(record.points)
    assert [r["policy_version"] for r in rows] == ["base", "default-policy-v1"]
    assert rows[0]["tasks"] == 5 and rows[0]["correct"] == 2 and rows[0]["used_tool"] == 3
    run.plot(record, tmp_path / "reward.png")
    assert (tmp_path / "reward.png").read_bytes()[:4] == b"\x89PNG"


class _Gateway:
    def __init__(self, turns: int) -> None:
        self.turns = turns
        self.rated: list[tuple[str, int, str]] = []
        self.ended: list[str] = []

    def session(self, sid: str) -> dict:
        return {"interactions": [{"policy_version": "default-policy-v1"}] * self.turns}

    def rate(self, sid: str, stars: int, comment: str) -> dict:
        self.rated.append((sid, stars, comment))
        return {}

    def end_session(self, sid: str) -> None:
        self.ended.append(sid)


class _Hermes:
    def __init__(self, result: object) -> None:
        self.result = result

    def run(self, prompt: str, key: str, index: int, timeout_s: float) -> object:
        assert key == "rlg_agent_session"
        return self.result


def test_run_task(run: ModuleType, runner: ModuleType) -> None:
    task = run.Task("mul", "What is 37 * 41?", 1517.0)
    sess = {"id": "sess_1", "api_key": "rlg_agent_session", "project_id": "default"}
    ok = runner.HermesRun("37 * 41 = 1517", 0, 2.0, [{"tool": "calculator"}], {}, "")
    gw = _Gateway(turns=2)
    point = run.run_task(gw, _Hermes(ok), task, sess, 0, 0.0, 10)
    assert (point.stars, point.reward, point.used_tool, point.turns) == (5, 1.0, True, 2)
    assert point.policy_version == "default-policy-v1"
    assert gw.rated == [("sess_1", 5, "correct")] and gw.ended == ["sess_1"]

    failed = runner.HermesRun("HTTP 400: too long", 0, 1.0, [], {"failed": True}, "")
    gw = _Gateway(turns=1)
    point = run.run_task(gw, _Hermes(failed), task, sess, 1, 0.0, 10)
    assert point.stars == 1 and gw.rated[0][2] == "agent failed (exit 0): HTTP 400: too long"

    gw = _Gateway(turns=0)  # never reached the model: nothing to rate, the session ends
    point = run.run_task(gw, _Hermes(failed), task, sess, 2, 0.0, 10)
    assert gw.rated == [] and gw.ended == ["sess_1"] and point.policy_version == "-"
