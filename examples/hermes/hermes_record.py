"""What the Hermes example records: one point per task, one event per training run, and
the summary and reward plot written to ``reward.json`` and ``reward.png``."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Point:
    index: int
    t_s: float
    kind: str
    prompt: str
    expected: float
    answer: str
    stars: int
    reward: float
    comment: str
    used_tool: bool
    turns: int
    policy_version: str
    session_id: str
    hermes_seconds: float
    hermes_exit: int


@dataclass
class TrainEvent:
    after_task: int
    t_s: float
    run_id: str
    status: str
    num_samples: int | None
    policy_version: str | None
    duration_s: float | None
    error: str | None


@dataclass
class Record:
    started_at: str
    args: dict[str, Any]
    points: list[Point] = field(default_factory=list)
    training: list[TrainEvent] = field(default_factory=list)


def summary(points: list[Point]) -> list[dict[str, Any]]:
    """Mean reward, accuracy and tool use per serving policy version, in serving order."""
    order: list[str] = []
    for p in points:
        if p.policy_version not in order:
            order.append(p.policy_version)
    rows = []
    for version in order:
        ps = [p for p in points if p.policy_version == version]
        rows.append(
            {
                "policy_version": version,
                "tasks": len(ps),
                "mean_reward": round(sum(p.reward for p in ps) / len(ps), 3),
                "correct": sum(p.stars == 5 for p in ps),
                "used_tool": sum(p.used_tool for p in ps),
            }
        )
    return rows


def plot(record: Record, path: Path, window: int = 8) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = record.points
    fig, ax = plt.subplots(figsize=(9, 4.5))
    versions = sorted({p.policy_version for p in pts}, key=lambda v: (v != "base", v))
    colors = plt.get_cmap("tab10")
    for i, version in enumerate(versions):
        ps = [p for p in pts if p.policy_version == version]
        ax.scatter(
            [p.index for p in ps],
            [p.reward for p in ps],
            s=18,
            color=colors(i % 10),
            label=f"served by {version}",
            alpha=0.8,
        )
    rolling = []
    for i in range(len(pts)):
        chunk = pts[max(0, i - window + 1) : i + 1]
        rolling.append(sum(p.reward for p in chunk) / len(chunk))
    ax.plot([p.index for p in pts], rolling, color="black", lw=1.5, label=f"mean of last {window}")
    for ev in record.training:
        ax.axvline(ev.after_task - 0.5, color="grey", ls="--", lw=1)
        label = ev.policy_version if ev.status == "published" else ev.status
        ax.text(ev.after_task - 0.4, 1.55, label or "", fontsize=7, rotation=90, va="top")
    last = max([len(pts)] + [ev.after_task for ev in record.training])
    ax.set_xlim(-0.5, last + 0.5)
    ax.set_ylim(-1.1, 1.6)
    ax.set_xlabel("task")
    ax.set_ylabel("reward (user rating, stars-5 -> [-1, 1])")
    ax.set_title(f"Hermes Agent through rlgate, {record.started_at}", fontsize=9)
    ax.legend(fontsize=7, loc="upper left", ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
