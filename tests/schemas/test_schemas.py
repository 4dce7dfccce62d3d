"""ATDP v1 examples: valid JSON Schema, Pydantic round trip, database round trip, bit-exact."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import jsonschema
import pytest
from pydantic import ValidationError

from schemas import generate
from schemas.atdp import RECORD_TYPES, Interaction
from schemas.convert import to_record, to_row

ROOT = Path(generate.__file__).parent
EXAMPLES = sorted((ROOT / "examples").glob("*.json"))


def _schema(name: str) -> dict:
    return json.loads((ROOT / "json" / f"{name}.json").read_text())


def test_every_record_type_has_schema_and_example():
    assert {p.stem for p in EXAMPLES} == set(RECORD_TYPES)
    assert {p.stem for p in (ROOT / "json").glob("*.json")} == set(RECORD_TYPES)


def test_json_schema_files_are_current():
    assert generate.main(["--check"]) == 0


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_validates_and_round_trips(path, migrated_db):
    raw = json.loads(path.read_text())
    schema = _schema(path.stem)
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate(raw, schema, cls=jsonschema.Draft202012Validator)

    record = RECORD_TYPES[path.stem].model_validate(raw)
    assert json.loads(record.model_dump_json()) == json.loads(
        RECORD_TYPES[path.stem].model_validate_json(path.read_text()).model_dump_json()
    )

    # parents first, so foreign keys hold
    with migrated_db() as db, db.begin():
        if path.stem != "Project":
            db.merge(
                to_row(
                    RECORD_TYPES["Project"].model_validate_json(
                        (ROOT / "examples" / "Project.json").read_text()
                    )
                )
            )
        if path.stem == "Interaction":
            db.merge(
                to_row(
                    RECORD_TYPES["Session"].model_validate_json(
                        (ROOT / "examples" / "Session.json").read_text()
                    )
                )
            )
        db.flush()
        db.merge(to_row(record))
    row_type = type(to_row(record))
    with migrated_db() as db:
        back = to_record(db.get(row_type, record.id))
    assert back == record
    assert back.model_dump(mode="json") == record.model_dump(mode="json")
    if isinstance(record, Interaction):
        assert back.prompt_token_ids == raw["prompt_token_ids"]
        assert back.completion_token_ids == raw["completion_token_ids"]
        bits = lambda xs: [struct.pack("<d", x) for x in xs]  # noqa: E731
        assert bits(back.completion_logprobs) == bits(raw["completion_logprobs"])


def test_token_arrays_are_packed_and_bit_exact(migrated_db):
    base = json.loads((ROOT / "examples" / "Interaction.json").read_text())
    tricky = [-0.0, -1e-300, -5e-324, -1.1920928955078125e-07, -0.1, -87.33654475059946, -1e308]
    base.update(
        id="chatcmpl-bits",
        seq=1,
        completion_token_ids=[0, 1, 49151, 2**31 - 1, 5, 6, 7],
        completion_logprobs=tricky,
    )
    record = Interaction.model_validate(base)
    with migrated_db() as db, db.begin():
        db.merge(
            to_row(
                RECORD_TYPES["Project"].model_validate_json(
                    (ROOT / "examples" / "Project.json").read_text()
                )
            )
        )
        db.merge(
            to_row(
                RECORD_TYPES["Session"].model_validate_json(
                    (ROOT / "examples" / "Session.json").read_text()
                )
            )
        )
        db.flush()
        db.add(to_row(record))
    with migrated_db() as db:
        back = to_record(db.get(type(to_row(record)), "chatcmpl-bits"))
        raw = (
            db.connection()
            .exec_driver_sql(
                "SELECT completion_logprobs, completion_token_ids FROM interactions "
                "WHERE id = 'chatcmpl-bits'"
            )
            .one()
        )
    assert [struct.pack("<d", x) for x in back.completion_logprobs] == [
        struct.pack("<d", x) for x in tricky
    ]
    assert back.completion_token_ids == [0, 1, 49151, 2**31 - 1, 5, 6, 7]
    assert len(bytes(raw[0])) == 8 * len(tricky)
    assert len(bytes(raw[1])) == 4 * 7


def test_misaligned_logprobs_rejected():
    base = json.loads((ROOT / "examples" / "Interaction.json").read_text())
    base["completion_logprobs"] = base["completion_logprobs"][:-1]
    with pytest.raises(ValidationError, match="one value per completion token"):
        Interaction.model_validate(base)


@pytest.mark.parametrize(
    "name,change",
    [
        ("Interaction", {"temperature": -1}),
        ("Feedback", {"reward": 1.5}),
        ("Session", {"status": "paused"}),
        ("ApiKey", {"key_hash": "not-a-hash"}),
        ("TrainingRun", {"surprise": 1}),
    ],
)
def test_schema_and_pydantic_reject_the_same_bad_record(name, change):
    raw = json.loads((ROOT / "examples" / f"{name}.json").read_text()) | change
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(raw, _schema(name), cls=jsonschema.Draft202012Validator)
    with pytest.raises(ValidationError):
        RECORD_TYPES[name].model_validate(raw)


def test_packed_columns_are_cacheable() -> None:
    """TokenIds and Logprobs set ``cache_ok`` themselves (SQLAlchemy does not inherit it):
    without it every query on them warns and skips the statement cache."""
    import warnings

    from sqlalchemy import Column, MetaData, String, Table, create_engine, select

    from schemas.coltypes import Logprobs, TokenIds

    table = Table(
        "packed",
        MetaData(),
        Column("id", String, primary_key=True),
        Column("ids", TokenIds()),
        Column("lps", Logprobs()),
    )
    engine = create_engine("sqlite://")
    table.metadata.create_all(engine)
    with warnings.catch_warnings(), engine.connect() as conn:
        warnings.simplefilter("error")
        conn.execute(table.insert().values(id="a", ids=[1, 2], lps=[-0.5, -1.0]))
        row = conn.execute(select(table.c.ids, table.c.lps).where(table.c.id == "a")).one()
    assert list(row) == [[1, 2], [-0.5, -1.0]]
