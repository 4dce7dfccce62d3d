"""The non-model routes, and what every route module shares.

- ``feedback_routes``, ``feedback``: ``POST /feedback``, ``GET /v1/feedback``,
  ``GET /v1/sessions/{id}``, and feedback's parsing, normalization and scope;
- ``session_routes``: ``POST /v1/sessions`` and ``POST /v1/sessions/{id}/end``;
- ``areal_routes``: AReaL's online-mode ``/rl/*`` routes;
- ``exposure``: what the operational endpoints (``/health``, ``/metrics``,
  ``/openapi.json``) show to whom;
- ``request_context``: the gateway state, the caller and the JSON body of a request, for
  every route module (gateway/api/ and gateway/admin/ too);
- ``waits``: read-after-write, waiting for an id the database may not hold yet.

Above ``call`` and gateway/state.py; gateway/api/ and gateway/admin/ import from here.
Touch this when a non-model route changes, or what every route reads from a request.
"""
