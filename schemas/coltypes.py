"""Column types shared by the tables: packed token arrays, UTC datetimes, portable JSON.

Token ids and logprobs are stored as packed little-endian bytes (``BYTEA`` on
PostgreSQL, ``BLOB`` on SQLite): token ids as int32 (4 bytes each), logprobs as float64
(8 bytes each). The same code path runs on both databases, a 2,000-token completion takes
24 kB instead of ~50 kB of JSON text, and decoding is exact: float64 holds every value a
JSON number or an engine's float32 logprob can carry, so what is read back is bit-for-bit
what was written.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import numpy as np
from sqlalchemy import JSON, DateTime, LargeBinary
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator

PortableJSON = JSON().with_variant(JSONB(), "postgresql")


class _PackedArray(TypeDecorator[list[Any]]):
    impl = LargeBinary
    cache_ok = True
    dtype: str = ""

    def process_bind_param(self, value: list[Any] | None, dialect: Dialect) -> bytes | None:
        if value is None:
            return None
        return np.asarray(value, dtype=self.dtype).tobytes()

    def process_result_value(self, value: bytes | None, dialect: Dialect) -> list[Any] | None:
        if value is None:
            return None
        return np.frombuffer(bytes(value), dtype=self.dtype).tolist()


class TokenIds(_PackedArray):
    """list[int] <-> packed little-endian int32."""

    cache_ok = True  # SQLAlchemy reads it from each class's own namespace, not inherited
    dtype = "<i4"

    def process_bind_param(self, value: list[Any] | None, dialect: Dialect) -> bytes | None:
        if value is not None and any(not 0 <= int(v) < 2**31 for v in value):
            raise ValueError("token ids must be in [0, 2**31)")
        return super().process_bind_param(value, dialect)


class Logprobs(_PackedArray):
    """list[float] <-> packed little-endian float64."""

    cache_ok = True
    dtype = "<f8"


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on both PostgreSQL and SQLite (which drops tzinfo)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime: rlgate stores timezone-aware UTC only")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


def utcnow() -> datetime:
    return datetime.now(UTC)
