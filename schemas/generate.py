"""Write the ATDP v1 JSON Schema files from the Pydantic models.

python -m schemas.generate          # rewrite schemas/json/*.json
python -m schemas.generate --check  # exit 1 if a file is out of date
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from schemas.atdp import RECORD_TYPES

JSON_DIR = Path(__file__).parent / "json"


def render(name: str) -> str:
    schema = RECORD_TYPES[name].model_json_schema(mode="serialization")
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"https://rlgate.dev/atdp/v1/{name}.json",
        **schema,
    }
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def main(argv: list[str]) -> int:
    check = "--check" in argv
    JSON_DIR.mkdir(exist_ok=True)
    stale = []
    for name in RECORD_TYPES:
        path = JSON_DIR / f"{name}.json"
        text = render(name)
        if check:
            if not path.exists() or path.read_text() != text:
                stale.append(path.name)
        else:
            path.write_text(text)
    if stale:
        print(f"out of date: {', '.join(stale)}; run python -m schemas.generate", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
