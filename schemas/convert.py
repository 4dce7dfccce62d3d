"""Conversion between ATDP wire records (Pydantic) and table rows (SQLAlchemy)."""

from __future__ import annotations

from typing import Any

from schemas import atdp, tables

ROW_TYPES: dict[type[atdp.Record], type[tables.Base]] = {
    atdp.Project: tables.ProjectRow,
    atdp.ApiKey: tables.ApiKeyRow,
    atdp.Session: tables.SessionRow,
    atdp.Interaction: tables.InteractionRow,
    atdp.Feedback: tables.FeedbackRow,
    atdp.PolicyVersion: tables.PolicyVersionRow,
    atdp.TrainingRun: tables.TrainingRunRow,
    atdp.AuditEvent: tables.AuditEventRow,
}
RECORD_TYPES = {row: rec for rec, row in ROW_TYPES.items()}

# wire field name -> ORM attribute name, where they differ
_RENAMES: dict[type[tables.Base], dict[str, str]] = {tables.SessionRow: {"metadata": "meta"}}


def to_row(record: atdp.Record) -> tables.Base:
    """A new (transient) row holding exactly the record's values."""
    return ROW_TYPES[type(record)](**row_values(record))


def row_values(record: atdp.Record) -> dict[str, Any]:
    """The record's values by its row's attribute names: a row's constructor arguments, or
    one row of a bulk ``insert(RowType)``."""
    renames = _RENAMES.get(ROW_TYPES[type(record)], {})
    data = record.model_dump(mode="python", exclude={"atdp_version"})
    # nested models (output, usage, lora_config) are stored as their JSON form
    for name in list(data):
        if isinstance(getattr(record, name), atdp.BaseModel):
            data[name] = getattr(record, name).model_dump(mode="json")
    return {renames.get(k, k): v for k, v in data.items()}


def to_record(row: tables.Base) -> atdp.Record:
    """The ATDP record a row stores."""
    record_type = RECORD_TYPES[type(row)]
    renames = _RENAMES.get(type(row), {})
    values: dict[str, Any] = {}
    for name in record_type.model_fields:
        if name == "atdp_version":
            continue
        values[name] = getattr(row, renames.get(name, name))
    return record_type.model_validate(values)
