"""The gateway's tokenizer (gateway/call/templating.py load_tokenizer): the packaged
model's, named as transformers' generic fast tokenizer, is loaded as that class without
PyTorch, and renders and tokenizes exactly as AutoTokenizer's choice does; a tokenizer
of another class is AutoTokenizer's."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from gateway.call.templating import load_tokenizer
from tests.servers import REPO, packaged_model_dir

CHATS = [
    [{"role": "user", "content": "What is 2+2?"}],
    [
        {"role": "system", "content": "Be brief. Ünïcödé, emoji 🙂, tabs\tand\nnewlines."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! <|im_end|> is text here"},
        {"role": "user", "content": "  spaces   and 12345 digits "},
    ],
]


def test_the_packaged_tokenizer_loads_without_pytorch() -> None:
    code = (
        "import sys; from gateway.call.templating import load_tokenizer; "
        f"t = load_tokenizer({str(packaged_model_dir())!r}); "
        "t.apply_chat_template([{'role': 'user', 'content': 'hi'}], tokenize=False); "
        "print(type(t).__name__, 'torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-1] == "False", out.stdout


def test_it_renders_and_tokenizes_as_autotokenizer_does() -> None:
    from transformers import AutoTokenizer

    ours, auto = (
        load_tokenizer(packaged_model_dir()),
        AutoTokenizer.from_pretrained(str(packaged_model_dir())),
    )
    assert type(ours) is type(auto)
    for chat in CHATS:
        for prompt in (True, False):
            a = ours.apply_chat_template(chat, tokenize=False, add_generation_prompt=prompt)
            b = auto.apply_chat_template(chat, tokenize=False, add_generation_prompt=prompt)
            assert a == b
            assert ours.encode(a, add_special_tokens=False) == auto.encode(
                a, add_special_tokens=False
            )
    ids = auto.encode("Hello <|im_start|>user\nx", add_special_tokens=False)
    assert ours.decode(ids) == auto.decode(ids)
    assert ours.all_special_ids == auto.all_special_ids


def test_another_class_is_autotokenizers_choice(tmp_path: Path) -> None:
    """A tokenizer_config.json that names a model-specific class goes to AutoTokenizer
    (here GPT2's: the packaged vocabulary is byte-level BPE too)."""
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (packaged_model_dir() / name).is_file():
            shutil.copy(packaged_model_dir() / name, tmp_path / name)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    config["tokenizer_class"] = "GPT2Tokenizer"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    from transformers import AutoTokenizer

    assert type(load_tokenizer(tmp_path)) is type(AutoTokenizer.from_pretrained(str(tmp_path)))
    assert type(load_tokenizer(tmp_path)).__name__ != "TokenizersBackend"
