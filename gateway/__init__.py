"""rlgate gateway: the HTTP front door (API translators, sessions, recording, the engine
client) and the admin dashboard. The commands that start it are in `rlgate/`.

Arranged by job; each subpackage's docstring says what it holds and when to touch it.
Bottom up (tests/test_imports.py checks the order; docs/architecture.md draws it):

- ``edge``: errors, authentication, credentials, rate limits, the middleware before any
  route, what the database can store, the process's metrics;
- ``engines``: talking to the engines (the client, fair slots, adapters loaded and
  unloaded, the serving pointer);
- ``recording``: durable recording (spool, batches, commit tickets, dead letters,
  redaction, retry orphans, the next-turn signal);
- ``call``: one model call (the internal request, templating, the pipeline, parsing,
  tools and structured output, sessions, traces);
- ``state.py``: the running gateway's state, built by ``app.py``;
- ``routes``: the non-model routes (feedback, sessions, AReaL, operational exposure) and
  what every route module shares (the request context, read-after-write waits);
- ``api`` (the client APIs) and ``admin`` (the dashboard and its actions);
- ``app.py``: the wiring (state, middleware, error handlers, routers); nothing imports it.
"""
