"""Training settings are a strict schema: every field typed and bounded, the eval gate a
strict sub-schema that names a verifier only by its registered name. No database or
engine: these are the checks the admin API and every run apply."""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, fields
from pathlib import Path

import pytest

from trainer.config import BOUNDS, CHOICES, TrainConfig, TrainConfigError, settings_table
from trainer.eval_gate import (
    MAX_NEW_TOKENS,
    MAX_PROMPT_CHARS,
    MAX_PROMPTS,
    EvalGate,
    GateConfigError,
    require_registered,
)
from trainer.loss import LossConfig

REPO = Path(__file__).resolve().parents[2]
NUMBER_TYPES = ("int", "float", "int | None", "float | None")
OTHER_CHECKED = {"betas", "target_modules", "eval_gate", *CHOICES}  # checked by their own rule


def load(**training: object) -> TrainConfig:
    return TrainConfig.from_project_settings({"training": training})


def gate(**kw: object) -> dict[str, object]:
    return {"enabled": True, "verifier": "exact_number", "prompts": [{"prompt": "2+2?"}], **kw}


def test_every_field_has_a_rule_and_the_defaults_keep_them() -> None:
    for f in fields(TrainConfig):
        assert f.metadata.get("help"), f"{f.name} has no help: declare it with knob(help=...)"
        if str(f.type) in NUMBER_TYPES:
            assert f.name in BOUNDS, f"number field {f.name} has no bounds in its knob()"
        elif str(f.type) == "str":
            assert f.name in CHOICES, f"text field {f.name} has no choices in its knob()"
        elif str(f.type) != "bool":
            assert f.name in OTHER_CHECKED, f"{f.name} ({f.type}) has no validation rule"
            assert f.metadata.get("rule"), f"{f.name} has no rule text for the docs table"
    assert set(BOUNDS) <= {f.name for f in fields(TrainConfig)}  # no stale entries
    TrainConfig().check()  # the defaults lie inside the bounds


def test_the_loss_knobs_are_the_train_configs() -> None:
    """One declaration: TrainConfig inherits the loss's knobs, defaults and all (kl_coef's
    effective default is 0.02 whether the loss is called directly or through a run)."""
    loss_fields = {f.name: f for f in fields(LossConfig)}
    train_fields = {f.name: f for f in fields(TrainConfig)}
    assert isinstance(TrainConfig(), LossConfig)
    for name, f in loss_fields.items():
        assert train_fields[name] is f
    assert LossConfig().kl_coef == TrainConfig().kl_coef == 0.02


def test_docs_table_lists_exactly_the_fields_with_their_defaults() -> None:
    """docs/trainer.md holds settings_table() verbatim between its markers: every field,
    no other, with its default and range (regenerate: python -m trainer.config)."""
    text = (REPO / "docs" / "trainer.md").read_text()
    begin, end = "<!-- knobs:begin -->\n", "<!-- knobs:end -->"
    assert begin in text and end in text
    table = text.split(begin, 1)[1].split(end, 1)[0]
    assert table == settings_table(), "docs/trainer.md: paste `python -m trainer.config`"
    listed = re.findall(r"^\| `([a-z_0-9]+)` \| `([^`]*)` \|", table, flags=re.M)
    assert [n for n, _ in listed] == [f.name for f in fields(TrainConfig)]
    defaults = asdict(TrainConfig())
    for name, default in listed:
        assert json.loads(default) == json.loads(json.dumps(defaults[name])), name


@pytest.mark.parametrize("name", sorted(BOUNDS))
def test_each_bound_rejects_just_outside_and_accepts_the_edges(name: str) -> None:
    lo, hi = BOUNDS[name]
    kind = next(str(f.type) for f in fields(TrainConfig) if f.name == name)
    is_int = kind.startswith("int")
    step = 1 if is_int else max(abs(hi) * 1e-6, 1e-9)
    companions: dict[str, object] = {}
    if name == "lora_rank":
        companions["max_lora_rank"] = 256
    if name == "max_lora_rank":
        companions["lora_rank"] = 1
    if name in ("epochs", "max_samples"):
        companions.update(max_samples=1, epochs=1)
    if name == "step_delay_s":  # the run-size limit multiplies it by the step count
        companions.update(epochs=1, num_minibatches=1)
    for edge in (lo, hi):
        load(**{**companions, name: int(edge) if is_int else edge})
    for bad in (lo - step, hi + step):
        value = int(bad) if is_int else bad
        with pytest.raises(TrainConfigError, match=re.escape(name)) as e:
            load(**{**companions, name: value})
        assert "between" in str(e.value)


