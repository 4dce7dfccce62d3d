"""OpenAI Chat Completions (``POST /v1/chat/completions``)."""
