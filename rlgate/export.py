"""`rlgate export`: ATDP v1 records out of the database, for your own pipelines.

Streams rows in pages (never the whole table in memory) and writes one record per JSON
line, or a Parquet file (needs `pyarrow`). Every exported record validates against
`schemas/json/<Type>.json`. An export is an AuditEvent. `--as sft|preference|kto` writes
interactions as the rows TRL's trainers read instead (rlgate/trl_rows.py).
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import IO

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from core.keys import audit
from core.settings import ConfigError
from rlgate import trl_rows
from schemas.convert import to_record
from schemas.tables import FeedbackRow, InteractionRow, SessionRow

TYPES = {"interaction": InteractionRow, "session": SessionRow, "feedback": FeedbackRow}


def select_rows(
    db: Session,
    kind: str,
    project: str | None,
    since: datetime | None,
    rated_only: bool,
    until: datetime | None = None,
    policy_version: str | None = None,
    min_reward: float | None = None,
) -> Iterator[dict]:
    table = TYPES[kind]
    q = select(table).order_by(table.created_at, table.id)
    if project:
        q = q.where(table.project_id == project)
    if since:
        q = q.where(table.created_at >= since)
    if until:
        q = q.where(table.created_at < until)
    if kind == "interaction" and policy_version:
        q = q.where(InteractionRow.policy_version == policy_version)
    if kind == "interaction" and min_reward is not None:
        q = q.where(InteractionRow.reward >= min_reward)
    if rated_only:
        if kind == "interaction":
            q = q.where(InteractionRow.reward.is_not(None))
        elif kind == "session":
            rated = select(FeedbackRow.session_id).where(FeedbackRow.session_id.is_not(None))
            q = q.where(SessionRow.id.in_(rated))
    for row in db.execute(q.execution_options(yield_per=500)).scalars():
        yield to_record(row).model_dump(mode="json")


def export(
    factory: sessionmaker[Session],
    kind: str,
    fmt: str,
    out: Path | None,
    project: str | None,
    since: datetime | None,
    rated_only: bool,
    shape: str | None = None,
    until: datetime | None = None,
    policy_version: str | None = None,
    min_reward: float | None = None,
) -> int:
    if shape and (kind != "interaction" or fmt != "jsonl"):
        raise ConfigError(f"--as {shape} exports interactions as jsonl (drop --type/--format)")
    n = 0
    with factory() as db:
        records: Iterator[dict] = select_rows(
            db, kind, project, since, rated_only, until, policy_version, min_reward
        )
        if shape:
            records = trl_rows.rows(shape, records)
        if fmt == "jsonl":
            fh: IO[str] = open(out, "w") if out else sys.stdout  # noqa: SIM115
            try:
                for rec in records:
                    fh.write(json.dumps(rec, separators=(",", ":")) + "\n")
                    n += 1
            finally:
                if out:
                    fh.close()
        else:
            try:
                import pyarrow as pa
                import pyarrow.parquet as pq
            except ImportError:
                pip = f"{shlex.quote(sys.executable)} -m pip install pyarrow"  # this venv's
                raise ConfigError(f"parquet export needs pyarrow: {pip}") from None
            if out is None:
                raise ConfigError("parquet export needs --output FILE")
            batch: list[dict] = []
            writer = None
            for rec in records:
                # nested objects as JSON text: one stable column type per field
                batch.append(
                    {k: json.dumps(v) if isinstance(v, dict) else v for k, v in rec.items()}
                )
                n += 1
                if len(batch) == 1000:
                    table = pa.Table.from_pylist(batch)
                    writer = writer or pq.ParquetWriter(str(out), table.schema)
                    writer.write_table(table)
                    batch = []
            if batch or writer is None:
                table = pa.Table.from_pylist(batch)
                writer = writer or pq.ParquetWriter(str(out), table.schema)
                writer.write_table(table)
            writer.close()
    with factory() as db, db.begin():
        audit(
            db,
            "cli",
            "export",
            project,
            kind,
            None,
            {
                "format": fmt,
                "output": str(out) if out else "stdout",
                "records": n,
                "rated_only": rated_only,
                "as": shape,
                "until": until.isoformat() if until else None,
                "policy_version": policy_version,
                "min_reward": min_reward,
                "since": since.isoformat() if since else None,
            },
        )
    return n