@pytest.mark.parametrize(
    ("training", "fragment"),
    [
        ({"epochs": 10_000}, "epochs must be between 1 and 20"),
        ({"micro_batch_tokens": 10**9}, "micro_batch_tokens must be between"),
        ({"step_delay_s": 1e9}, "step_delay_s must be between"),
        ({"max_samples": 10**7}, "max_samples must be between"),
        ({"lr": math.nan}, "lr must be between"),
        ({"lr": math.inf}, "lr must be between"),
        ({"epochs": 20, "max_samples": 8192}, "epochs x max_samples"),
        ({"step_delay_s": 60, "epochs": 20}, "step_delay_s x epochs x num_minibatches"),
        ({"epochs": "3"}, "epochs must be an integer"),
        ({"epochs": True}, "epochs must be an integer"),
        ({"lr": None}, "lr must be a value"),
        ({"entropy_floor": "low"}, "entropy_floor must be a number"),
        ({"betas": [0.9, 1.5]}, "betas must be two numbers in [0, 1)"),
        ({"betas": [0.9]}, "betas must be a list of two numbers"),
        ({"aggregation": "sum"}, "aggregation must be one of"),
        ({"target_modules": ["q_proj", "lm_head"]}, "target_modules"),
        ({"target_modules": "q_proj"}, "target_modules must be a list"),
        ({"eval_gate": []}, "eval_gate must be an object"),
        ({"nonsense": 1}, "unknown training settings"),
    ],
)
def test_bad_settings_say_what_to_fix(training: dict[str, object], fragment: str) -> None:
    with pytest.raises(TrainConfigError) as e:
        load(**training)
    assert fragment in str(e.value)


def test_nullable_fields_take_null_and_numbers() -> None:
    assert load(entropy_floor=1.5).entropy_floor == 1.5  # default None, still a number field
    assert load(behav_weight_cap=None).behav_weight_cap is None
    assert load(kl_prox_target=None).kl_prox_target is None


def test_eval_gate_is_a_strict_schema() -> None:
    parsed = EvalGate.parse(
        gate(
            prompts=[
                {"prompt": "What is 2+2?", "expected": 4},
                {"input_ids": [1, 2, 3], "expected": "blue", "task_id": "colors"},
            ],
            max_new_tokens=16,
            margin=0.1,
        )
    )
    assert parsed.enabled and parsed.verifier == "exact_number" and len(parsed.prompts) == 2
    assert parsed.prompts[1].input_ids == (1, 2, 3) and parsed.margin == 0.1
    assert EvalGate.parse({}) == EvalGate()  # off by default
    assert load(eval_gate=gate()).eval_gate["verifier"] == "exact_number"


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        (gate(verifier="pydoc:pipepager"), "registered verifier"),
        (gate(verifier="os.system"), "registered verifier"),  # a shape test passes; see below
        (gate(verifier=["exact_number"]), "registered verifier"),
        (gate(enabled="yes"), "enabled must be true or false"),
        (gate(command="id"), "unknown keys ['command']"),
        (gate(prompts=[]), "must not be empty"),
        (gate(prompts=[{"prompt": "x"}] * (MAX_PROMPTS + 1)), f"at most {MAX_PROMPTS}"),
        (gate(prompts=[{"prompt": "x" * (MAX_PROMPT_CHARS + 1)}]), "prompt must be text"),
        (gate(prompts=[{"prompt": "x", "input_ids": [1]}]), "exactly one of"),
        (gate(prompts=[{"input_ids": [1, -2]}]), "input_ids must be a list"),
        (gate(prompts=[{"input_ids": [1] * 5000}]), "input_ids must be a list"),
        (gate(prompts=[{"touch /tmp/x; true": 1, "prompt": "hi"}]), "unknown keys"),
        (gate(prompts=[{"prompt": "x", "expected": {"a": 1}}]), "expected must be text"),
        (gate(prompts=["just text"]), "must be an object"),
        (gate(max_new_tokens=MAX_NEW_TOKENS + 1), "max_new_tokens must be an integer"),
        (gate(max_new_tokens=0), "max_new_tokens must be an integer"),
        (gate(margin=5), "margin must be a number in 0..2"),
        (gate(margin=-0.1), "margin must be a number"),
    ],
)
def test_eval_gate_rejects(raw: dict[str, object], fragment: str) -> None:
    if raw.get("verifier") == "os.system":  # a well-formed name, but not a registered one
        EvalGate.parse(raw)
        with pytest.raises(GateConfigError, match="no verifier 'os.system' is registered"):
            require_registered(raw)
        return
    with pytest.raises(GateConfigError) as e:
        EvalGate.parse(raw)
    assert fragment in str(e.value)
    with pytest.raises(TrainConfigError):  # the same check when the whole config loads
        load(eval_gate=raw)


def test_registered_names_pass_the_admin_check() -> None:
    for name in ("exact_number", "contains", "command"):
        require_registered(gate(verifier=name))
    require_registered({})  # no gate: nothing to check


# Code importing by a string that could come from data (anything but a literal module
# name): only the verifier registry (installed entry points) may resolve names to code.
IMPORT_BY_NAME = re.compile(
    r"import_module\((?![\"'])|__import__\((?![\"'])|pkgutil\.resolve_name|"
    r"spec_from_file_location|\.load\(\)|getattr\(importlib"
)
ALLOWED = {("trainer/verifiers.py", ".load()")}


def test_no_import_by_string_in_the_product_code() -> None:
    found = []
    for top in ("core", "gateway", "trainer", "engine", "schemas", "migrations"):
        for path in sorted((REPO / top).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            for m in IMPORT_BY_NAME.finditer(path.read_text()):
                if (rel, m.group(0)) not in ALLOWED:
                    found.append(f"{rel}: {m.group(0)}")
    assert not found, found
