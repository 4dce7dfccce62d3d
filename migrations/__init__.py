"""Alembic migrations for the rlgate database (one linear history, PostgreSQL and SQLite)."""
