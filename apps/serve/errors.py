"""The error a request gets: OpenAI's error object with a status."""

from __future__ import annotations

from typing import Any


class RequestError(Exception):
    """A request the server refuses; the fields of OpenAI's error object."""

    def __init__(
        self,
        message: str,
        param: str | None = None,
        status: int = 400,
        kind: str = "invalid_request_error",
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message, self.param, self.status = message, param, status
        self.kind, self.code, self.headers = kind, code, headers or {}

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        }
