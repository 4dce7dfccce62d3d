"""The error a request is answered with: an HTTP status and a message that says what to
change. Raised by the gateway and by the shared code it calls (core/feedback.py);
gateway/edge/errors.py renders it in the calling API's own error format."""

from __future__ import annotations


class APIError(Exception):
    """An error answered to the client; `message` says what to change."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}
