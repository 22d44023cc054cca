"""The OpenAI wire format: requests read into specx's settings, results written as responses.

A request is checked field by field; anything wrong is a `RequestError` with the status, the
field (`param`) and a message, sent back as OpenAI's error object. The mapping:

    max_tokens (max_completion_tokens)  GenerationSettings.max_new_tokens
    temperature (default 1), top_p, seed     SamplingParams (temperature 0: greedy)
    stop (a string or up to 4)          applied to the text as it streams
    n                                   must be 1
    response_format, tools, tool_choice GenerationSettings.grammar (structured.py)
    logprobs, top_logprobs              GenerationSettings.logprobs
    top_k, min_p, k ("auto" or 0..16), drafter, verification
                                        specx's extras (OpenAI clients: extra_body)
    cache_salt                          narrows the prompt cache's scope (vLLM's field): only
                                        requests of the same API key and salt reuse each other's
                                        prompts

Fields that would change the output distribution and that specx does not implement
(presence/frequency penalties, logit_bias) are refused rather than ignored.
"""

from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from specx.apps.serve.errors import RequestError, param_of
from specx.apps.serve.structured import (
    Tools,
    parse_tools,
    requested_logprobs,
    response_grammar,
)
from specx.runtime import GenerationSettings, InputError, SamplingParams
from specx.runtime.settings import AUTO, MAX_K

MAX_STOPS = 4
ROLES = ("system", "developer", "user", "assistant", "tool")
UNSUPPORTED = ("logit_bias", "functions", "function_call", "echo", "suffix")


@dataclass(frozen=True)
class Request:
    """One completion request, checked."""

    chat: bool
    prompt: str | list[int] | None  # completions
    messages: list[dict[str, Any]] | None  # chat
    settings: GenerationSettings
    stream: bool
    include_usage: bool
    stop: tuple[str, ...] = ()
    max_tokens_given: bool = False
    tools: Tools | None = None
    cache_salt: str | None = None  # narrows the prompt cache's scope within the API key's
    created: int = field(default_factory=lambda: int(time.time()))
    id: str = field(default_factory=lambda: uuid.uuid4().hex)


def _number(body: dict[str, Any], name: str, default: float, low: float, high: float) -> float:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise RequestError(f"{name} must be a number, got {value!r}", name)
    if not low <= value <= high:
        raise RequestError(f"{name} must be in [{low:g}, {high:g}], got {value}", name)
    return float(value)


def _integer(body: dict[str, Any], name: str, default: int | None, low: int) -> int | None:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(f"{name} must be an integer, got {value!r}", name)
    if value < low:
        raise RequestError(f"{name} must be >= {low}, got {value}", name)
    return value


def _stops(body: dict[str, Any]) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise RequestError("stop must be a non-empty string or a list of them", "stop")
    if len(stops) > MAX_STOPS:
        raise RequestError(f"stop takes at most {MAX_STOPS} strings", "stop")
    return tuple(stops)


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list", "messages")
    out = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise RequestError(
                f"{where} needs a role of system, user, assistant or tool", f"{where}.role"
            )
        content = message.get("content")
        if isinstance(content, list):  # content parts: text only
            if not all(isinstance(p, dict) and p.get("type") == "text" for p in content):
                raise RequestError(f"{where}: only text content is supported", f"{where}.content")
            content = "".join(str(p.get("text", "")) for p in content)
        calls = message.get("tool_calls") if message["role"] == "assistant" else None
        if content is None and calls:
            content = ""  # an assistant turn that only called tools
        if not isinstance(content, str):
            raise RequestError(f"{where}.content must be a string", f"{where}.content")
        role = "system" if message["role"] == "developer" else message["role"]
        turn: dict[str, Any] = {"role": role, "content": content}
        if calls:
            if not isinstance(calls, list) or not all(
                isinstance(c, dict) and isinstance(c.get("function"), dict) for c in calls
            ):
                raise RequestError(f"{where}.tool_calls must be a list of calls", where)
            turn["tool_calls"] = calls
        if role == "tool" and isinstance(message.get("tool_call_id"), str):
            turn["tool_call_id"] = message["tool_call_id"]
        out.append(turn)
    return out


def _prompt(body: dict[str, Any]) -> str | list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        if not prompt:
            raise RequestError("prompt must not be empty", "prompt")
        return prompt
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    ):
        return list(prompt)
    raise RequestError(
        "prompt must be a string or a list of token ids (one prompt per request)", "prompt"
    )


MAX_SALT = 256  # characters of a cache_salt


def _salt(body: dict[str, Any]) -> str | None:
    salt = body.get("cache_salt")
    if salt is None:
        return None
    if not isinstance(salt, str) or not salt or len(salt) > MAX_SALT:
        raise RequestError(
            f"cache_salt must be a non-empty string of at most {MAX_SALT} characters",
            "cache_salt",
        )
    return salt


