"""The HTTP edge: what every request meets, whatever route it takes.

- ``errors``: client-facing errors in the calling API's own format;
- ``credentials``, ``auth``: the key a request presents, and who it is (project, kind,
  session binding);
- ``ratelimit``: per-key token buckets and the bound on concurrent model calls;
- ``body_limit``, ``boundary``: ASGI middleware (the body size limit; a URL with a
  character nothing can hold);
- ``storable``: what the database could not store, refused up front with a 400;
- ``client_agent``: which agent sent a call, from its client's headers;
- ``metrics``: the process's Prometheus metrics.

The bottom of gateway/: imports no other part of it. Touch this when how a caller is
identified, limited or refused changes, when an error's shape changes, or when a metric
is added.
"""
