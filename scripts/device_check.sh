#!/usr/bin/env bash
# GPU path check (docs/trainer.md, "GPU check"): the trainer's CUDA bfloat16 step and the
# engine's forward against CPU float32, on a random-weight model of the packaged
# SmolLM2-135M's architecture; tokens/s of a trainer step and a forward. Exits 1 on FAIL.
#
#   scripts/device_check.sh [--cpu-only] [--tiny] [--json FILE]   run the check
#   scripts/device_check.sh --sglang                               real SGLang on the GPU
#   scripts/device_check.sh --scale [--dry]                        training beyond one device
#   scripts/device_check.sh --fetch-wheels                         (once, with network)
#
# --sglang (scripts/device_check_sglang.py) starts the GPU machine's SGLang
# (RLGATE_DEVICE_SGLANG_PYTHON, else python3) with LoRA and --api-key on a random-weight
# model of the packaged model's architecture and tokenizer (.device-tokenizer/), and runs
# the engine contract's SGLang half against it, in under 10 minutes. Carry .device-wheels
# and .device-tokenizer. Not yet run on a GPU (none was lent when it was written).
#
# --scale (scripts/device_check_scale.py): a 2-process FSDP2 run (torchrun) against one
# process, real SGLang with LoRA and --enable-memory-saver, its memory released around a
# run on the same GPU and resumed, the run's adapter published into it and the next call
# served by it; each step's time and memory; under 10 minutes. --dry runs the same steps on
# the CPU with the tiny model and the embedded engine (no release), as CI can.
#
# Without a GPU (or with --cpu-only) it compares CPU bfloat16 with CPU float32 through the
# same code. Python: .venv/bin/python when present, else python3. The trainer's modules
# import SQLAlchemy and Pydantic (trainer/data.py -> schemas); a machine whose python3 lacks
# them (the lent GPU machine has PyTorch, transformers and PEFT, nothing can be installed
# from the network there) gets them from .device-wheels/, which --fetch-wheels fills here
# (CPython 3.12, manylinux x86-64, the versions installed in .venv) and marks as ignored in
# .git/info/exclude so that it can travel as a carried path.
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=.device-wheels

if [ "${1:-}" = --fetch-wheels ]; then
  [ -x .venv/bin/python ] || { echo "needs .venv (bash scripts/setup)" >&2; exit 2; }
  pins=$(.venv/bin/python - <<'EOF'
from importlib.metadata import version
names = ["pydantic", "pydantic_core", "annotated_types", "typing_inspection", "SQLAlchemy"]
# the engine contract's own (scripts/device_check.sh --sglang)
names += ["pydantic-settings", "python-dotenv", "pytest", "pytest-timeout", "pluggy",
          "iniconfig", "httpx", "httpcore", "h11", "anyio", "sniffio", "certifi", "idna",
          "aiohttp", "aiohappyeyeballs", "aiosignal", "attrs", "frozenlist", "multidict",
          "propcache", "yarl", "psycopg", "click"]
print(" ".join(f"{n}=={version(n)}" for n in names))
EOF
)
  rm -rf "$WHEELS" && mkdir -p "$WHEELS"
  # shellcheck disable=SC2086
  .venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$WHEELS" $pins
  grep -qxF "/$WHEELS/" .git/info/exclude 2>/dev/null || echo "/$WHEELS/" >> .git/info/exclude
  # the packaged model's tokenizer (a few MB) for --sglang's random-weight model
  model=$(.venv/bin/python -c "from engine.model_files import PACKAGED_MODEL, resolve_model_dir; \
from tests.servers import MODEL_CACHE; print(resolve_model_dir(PACKAGED_MODEL, MODEL_CACHE))")
  rm -rf .device-tokenizer && mkdir -p .device-tokenizer
  for f in tokenizer.json tokenizer_config.json special_tokens_map.json generation_config.json \
    vocab.json merges.txt chat_template.jinja; do
    [ -f "$model/$f" ] && cp "$model/$f" .device-tokenizer/
  done
  grep -qxF "/.device-tokenizer/" .git/info/exclude 2>/dev/null ||
    echo "/.device-tokenizer/" >> .git/info/exclude
  ls -1 "$WHEELS" .device-tokenizer
  exit 0
fi

PY=python3
[ -x .venv/bin/python ] && PY=.venv/bin/python
if ! "$PY" -c "import sqlalchemy, pydantic" 2>/dev/null; then
  if ! ls "$WHEELS"/*.whl >/dev/null 2>&1; then
    echo "$PY lacks sqlalchemy/pydantic and $WHEELS/ is empty: run" \
      "scripts/device_check.sh --fetch-wheels first and carry $WHEELS" >&2
    exit 2
  fi
  site=$(mktemp -d /tmp/rlgate-device-site-XXXXXX)
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" \
    "$WHEELS"/*.whl
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
if [ "${1:-}" = --sglang ]; then
  exec "$PY" scripts/device_check_sglang.py
fi
if [ "${1:-}" = --scale ]; then
  shift
  exec "$PY" scripts/device_check_scale.py "$@"
fi
exec "$PY" scripts/device_check.py "$@"
