"""One model call, shared by every client API: session -> prompt ids -> engine -> parse
-> record.

- ``request``: the one internal request type every client API translates into;
- ``pipeline``: the pipeline itself; ``generation``: one call on its way through it and
  its engine payload, engine completion and interaction record;
- ``sessions``: which trajectory a call belongs to, and the hook when a session closes;
- ``templating``, ``render_pool``: chat-template rendering and tokenization, off the
  event loop;
- ``output_limit``: the output limit against the context window;
- ``parsing``, ``partial_json``: reasoning and tool calls out of the text; JSON cut short;
- ``structured``, ``forced_tools``, ``custom_tools``, ``cut_calls``: structured output,
  forced and custom tools as grammars, a forced turn cut by its limit;
- ``tracing``: OpenTelemetry spans of a model call (optional, loaded only when
  configured).

Imports ``edge``, ``engines`` and ``recording``. Touch this when a model call's
behaviour changes for every API at once: a sampling or tool feature, parsing, templating,
sessions; one API's wire format belongs in gateway/api/.
"""
