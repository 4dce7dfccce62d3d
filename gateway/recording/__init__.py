"""Durable recording: once an answer is sent, its record is in the database or in the
local spool that is replayed into it.

- ``recorder``: batched recording, the spool replay, the commit loop;
- ``spool``: the append-only JSON-lines segments;
- ``record_batch``: one batch of spooled records into the database, idempotently;
- ``commits``: commit tickets (an answer is released once its records are committed);
- ``dead_letters``: records the database refused for their content, kept aside;
- ``redaction``: secrets and personal data removed before a record is stored;
- ``retries``: a client's resend supersedes the answer it never received;
- ``next_turn``: after a committed follow-up turn, the trainer's next-turn task queued.

Imports only ``edge``. Touch this when what a record holds, how it reaches the database,
or what happens after it committed changes.
"""
