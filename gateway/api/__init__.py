"""The client APIs the gateway speaks, one package each, laid out alike (as vLLM's
``entrypoints/openai``):

- ``protocol.py``: the request model (pydantic) and the shapes of the API's answers;
- ``translator.py``: the API's request to the internal ``GenerationRequest`` and
  ``Completion``s back to its answers, and a stored request rendered for the dashboard;
- ``stream.py``: the API's server-sent events for a stream (a ``base.StreamWriter``);
- ``router.py``: the FastAPI routes, nothing else.

``base.py`` holds what they share: validation errors, unknown-field rejection, tool-schema
checks, SSE encoding, key-kind checks and the one way a call is answered (``respond``).
Adding a request field to an API touches its ``protocol.py`` and ``translator.py`` only.
"""
