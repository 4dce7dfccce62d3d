"""ATDP v1: the data contract between recording and training (JSON Schema, Pydantic, tables)."""

from schemas.atdp import ATDP_VERSION, RECORD_TYPES

__all__ = ["ATDP_VERSION", "RECORD_TYPES"]
