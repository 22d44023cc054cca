"""The error a request gets: OpenAI's error object with a status."""

from __future__ import annotations

from typing import Any

from specx.runtime.errors import SpecxError

# a runtime error's field (GenerationSettings, SamplingParams) -> the request field it came in,
# where the name differs (prompt, grammar and logprobs depend on the endpoint: param_of)
REQUEST_FIELDS = {"max_new_tokens": "max_tokens"}


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


def param_of(error: SpecxError, chat: bool, tools: bool = False) -> str | None:
    """The request field (OpenAI's `param`) a runtime error concerns (SpecxError.field), for a
    chat or completions request (`tools`: the request lists tools, which make its grammar)."""
    field = error.field
    if field == "prompt":
        return "messages" if chat else "prompt"
    if field == "grammar":
        return "tools" if tools else "response_format"
    if field == "logprobs":
        return "top_logprobs" if chat else "logprobs"
    return REQUEST_FIELDS.get(field, field) if field is not None else None
