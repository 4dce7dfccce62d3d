"""The client APIs the gateway speaks, one package each, laid out alike (as vLLM's
``entrypoints/openai``):

- ``protocol.py``: the request model (pydantic) and the shapes of the API's answers (and
  its error format, if it has its own);
- ``translator.py``: the API's request to the internal ``GenerationRequest`` and
  ``Completion``s back to its answers, and a stored request rendered for the dashboard; its
  ``PROTOCOL`` (a ``schemas.atdp.ClientProtocol`` member) and ``ID_PREFIX``;
- ``stream.py``: the API's server-sent events for a stream (a ``handler.StreamWriter``);
- ``router.py``: the API's ``handler.ApiHandler`` (its hooks: ``to_internal``, ``body``,
  ``writer``, ``recorded``) and the FastAPI routes, each one call to it;
- ``spec.py``: what the package registers (``spec.ApiSpec``): its router, model-call paths,
  error format, display translator and protocol. ``registry.py`` lists the packages;
  gateway/app.py, gateway/edge/errors.py, gateway/edge/ratelimit.py and ``display.py`` read that
  list and name no API's paths themselves. An API whose clients send the key somewhere else
  than ``Authorization: Bearer`` or ``x-api-key``, or that names the model in the path
  (Gemini's ``x-goog-api-key`` or ``?key=``, and ``/v1beta/models/{model}:generateContent``),
  registers a ``credential`` reader and ``{name}`` patterns in ``model_paths``
  (tests/gateway/test_api_registry.py builds one).

``handler.py`` serves every model call the same way (validate -> to_internal -> prepare ->
stream or respond); ``base.py`` holds what the translators share: validation errors,
unknown-field rejection, tool-name and tool-schema checks, SSE encoding, key-kind checks.
What an output limit means is gateway/call/output_limit.py's.

Adding a request field to an API that maps onto an existing internal field touches its
``protocol.py`` and ``translator.py`` only. A new sampling parameter also has to reach the
engine and the record: ``gateway/call/request.py`` (``Sampling``), ``core/engine_protocol.py``
(what is sent), ``gateway/call/generation.py`` (payload and record) and, to be recorded in its
own column, the data contract (``schemas/atdp.py``, ``schemas/tables.py``, a migration).
"""
