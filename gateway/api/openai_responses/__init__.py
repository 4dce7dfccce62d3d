"""OpenAI Responses (``POST /v1/responses``, ``GET /v1/responses/{id}``)."""