def parse_request(body: Any, chat: bool) -> Request:
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    for name in UNSUPPORTED:
        if body.get(name) not in (None, False, 0, [], {}):
            raise RequestError(f"{name} is not supported by specx", name, code="unsupported")
    for name in ("presence_penalty", "frequency_penalty"):
        if body.get(name) not in (None, 0, 0.0):
            raise RequestError(f"{name} is not supported by specx", name, code="unsupported")
    if _integer(body, "n", 1, 1) != 1:
        raise RequestError("n must be 1: one completion per request", "n")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise RequestError("stream must be true or false", "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise RequestError("stream_options must be an object", "stream_options")
    limit_name = "max_completion_tokens" if body.get("max_completion_tokens") else "max_tokens"
    max_tokens = _integer(body, limit_name, None, 1)
    k: Any = body.get("k")
    if (
        k is not None
        and k != AUTO
        and (isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= MAX_K)
    ):
        raise RequestError(f"k must be an integer in 0..{MAX_K} or 'auto', got {k!r}", "k")
    top_p = _number(body, "top_p", 1.0, 0.0, 1.0)
    if top_p <= 0.0:
        raise RequestError(f"top_p must be in (0, 1], got {top_p:g}", "top_p")
    drafter = body.get("drafter")
    if drafter is not None and not isinstance(drafter, str):
        raise RequestError("drafter must be a string", "drafter")
    verification = body.get("verification", "invariant")
    tools = parse_tools(body) if chat else None
    grammar = response_grammar(body)
    forced = tools is not None and tools.forced
    if grammar is not None and forced:
        raise RequestError(
            "response_format and a forced tool call both constrain the output", "response_format"
        )
    try:
        sampling = SamplingParams(
            temperature=_number(body, "temperature", 1.0, 0.0, 1e6),
            top_k=_integer(body, "top_k", 0, 0) or 0,
            top_p=top_p,
            min_p=_number(body, "min_p", 0.0, 0.0, 0.999999),
            seed=_integer(body, "seed", None, 0),
            verification=verification,
        )
        settings = GenerationSettings(
            max_new_tokens=max_tokens or 16,  # replaced by the room left when not given
            k=k,
            max_k=_integer(body, "max_k", 8, 1) or 8,
            drafter=drafter,
            sampling=sampling,
            grammar=grammar,  # a forced tool call's grammar is set with the template (app.py)
            logprobs=requested_logprobs(body, chat),
        )
    except InputError as e:  # what the checks above leave: verification, max_k's range
        raise RequestError(e.message, param_of(e, chat)) from e
    return Request(
        chat=chat,
        prompt=None if chat else _prompt(body),
        messages=_messages(body) if chat else None,
        settings=settings,
        stream=stream,
        include_usage=bool(options.get("include_usage", False)),
        stop=_stops(body),
        max_tokens_given=max_tokens is not None,
        tools=tools,
        cache_salt=_salt(body),
    )


def finish_reason(stop_reason: str) -> str:
    return "stop" if stop_reason in ("eos", "stop") else "length"


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict[str, Any]:
    """OpenAI's usage record; cached_tokens: prompt tokens whose keys and values an earlier
    request of the same scope left (or another batch row holds) and were not computed again."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def response(
    request: Request,
    model: str,
    text: str | None,
    reason: str,
    counts: dict[str, Any],
    stats: Any,
    logprobs: dict[str, Any] | None = None,
    tool_calls: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The whole answer; with tool calls, `text` is the reply's content besides them (or None)."""
    choice: dict[str, Any] = {"index": 0, "finish_reason": reason, "logprobs": logprobs}
    if request.chat:
        choice["message"] = {"role": "assistant", "content": text}
        if tool_calls:
            choice["message"]["tool_calls"] = tool_calls
            choice["finish_reason"] = "tool_calls"
    else:
        choice["text"] = text or ""
    return {
        "id": ("chatcmpl-" if request.chat else "cmpl-") + request.id,
        "object": "chat.completion" if request.chat else "text_completion",
        "created": request.created,
        "model": model,
        "choices": [choice],
        "usage": counts,
        "specx": stats,
    }


def chunk(
    request: Request,
    model: str,
    text: str | None,
    reason: str | None,
    first: bool = False,
    counts: dict[str, Any] | None = None,
    stats: Any = None,
    logprobs: dict[str, Any] | None = None,
    tool_calls: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """One streamed event: a text delta (with its tokens' logprobs, or tool calls), the final
    one with its finish reason, or (with no text and no reason) the usage chunk."""
    choices: list[dict[str, Any]] = []
    if text is not None or reason is not None or tool_calls:
        choice: dict[str, Any] = {"index": 0, "finish_reason": reason, "logprobs": logprobs}
        if request.chat:
            delta: dict[str, Any] = {"role": "assistant"} if first else {}
            if text:
                delta["content"] = text
            if tool_calls:
                delta["tool_calls"] = [{"index": i, **c} for i, c in enumerate(tool_calls)]
            choice["delta"] = delta
        else:
            choice["text"] = text or ""
        choices.append(choice)
    out: dict[str, Any] = {
        "id": ("chatcmpl-" if request.chat else "cmpl-") + request.id,
        "object": "chat.completion.chunk" if request.chat else "text_completion",
        "created": request.created,
        "model": model,
        "choices": choices,
    }
    if counts is not None:
        out["usage"] = counts
    if stats is not None:
        out["specx"] = stats
    return out
