"""`specx serve`: an OpenAI-compatible HTTP server over one shared Pipeline (Starlette + uvicorn).

    POST /v1/completions, POST /v1/chat/completions   streamed (server-sent events) or not
    GET  /v1/models                                   the one model served
    GET  /health                                      200 while serving, 503 while shutting down
    GET  /metrics                                     Prometheus text format

With `api_keys`, /v1/* answers 401 unless the request carries one of them (auth.py).

Every error is OpenAI's error object with a 4xx/5xx status; nothing answers with a traceback.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from specx.apps.serve.auth import ApiKeyGuard, ASGIApp
from specx.apps.serve.engine import Busy, Delta, Done, Engine, Job, ShuttingDown
from specx.apps.serve.errors import param_of
from specx.apps.serve.grammars import GrammarGate
from specx.apps.serve.metrics import Metrics
from specx.apps.serve.protocol import (
    Request,
    RequestError,
    chunk,
    finish_reason,
    parse_request,
    response,
    usage,
)
from specx.apps.serve.structured import (
    OPEN_TAG,
    chat_logprobs,
    completion_logprobs,
    read_tool_calls,
    template_messages,
)
from specx.runtime import GenerationSettings, InputError, Pipeline, SpecxError, TokenLogprob
from specx.runtime.grammar_limits import DEFAULT_LIMITS, GrammarLimits


@dataclass(frozen=True)
class ServeConfig:
    model_name: str
    max_concurrency: int = 2  # generations at once, each on its own workspace (caches)
    max_queue: int = 16  # requests waiting for a slot; past it: 429 with Retry-After
    request_timeout_s: float = 300.0  # a generation stops (and a waiting request gives up) here
    shutdown_grace_s: float = 10.0  # on SIGTERM, streams may finish for this long, then stop
    max_body_bytes: int = 4 * 2**20
    api_keys: tuple[str, ...] = ()  # when set, /v1/* needs `Authorization: Bearer <one of them>`
    # what a request's grammar may cost the matcher, and how long its check may take (grammars.py)
    grammar_limits: GrammarLimits = DEFAULT_LIMITS
    grammar_timeout_s: float = 10.0
    grammar_workers: int = 2  # threads that check grammars, apart from the generations'


ENDPOINTS = {"/v1/completions": "completions", "/v1/chat/completions": "chat"}


def refusal(exc: BaseException, config: ServeConfig) -> RequestError | None:
    """The answer to an engine's refusal or a specx error; None for anything else (a bug)."""
    if isinstance(exc, Busy):
        return RequestError(
            "the server is busy: every generation slot and the queue are taken",
            status=429,
            kind="rate_limit_error",
            code="busy",
            headers={"Retry-After": str(exc.retry_after_s)},
        )
    if isinstance(exc, ShuttingDown):
        return RequestError(
            "the server is shutting down",
            status=503,
            kind="unavailable",
            headers={"Retry-After": "5"},
        )
    if isinstance(exc, TimeoutError):
        return RequestError(
            f"the request waited for a slot past its time limit ({config.request_timeout_s:g} s)",
            status=503,
            kind="timeout",
            headers={"Retry-After": "1"},
        )
    if isinstance(exc, SpecxError):  # the artifact or the machine, not the request
        return RequestError(str(exc), status=500, kind="server_error")
    return None


def _error(error: RequestError, metrics: Metrics) -> JSONResponse:
    metrics.errors.labels(error.kind).inc()
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


