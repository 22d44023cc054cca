"""`specx serve --api-key`: requests to /v1/* must carry `Authorization: Bearer <key>`.

An ASGI middleware in front of the routes: a request without a matching key gets 401 in
OpenAI's error shape before any route reads its body. Keys are compared in constant time
(hmac.compare_digest, against every key, so the time does not tell which one came close).
/health and /metrics stay open, as in vLLM and llama-server: probes and scrapers carry no key.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

from specx.runtime.errors import InputError

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

PROTECTED = "/v1/"
UNAUTHORIZED = {
    "error": {
        "message": "a valid API key is required: send the header 'Authorization: Bearer <key>'",
        "type": "invalid_request_error",
        "param": None,
        "code": "invalid_api_key",
    }
}


def key_matches(header: str | None, keys: tuple[str, ...]) -> bool:
    """Whether an Authorization header carries one of `keys` as a bearer token."""
    scheme, _, token = (header or "").partition(" ")
    given = token.strip().encode()
    found = False
    for key in keys:  # no early exit: every key is compared
        found |= hmac.compare_digest(given, key.encode())
    return scheme.lower() == "bearer" and found


class ApiKeyGuard:
    """Refuse /v1/* requests whose bearer token is none of `keys`; `refused()` counts them."""

    def __init__(self, app: ASGIApp, keys: tuple[str, ...], refused: Callable[[], None]) -> None:
        self.app, self.keys, self.refused = app, keys, refused
        self.body = json.dumps(UNAUTHORIZED).encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not str(scope.get("path", "")).startswith(PROTECTED):
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v for k, v in scope.get("headers", [])}
        header = headers.get("authorization", b"").decode("latin-1") or None
        if key_matches(header, self.keys):
            await self.app(scope, receive, send)
            return
        self.refused()
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(self.body)).encode()),
                    (b"www-authenticate", b"Bearer"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": self.body})


def read_keys(keys: tuple[str, ...], key_file: Path | None) -> tuple[str, ...]:
    """The keys given on the command line (or SPECX_API_KEY) and in a key file (one a line;
    blank lines and # comments skipped); refused when a key is empty or the file holds none."""
    found = [k.strip() for k in keys]
    if key_file is not None:
        try:
            lines = key_file.read_text().splitlines()
        except OSError as e:
            raise InputError(
                f"cannot read the API key file {key_file}: {e.strerror}", "check the path"
            ) from e
        from_file = [ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]
        if not from_file:
            raise InputError(f"the API key file {key_file} holds no key", "write one key per line")
        found += from_file
    if any(not k or any(c.isspace() for c in k) for k in found):
        raise InputError("an API key is empty or contains whitespace", "use a non-empty token")
    return tuple(found)
