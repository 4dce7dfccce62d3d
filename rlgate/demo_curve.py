"""The demo's curve and state: held-out accuracy points, the PNG plot, curve.json, and
clearing an earlier run's state."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Curve:
    started: float = field(default_factory=time.monotonic)
    points: list[dict] = field(default_factory=list)
    train_answers: int = 0
    train_correct: int = 0

    def add(self, version: str, accuracy: float, n: int) -> None:
        self.points.append(
            {
                "minutes": round((time.monotonic() - self.started) / 60, 3),
                "policy_version": version,
                "heldout_accuracy": accuracy,
                "heldout_n": n,
                "train_answers": self.train_answers,
            }
        )


def commit() -> str | None:
    """The git commit of this checkout, when it is one (for curve.json)."""
    import subprocess

    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def fresh_state(data_dir: Path) -> None:
    """Clear an earlier run's state under ``data_dir`` (database, broker, adapters, spool,
    logs), keeping the converted model and earlier curves: a run starts from the base model,
    never from the adapter an earlier run left serving."""
    import shutil

    if not data_dir.is_dir():
        return
    for path in data_dir.iterdir():
        if path.name in ("models", "out"):
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()


def plot(curve: Curve, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [p["minutes"] for p in curve.points]
    ys = [100 * p["heldout_accuracy"] for p in curve.points]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    ax.plot(xs, ys, marker="o")
    for p, x, y in zip(curve.points, xs, ys, strict=True):
        ax.annotate(
            p["policy_version"].split("-")[-1],
            (x, y),
            textcoords="offset points",
            xytext=(0, 6),
            ha="center",
            fontsize=7,
        )
    ax.set_xlabel("minutes")
    ax.set_ylabel("held-out accuracy (%)")
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
