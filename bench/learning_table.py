"""Ratings needed to learn, thumbs vs comments vs follow-ups: seeds x variants in sequence.

Runs ``bench/learning.py`` once per (seed, variant), one at a time (each is a whole stack:
nothing else should run on the machine meanwhile, and the load average is recorded in each
result), then prints the table: per seed and variant, the thumbs given when the held-out
agreement first reached the base model's agreement + ``--target`` points (a run that never
reached it counts as its budget, marked ``>``), the median and the spread over seeds, and
the comments/thumbs ratio per seed. Writes ``<out>/curves.png`` (every curve) and
``<out>/table.md``. With ``--table-only`` it reads the results already in ``<out>``.

    .venv/bin/python bench/learning_table.py --seeds 1 2 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from itertools import pairwise
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.learning import VARIANTS, plot  # noqa: E402


def reached(data: dict[str, Any], target: float) -> tuple[int, bool]:
    """(thumbs given when agreement first reached start + target, whether it did); the
    budget (or the last point's ratings, if more) when it never did."""
    points = data["points"]
    start = points[0]["agreement"]
    for p in points[1:]:
        if p["agreement"] >= start + target - 1e-9:
            return p["ratings"], True
    return max(data["budget"], points[-1]["ratings"] if points else 0), False


def curve_mean(data: dict[str, Any]) -> float:
    """Held-out agreement averaged over the whole curve, 0 to the last point's ratings: each
    point's policy counts for the ratings until the next point (the served policy's area
    under the curve, per rating). The whole curve, not its best point."""
    points = data["points"]
    span = points[-1]["ratings"] - points[0]["ratings"] if len(points) > 1 else 0
    if span <= 0:
        return points[0]["agreement"] if points else 0.0
    area = sum(a["agreement"] * (b["ratings"] - a["ratings"]) for a, b in pairwise(points))
    return area / span


def table(results: dict[tuple[str, int], dict[str, Any]], seeds: list[int], target: float) -> str:
    variants = [v for v in VARIANTS if any((v, s) in results for s in seeds)]
    head = ["variant", *[f"seed {s}" for s in seeds], "median", "spread (min-max)", "final"]
    lines = [
        f"Thumbs needed to reach +{target * 100:.0f} points held-out agreement "
        "(> budget: not reached)",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    needed: dict[str, dict[int, int]] = {}
    means: list[str] = []
    for v in variants:
        cells, values, finals = [], [], []
        for s in seeds:
            data = results.get((v, s))
            if data is None or not data["points"]:
                cells.append("-")
                continue
            n, ok = reached(data, target)
            needed.setdefault(v, {})[s] = n
            values.append(n)
            cells.append(str(n) if ok else f">{n}")
            first, last = data["points"][0], data["points"][-1]
            finals.append(f"{first['agreement']:.0%}->{last['agreement']:.0%}")
        curve = {s: curve_mean(d) for s in seeds if (d := results.get((v, s))) and d["points"]}
        cols = [f"{curve[s]:.0%}" if s in curve else "-" for s in seeds]
        med_curve = f"{statistics.median(curve.values()):.0%}" if curve else "-"
        means.append("| " + " | ".join([v, *cols, med_curve]) + " |")
        med = statistics.median(values) if values else None
        spread = f"{min(values)}-{max(values)}" if values else "-"
        lines.append(
            "| "
            + " | ".join([v, *cells, f"{med:g}" if med is not None else "-", spread])
            + " | "
            + ", ".join(finals)
            + " |"
        )
    lines += [
        "",
        "Held-out agreement averaged over the whole curve (each policy weighted by the ratings "
        "it served)",
        "",
        "| variant | " + " | ".join(f"seed {s}" for s in seeds) + " | median |",
        "|" + "---|" * (len(seeds) + 2),
        *means,
    ]
    if "thumbs" in needed and "comments" in needed:
        ratios = [
            f"seed {s}: {needed['comments'][s] / needed['thumbs'][s]:.2f}"
            for s in seeds
            if s in needed["thumbs"] and s in needed["comments"]
        ]
        lines += ["", "comments / thumbs (ratings needed, per seed): " + ", ".join(ratios)]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    ap.add_argument("--ratings", type=int, default=80, help="budget of thumbs per run")
    ap.add_argument("--target", type=float, default=0.30, help="agreement gain to reach")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "learning-results")
    ap.add_argument("--table-only", action="store_true", help="read the results in --out")
    ap.add_argument("extra", nargs="*", help="more flags for bench/learning.py (after --)")
    args = ap.parse_args()
    if not args.table_only:
        for seed in args.seeds:
            for variant in args.variants:
                started = time.monotonic()
                cmd = [
                    sys.executable,
                    str(ROOT / "bench" / "learning.py"),
                    *("--variant", variant, "--seed", str(seed)),
                    *("--ratings", str(args.ratings), "--out", str(args.out)),
                    *args.extra,
                ]
                print(f"==> {variant}, seed {seed}", flush=True)
                rc = subprocess.run(cmd).returncode
                print(f"    exit {rc} in {(time.monotonic() - started) / 60:.1f} min", flush=True)
    results = {}
    for path in sorted(args.out.glob("*-seed*.json")):
        data = json.loads(path.read_text())
        if data["seed"] in args.seeds and data["variant"] in args.variants:
            results[(data["variant"], data["seed"])] = data
    text = table(results, args.seeds, args.target)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "table.md").write_text(text + "\n")
    plot(list(results.values()), args.out / "curves.png", "held-out agreement vs thumbs given")
    print(f"wrote {args.out / 'table.md'} and {args.out / 'curves.png'}")


if __name__ == "__main__":
    main()
