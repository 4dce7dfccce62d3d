"""Fixtures for the embedded engine tests: one engine subprocess per session, the real
packaged model, and the same model loaded with plain transformers as the reference.

The converted model is cached in ``RLGATE_ENGINE_TEST_CACHE`` (default
``/tmp/rlgate-engine-cache``) so the GGUF conversion runs once per machine.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from core.engine_protocol import SGLANG_VERSION
from engine.model_files import PACKAGED_MODEL, resolve_model_dir
from tests.servers import MODEL_CACHE, engine_cmd, free_port, running

MAX_LORA_RANK = 16
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@pytest.fixture(scope="session")
def model_dir() -> Path:
    named = os.environ.get("RLGATE_TEST_SGLANG_MODEL")  # the GPU check's model
    return Path(named) if named else resolve_model_dir(PACKAGED_MODEL, MODEL_CACHE)


@pytest.fixture(scope="session")
def engine_url(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Base URL of an embedded engine subprocess (tmp data dir, shared model cache), with
    ``--weights float``: these tests hold its arithmetic to plain transformers' (greedy
    tokens equal, logprobs within 1e-4, batching invisible), which only float weights
    give. The default int4 weights round each projection's input and output to bfloat16:
    tests/engine/test_int4.py bounds what that changes, tests/trainer/test_agreement.py
    its agreement with the trainer, and the gateway and trainer tiers run on it."""
    port = free_port()
    data_dir = tmp_path_factory.mktemp("engine-data")
    cmd = engine_cmd(
        port,
        *("--max-lora-rank", str(MAX_LORA_RANK), "--max-loaded-loras", "3"),
        *("--max-running-requests", "8", "--context-length", "1024", "--weights", "float"),
    )
    env = {"RLGATE_DATA_DIR": str(data_dir)}
    with running(cmd, env, data_dir / "engine.log", port, 180) as proc:
        yield proc.url


@dataclass(frozen=True)
class Target:
    """An engine under the contract: ``kind`` (embedded | sglang), where, its key, and the
    release it reports in /get_server_info."""

    kind: str
    url: str
    api_key: str | None
    version: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


@pytest.fixture(scope="session", params=["embedded", f"sglang-{SGLANG_VERSION}"])
def target(request: pytest.FixtureRequest) -> Target:
    """Each engine of the contract: the embedded engine, then real SGLang (the session's
    one server, tests/conftest.py ``sglang``; the id names its version)."""
    if request.param == "embedded":
        return Target("embedded", request.getfixturevalue("engine_url"), None, "rlgate-embedded")
    server = request.getfixturevalue("sglang")
    return Target("sglang", server.url, server.api_key, server.version)


@pytest.fixture(scope="session")
def client(engine_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=engine_url, timeout=120) as c:
        yield c


@pytest.fixture(scope="session")
def tokenizer(model_dir: Path):  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))


@pytest.fixture(scope="session")
def hf_model(model_dir: Path):  # type: ignore[no-untyped-def]
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(os.cpu_count() or 1)
    return AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()


def chat_prompt(tokenizer, question: str) -> list[int]:  # type: ignore[no-untyped-def]
    """One user question rendered with the chat template (as the gateway would send it)."""
    return list(
        tokenizer.apply_chat_template(
            [{"role": "user", "content": question}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
    )


@pytest.fixture(scope="session")
def chat_ids(tokenizer) -> list[list[int]]:  # type: ignore[no-untyped-def]
    """A few rendered chat prompts (as the gateway would send them)."""
    questions = [
        "What is the capital of France?",
        "Write a haiku about the sea.",
        "List three prime numbers.",
        "Who wrote Hamlet?",
        "Explain gravity in one sentence.",
        "Say hello in Spanish.",
    ]
    return [chat_prompt(tokenizer, q) for q in questions]


def _make_adapter(
    model_dir: Path, out: Path, rank: int, seed: int, targets: tuple[str, ...]
) -> Path:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    config = LoraConfig(
        r=rank,
        lora_alpha=2 * rank,
        target_modules=list(targets),
        lora_dropout=0.0,
        task_type="CAUSAL_LM",
    )
    torch.manual_seed(seed)  # lora_A's init: the same adapter whatever ran before
    peft_model = get_peft_model(model, config)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:  # PEFT initialises B to zero: make the adapter do something
                param.copy_(torch.randn(param.shape, generator=gen) * 0.2)
    peft_model.save_pretrained(str(out))
    return out


@pytest.fixture(scope="session")
def adapter_dirs(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("adapters")
    return {
        "a": _make_adapter(model_dir, root / "a", 8, 1, LORA_TARGETS),
        "b": _make_adapter(model_dir, root / "b", 4, 2, ("q_proj", "v_proj", "down_proj")),
        "too_big": _make_adapter(model_dir, root / "too_big", 2 * MAX_LORA_RANK, 3, ("q_proj",)),
    }


@pytest.fixture(scope="session")
def loaded_adapters(client: httpx.Client, adapter_dirs: dict[str, Path]) -> dict[str, str]:
    """Adapters ``test-a`` and ``test-b`` loaded into the session's engine."""
    names = {}
    for key in ("a", "b"):
        name = f"test-{key}"
        r = client.post(
            "/load_lora_adapter", json={"lora_name": name, "lora_path": str(adapter_dirs[key])}
        )
        assert r.status_code == 200, r.text
        names[key] = name
    return names


def _generate(client: httpx.Client, **body: object) -> Any:
    r = client.post("/generate", json=body)
    assert r.status_code == 200, r.text
    return r.json()


@torch.inference_mode()
def _hf_greedy(model: Any, ids: list[int], max_new_tokens: int, eos: list[int]) -> list[int]:
    out = model.generate(
        torch.tensor([ids]),
        attention_mask=torch.ones(1, len(ids), dtype=torch.long),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=eos,
        pad_token_id=eos[0],
    )
    return list(out[0, len(ids) :].tolist())


@pytest.fixture(scope="session")
def generate() -> Callable[..., Any]:
    """``generate(client, **body)``: POST /generate, assert 200, return the JSON."""
    return _generate


@pytest.fixture(scope="session")
def hf_greedy() -> Callable[..., list[int]]:
    """``hf_greedy(model, ids, max_new_tokens, eos)``: plain transformers greedy ids."""
    return _hf_greedy
