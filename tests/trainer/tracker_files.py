"""Reading back what the real trackers wrote, offline: an MLflow store through its client,
TensorBoard event files through TensorBoard's reader, and W&B's offline run files.

wandb 0.31 no longer ships a Python reader for its ``.wandb`` run files (its service,
wandb-core, writes them), so :func:`wandb_records` reads the framing those files use (the
LevelDB log format: 32 KiB blocks of records, each with a 7-byte header: CRC, length, type;
after W&B's own 7-byte file header) and parses each record with W&B's own protobuf schema
(``wandb.proto.wandb_internal_pb2.Record``)."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BLOCK = 32768
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def wandb_records(path: Path) -> Iterator[Any]:
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B", data[:8]
    pos, parts = 7, b""
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0 and length == 0:  # zero padding up to the block's end
            pos += left
            continue
        body = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (FULL, FIRST):
            parts = body
        else:
            parts += body
        if kind in (FULL, LAST):
            record = pb.Record()
            record.ParseFromString(parts)
            yield record


def _key(item: Any) -> str:
    return str(item.key or "/".join(item.nested_key))


@dataclass
class WandbRun:
    name: str = ""
    tags: list[str] = field(default_factory=list)
    notes: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    exit_code: int | None = None


def wandb_runs(wandb_dir: Path) -> list[WandbRun]:
    """Every offline run under ``wandb_dir`` (W&B's ``dir``), read from its .wandb file."""
    out = []
    for path in sorted(wandb_dir.glob("wandb/offline-run-*/run-*.wandb")):
        run = WandbRun()
        for r in wandb_records(path):
            kind = r.WhichOneof("record_type")
            if kind == "run":
                run.name, run.tags, run.notes = r.run.display_name, list(r.run.tags), r.run.notes
                run.config.update({_key(i): json.loads(i.value_json) for i in r.run.config.update})
            elif kind == "config":
                run.config.update({_key(i): json.loads(i.value_json) for i in r.config.update})
            elif kind == "history":
                run.history.append({_key(i): json.loads(i.value_json) for i in r.history.item})
            elif kind == "summary":
                run.summary.update({_key(i): json.loads(i.value_json) for i in r.summary.update})
            elif kind == "exit":
                run.exit_code = r.exit.exit_code
        out.append(run)
    return out


def wandb_steps(run: WandbRun, prefix: str = "train/") -> dict[str, dict[int, float]]:
    """The run's step metrics: {key: {step: value}} for keys under ``prefix``."""
    out: dict[str, dict[int, float]] = {}
    for row in run.history:
        for k, v in row.items():
            if k.startswith(prefix):
                out.setdefault(k, {})[int(row["_step"])] = float(v)
    return out


def mlflow_run(uri: str, name: str) -> tuple[Any, dict[str, dict[int, float]]]:
    """(the MLflow run named ``name``, its metric histories {key: {step: value}})."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    runs = [
        r
        for e in client.search_experiments()
        for r in client.search_runs([e.experiment_id])
        if r.info.run_name == name
    ]
    assert len(runs) == 1, [r.info.run_name for r in runs]
    run = runs[0]
    history = {
        key: {m.step: m.value for m in client.get_metric_history(run.info.run_id, key)}
        for key in run.data.metrics
    }
    return run, history


def tensorboard_run(log_dir: Path) -> tuple[dict[str, dict[int, float]], dict[str, list[str]]]:
    """(scalars {tag: {step: value}}, texts {tag: [text, ...]}) of one run's event files."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    tags = acc.Tags()
    scalars = {t: {e.step: e.value for e in acc.Scalars(t)} for t in tags["scalars"]}
    texts = {
        t.removesuffix("/text_summary"): [
            b.decode() for e in acc.Tensors(t) for b in e.tensor_proto.string_val
        ]
        for t in tags["tensors"]
    }
    return scalars, texts