class Server:
    def __init__(self, pipeline: Pipeline, config: ServeConfig) -> None:
        self.pipeline = pipeline
        self.config = config
        self.metrics = Metrics()
        self._specials: set[int] | None = None
        self.engine = Engine(
            pipeline, config.max_concurrency, config.max_queue, self.metrics.finished
        )
        pipeline.grammar_limits = config.grammar_limits
        self.grammars = GrammarGate(pipeline, config.grammar_timeout_s, config.grammar_workers)

    # -- endpoints --------------------------------------------------------------------------
    async def models(self, request: HttpRequest) -> Response:
        self.metrics.requests.labels("models", 200).inc()
        manifest = self.pipeline.manifest
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {
                        "id": self.config.model_name,
                        "object": "model",
                        "created": 0,
                        "owned_by": "specx",
                        "context_length": manifest.max_length,
                        "drafters": self.pipeline.drafter_names,
                        "default_drafter": self.pipeline.default_drafter,
                    }
                ],
            }
        )

    async def health(self, request: HttpRequest) -> Response:
        e = self.engine
        body = {
            "status": "ok" if e.accepting else "shutting down",
            "model": self.config.model_name,
            "active": e.active,
            "waiting": e.waiting,
        }
        return JSONResponse(body, status_code=200 if e.accepting else 503)

    async def prometheus(self, request: HttpRequest) -> Response:
        self.metrics.queue_depth.set(self.engine.waiting)
        self.metrics.active.set(self.engine.active)
        self.metrics.read_store(self.pipeline.prefixes.store)
        return Response(generate_latest(self.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def completions(self, request: HttpRequest) -> Response:
        return await self._complete(request, chat=False)

    async def chat_completions(self, request: HttpRequest) -> Response:
        return await self._complete(request, chat=True)

    # -- one completion ---------------------------------------------------------------------
    async def _complete(self, http: HttpRequest, chat: bool) -> Response:
        endpoint = "chat" if chat else "completions"
        try:
            request, job = await self._admit(http, chat)
            events = self.engine.run(job)
            if request.stream:
                first = await anext(events)  # admission errors surface before the 200
                self.metrics.requests.labels(endpoint, 200).inc()
                return EventSourceResponse(
                    self._stream(request, job, first, events),
                    ping=15,
                    shutdown_grace_period=self.config.shutdown_grace_s,
                )
            text, done = "", None
            async for item in events:
                if isinstance(item, Done):
                    done = item
            assert done is not None
            text = done.text
            failure = self._failure(request, job, done)
            if failure is not None:
                raise failure
            stats = done.result.stats
            self.metrics.requests.labels(endpoint, 200).inc()
            counts = usage(stats.prompt_tokens, stats.new_tokens, stats.reused_prompt_tokens)
            content: str | None = text
            calls: list[dict[str, Any]] = []
            if request.tools is not None:
                content, calls = read_tool_calls(text, request.tools)
            entries = done.result.logprobs
            body = response(
                request,
                self.config.model_name,
                content,
                finish_reason(done.reason),
                counts,
                stats.to_json(),
                None if entries is None else self._logprobs(request, self._fit(entries, text)),
                calls,
            )
            return JSONResponse(body)
        except (RequestError, Busy, ShuttingDown, TimeoutError, SpecxError) as e:
            error = e if isinstance(e, RequestError) else refusal(e, self.config)
            assert error is not None
            self.metrics.requests.labels(endpoint, error.status).inc()
            return _error(error, self.metrics)

    async def _admit(self, http: HttpRequest, chat: bool) -> tuple[Request, Job]:
        raw = await http.body()
        if len(raw) > self.config.max_body_bytes:
            raise RequestError("the request body is too large", status=413)
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise RequestError(f"the request body is not valid JSON: {e}") from e
        except RecursionError as e:
            raise RequestError("the request body is nested too deeply to read") from e
        request = parse_request(body, chat)
        model = body.get("model")
        if model is not None and model != self.config.model_name:
            raise RequestError(
                f"the model {model!r} is not served here (this server serves "
                f"{self.config.model_name!r})",
                "model",
                status=404,
                code="model_not_found",
            )
        try:
            settings = request.settings
            if request.messages is not None:
                tools = request.tools
                specs = list(tools.specs) if tools is not None and tools.choice != "none" else None
                messages = template_messages(request.messages)
                prompt = self.pipeline.codec.encode_messages(messages, tools=specs)
                if tools is not None and tools.forced:
                    tagged = OPEN_TAG in (self.pipeline.codec.chat_template or "")
                    tag = self.pipeline.grammar_tokenizer().lark_literal if tagged else None
                    settings = GenerationSettings.of(settings, grammar=tools.grammar(tag))
            else:
                assert request.prompt is not None
                prompt = self.pipeline.encode_prompt(request.prompt)
            prompt = self.pipeline.encode_prompt(prompt)  # checks the length and the ids
            if not request.max_tokens_given:  # up to the end of the context
                room = self.pipeline.manifest.max_length - len(prompt) + 1
                settings = GenerationSettings.of(settings, max_new_tokens=max(1, room))
        except InputError as e:
            message = e.message + (f" ({e.hint})" if e.hint else "")
            raise RequestError(message, param_of(e, chat, request.tools is not None)) from e
        await self.grammars.check(settings, chat, request.tools)
        scope = self.cache_scope(http, request.cache_salt)
        settings = GenerationSettings.of(settings, cache_scope=scope)
        deadline = time.monotonic() + self.config.request_timeout_s
        return request, Job(prompt, settings, request.stop, deadline)

    def cache_scope(self, http: HttpRequest, salt: str | None) -> str:
        """Whose prompts a request may reuse: its API key's (every client is one tenant where
        the server takes no keys), narrowed by its cache_salt. Hashed: the caches never hold a
        key."""
        tenant = ""
        if self.config.api_keys:
            header = http.headers.get("authorization", "")
            token = header.partition(" ")[2].strip()
            tenant = "key:" + hashlib.sha256(token.encode()).hexdigest()[:32]
        if salt is None:
            return tenant
        return tenant + "|salt:" + hashlib.sha256(salt.encode()).hexdigest()[:32]

    async def _stream(
        self,
        request: Request,
        job: Job,
        first: Delta | Done,
        events: AsyncGenerator[Delta | Done, None],
    ) -> AsyncIterator[str]:
        model = self.config.model_name
        item: Delta | Done = first
        opened = False
        held = request.tools is not None and request.tools.choice != "none"  # calls: at the end
        offset = 0  # characters sent (completions' text_offset)
        try:
            while True:
                if isinstance(item, Delta):
                    if not held:
                        logprobs = None
                        if item.logprobs is not None:
                            logprobs = self._logprobs(request, item.logprobs, offset)
                        yield json.dumps(
                            chunk(request, model, item.text, None, not opened, logprobs=logprobs)
                        )
                        opened, offset = True, offset + len(item.text)
                else:
                    stats = item.result.stats
                    reason = finish_reason(item.reason)
                    failure = self._failure(request, job, item)
                    if held and failure is None:
                        assert request.tools is not None
                        content, calls = read_tool_calls(item.text, request.tools)
                        entries = item.result.logprobs
                        logprobs = None
                        if entries is not None:
                            logprobs = self._logprobs(request, self._fit(entries, item.text))
                        yield json.dumps(
                            chunk(
                                request,
                                model,
                                content,
                                None,
                                True,
                                logprobs=logprobs,
                                tool_calls=calls,
                            )
                        )
                        opened, reason = True, "tool_calls" if calls else reason
                    if failure is not None:  # OpenAI's error object as the last event
                        yield json.dumps(failure.body())
                    else:
                        yield json.dumps(chunk(request, model, None, reason, first=not opened))
                    if request.include_usage:
                        counts = usage(
                            stats.prompt_tokens, stats.new_tokens, stats.reused_prompt_tokens
                        )
                        yield json.dumps(
                            chunk(request, model, None, None, counts=counts, stats=stats.to_json())
                        )
                    yield "[DONE]"
                    return
                item = await anext(events)
        finally:
            await events.aclose()  # a client that went away: the generation stops

    def _failure(self, request: Request, job: Job, done: Done) -> RequestError | None:
        """The error a generation that ended early answers with: past its time limit, or its
        grammar's matcher gave up on a state no check before generation reached (the text so
        far is not what the grammar asked for)."""
        if job.timed_out:
            return RequestError(
                f"the request exceeded its time limit of {self.config.request_timeout_s:g} s",
                status=504,
                kind="timeout",
            )
        if done.reason == "grammar":
            forced = request.tools is not None and request.tools.forced
            return RequestError(
                done.result.stats.stop_detail, "tools" if forced else "response_format"
            )
        return None

    # -- logprobs ---------------------------------------------------------------------------
    def _fit(self, entries: list[TokenLogprob], text: str) -> list[TokenLogprob]:
        """The entries of the tokens that make `text` (a stop string may have cut it; end
        tokens are not text)."""
        eos = set(self.pipeline.manifest.special_tokens.eos_token_ids)
        raw = self.pipeline.token_bytes([e.token for e in entries])
        kept, length, limit = [], 0, len(text.encode("utf-8"))
        for e in entries:
            if e.token in eos or length >= limit:
                break
            kept.append(e)
            length += len(raw[e.token])
        return kept

    def _special_ids(self) -> set[int]:
        if self._specials is None:
            self._specials = self.pipeline.codec.special_ids
        return self._specials

    def _logprobs(
        self, request: Request, entries: list[TokenLogprob], offset: int = 0
    ) -> dict[str, Any]:
        special = self._special_ids()
        entries = [e for e in entries if e.token not in special]  # not in the text either
        ids = [e.token for e in entries] + [t for e in entries for t, _ in e.top]
        raw = self.pipeline.token_bytes(ids)
        if request.chat:
            return chat_logprobs(entries, raw)
        return completion_logprobs(entries, raw, offset)

    def app(self) -> ASGIApp:
        @asynccontextmanager
        async def lifespan(_app: Starlette) -> AsyncIterator[None]:
            yield
            self.engine.shutdown(cancel=True)
            self.grammars.shutdown()

        async def on_error(request: HttpRequest, exc: Exception) -> Response:
            error = refusal(exc, self.config) or RequestError(
                f"internal error ({type(exc).__name__})", status=500, kind="server_error"
            )
            endpoint = ENDPOINTS.get(request.url.path, "other")
            self.metrics.requests.labels(endpoint, error.status).inc()
            return _error(error, self.metrics)

        routes = [
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/health", self.health, methods=["GET"]),
            Route("/metrics", self.prometheus, methods=["GET"]),
        ]
        app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={Exception: on_error})
        if not self.config.api_keys:
            return app

        def refused() -> None:
            self.metrics.requests.labels("unauthorized", 401).inc()
            self.metrics.errors.labels("invalid_api_key").inc()

        return ApiKeyGuard(app, self.config.api_keys, refused)
