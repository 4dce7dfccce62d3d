"""Plot several `rlgate demo` runs in one figure: held-out accuracy over minutes.

    python scripts/plot_demo_curves.py seed1/curve.json seed2/curve.json ... -o demo.png

Each curve is labelled "seed S" from its curve.json (else its parent folder; or --label,
once per file); the summary prints, per run, the base, best and last accuracy and where
50% was first reached.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def summary(points: list[dict]) -> str:
    accs = [p["heldout_accuracy"] for p in points]
    reached = next((p["minutes"] for p in points if p["heldout_accuracy"] >= 0.5), None)
    first = f"50% first at minute {reached:.1f}" if reached is not None else "never 50%"
    return f"base {accs[0]:.0%}, best {max(accs):.0%}, last {accs[-1]:.0%}, {first}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("curves", nargs="+", type=Path, help="curve.json files")
    parser.add_argument("-o", "--out", type=Path, required=True, help="the PNG to write")
    parser.add_argument("--label", action="append", default=[], help="one per curve")
    parser.add_argument("--title", default="rlgate demo: held-out accuracy, several seeds")
    args = parser.parse_args()
    if args.label and len(args.label) != len(args.curves):
        parser.error(f"give --label once per curve ({len(args.curves)}), or not at all")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    for i, path in enumerate(args.curves):
        run = json.loads(path.read_text())
        points = run["points"]
        default = f"seed {run['seed']}" if run.get("seed") is not None else path.parent.name
        label = args.label[i] if args.label else default
        xs = [p["minutes"] for p in points]
        ys = [100 * p["heldout_accuracy"] for p in points]
        ax.plot(xs, ys, marker="o", markersize=3, label=label)
        print(f"{label}: {summary(points)} ({run.get('date', '?')})")
    ax.set_xlabel("minutes")
    ax.set_ylabel("held-out accuracy (%)")
    ax.set_ylim(0, 100)
    ax.axhline(50, color="grey", linewidth=0.8, linestyle="--")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    ax.set_title(args.title, fontsize=9)
    fig.tight_layout()
    fig.savefig(args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
