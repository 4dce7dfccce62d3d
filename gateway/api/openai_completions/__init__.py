"""OpenAI Completions, the legacy text API (``POST /v1/completions``)."""
