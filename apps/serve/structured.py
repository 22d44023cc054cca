"""What OpenAI clients ask for beyond text: `response_format`, `tools`, `logprobs`.

response_format  {"type": "json_object"} or {"type": "json_schema", "json_schema":
                 {"schema": ...}}: a specx Grammar (runtime/constraint.py), so the output is
                 constrained token by token and stays speculative
tools            rendered by the model's chat template (its `tools` variable). tool_choice
                 "required" or a named function constrains the output to one call: JSON
                 {"name": ..., "arguments": ...} valid against the tool's parameters, between
                 <tool_call> tags when the template writes calls that way (Qwen, Hermes);
                 "auto" lets the model choose and reads calls back from the text; "none"
                 leaves the tools out of the prompt
logprobs         each emitted token's log-probability under the target's distribution as
                 sampled, with alternatives, in the chat or the completions shape
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from specx.apps.serve.errors import RequestError
from specx.runtime import Grammar, TokenLogprob
from specx.runtime.verification.logprobs import MAX_TOP_LOGPROBS

OPEN_TAG, CLOSE_TAG = "<tool_call>", "</tool_call>"
MAX_COMPLETION_LOGPROBS = 5  # the legacy completions API's limit


def response_grammar(body: dict[str, Any]) -> Grammar | None:
    """The grammar `response_format` asks for (None: plain text)."""
    fmt = body.get("response_format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_object", "json_schema"):
        raise RequestError(
            "response_format must be {'type': 'text' | 'json_object' | 'json_schema', ...}",
            "response_format",
        )
    if fmt["type"] == "text":
        return None
    if fmt["type"] == "json_object":
        return Grammar.json_object()
    spec = fmt.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict | bool):
        raise RequestError(
            "response_format json_schema needs {'json_schema': {'name': ..., 'schema': {...}}}",
            "response_format",
        )
    return Grammar.json_schema(spec.get("schema", {}))


@dataclass(frozen=True)
class Tools:
    """The request's tools and what it lets the model do with them."""

    specs: tuple[dict[str, Any], ...]  # OpenAI's {"type": "function", "function": {...}}
    choice: str  # "auto", "none", "required" or the one function's name that must be called

    @property
    def names(self) -> list[str]:
        return [t["function"]["name"] for t in self.specs]

    @property
    def forced(self) -> bool:
        return self.choice not in ("auto", "none")

    def call_schema(self) -> dict[str, Any]:
        """JSON Schema of one call: a tool's name and arguments valid against its parameters."""
        options = [
            {
                "type": "object",
                "properties": {
                    "name": {"const": t["function"]["name"]},
                    "arguments": t["function"].get("parameters") or {"type": "object"},
                },
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            for t in self.specs
            if self.choice == "required" or t["function"]["name"] == self.choice
        ]
        return options[0] if len(options) == 1 else {"anyOf": options}

    def grammar(self, tag: Callable[[str], str] | None) -> Grammar | None:
        """The constraint of a forced call (None unless tool_choice forces one); `tag` writes
        the template's <tool_call> markup as a Lark terminal (None: the template has none)."""
        if not self.forced:
            return None
        layout = Grammar("json_object").json_options
        schema = json.dumps({**self.call_schema(), "x-guidance": layout})
        if tag is None:
            return Grammar.json_schema(schema)
        # the template's own markup around the call (special tokens where the tokenizer has
        # them), the call itself as JSON
        return Grammar(
            "lark",
            f'start: {tag(OPEN_TAG)} "\\n" call "\\n" {tag(CLOSE_TAG)}\ncall: %json {schema}\n',
        )


def parse_tools(body: dict[str, Any]) -> Tools | None:
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if tools in (None, []):
        if choice not in (None, "none", "auto"):
            raise RequestError("tool_choice needs tools", "tool_choice")
        return None
    if not isinstance(tools, list):
        raise RequestError("tools must be a list", "tools")
    specs = []
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if (
            not isinstance(tool, dict)
            or tool.get("type") != "function"
            or not isinstance(function, dict)
            or not isinstance(function.get("name"), str)
            or not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", function["name"])
        ):
            raise RequestError(
                f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ..., "
                "'parameters': {...}}}}} with a name of letters, digits, _ or -",
                f"tools[{i}]",
            )
        if not isinstance(function.get("parameters", {}), dict):
            raise RequestError(f"tools[{i}].function.parameters must be a JSON Schema object")
        specs.append(tool)
    if choice is None:
        choice = "auto"
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name")
        if choice.get("type") != "function" or not isinstance(name, str):
            raise RequestError(
                "tool_choice must be 'none', 'auto', 'required' or "
                "{'type': 'function', 'function': {'name': ...}}",
                "tool_choice",
            )
        choice = name
    elif choice not in ("none", "auto", "required"):
        raise RequestError("tool_choice must be 'none', 'auto' or 'required'", "tool_choice")
    found = Tools(tuple(specs), choice)
    if found.forced and choice != "required" and choice not in found.names:
        raise RequestError(f"tool_choice names {choice!r}, which is not among the tools")
    return found


def _call(name: str, arguments: Any) -> dict[str, Any]:
    return {
        "id": "call_" + uuid.uuid4().hex[:24],
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)},
    }


def _as_call(text: str, names: list[str]) -> dict[str, Any] | None:
    # some templates show the call's format with Jinja-escaped braces ({{"name": ...}}, as
    # Qwen2.5-Coder's GGUF template does) and models copy them ('{{' is never valid JSON)
    doubled = text.startswith("{{") and text.endswith("}}")
    try:
        value = json.loads(text[1:-1] if doubled else text)
    except json.JSONDecodeError:
        return None
    if (
        isinstance(value, dict)
        and value.get("name") in names
        and isinstance(value.get("arguments", {}), dict)
    ):
        return _call(value["name"], value.get("arguments", {}))
    return None


def read_tool_calls(text: str, tools: Tools) -> tuple[str | None, list[dict[str, Any]]]:
    """(the reply's content, its tool calls) from the generated text: calls between
    <tool_call> tags, or the whole text as one call's JSON."""
    if tools.choice == "none":
        return text, []
    calls = []
    rest = text
    for match in re.finditer(re.escape(OPEN_TAG) + r"(.*?)" + re.escape(CLOSE_TAG), text, re.S):
        call = _as_call(match.group(1).strip(), tools.names)
        if call is not None:
            calls.append(call)
            rest = rest.replace(match.group(0), "", 1)
    if not calls:  # the whole text as one call, maybe in a Markdown fence as models write JSON
        fenced = re.fullmatch(r"```(?:json)?\s*(.*?)\s*```", text.strip(), re.S)
        call = _as_call((fenced.group(1) if fenced else text).strip(), tools.names)
        if call is not None:
            return None, [call]
    content = rest.strip()
    return (content or None) if calls else text, calls


def template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as chat templates read them: a call's arguments as an object, not a string."""
    out = []
    for message in messages:
        calls = message.get("tool_calls")
        if calls:
            message = dict(message)
            message["tool_calls"] = [
                {**c, "function": {**c["function"], "arguments": _arguments(c)}} for c in calls
            ]
        out.append(message)
    return out


def _arguments(call: dict[str, Any]) -> Any:
    arguments = call["function"].get("arguments", "{}")
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except json.JSONDecodeError:
            return arguments
    return arguments


# -- logprobs ---------------------------------------------------------------------------------
def requested_logprobs(body: dict[str, Any], chat: bool) -> int | None:
    """How many alternatives per token the request asks for (None: no logprobs)."""
    logprobs = body.get("logprobs")
    if chat:
        top = body.get("top_logprobs")
        if logprobs in (None, False):
            if top not in (None, 0):
                raise RequestError("top_logprobs needs logprobs: true", "top_logprobs")
            return None
        if logprobs is not True:
            raise RequestError("logprobs must be true or false", "logprobs")
        if top is None:
            return 0
        if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= MAX_TOP_LOGPROBS:
            raise RequestError(
                f"top_logprobs must be an integer in 0..{MAX_TOP_LOGPROBS}", "top_logprobs"
            )
        return top
    if logprobs is None:
        return None
    if (
        isinstance(logprobs, bool)
        or not isinstance(logprobs, int)
        or not 0 <= logprobs <= MAX_COMPLETION_LOGPROBS
    ):
        raise RequestError(
            f"logprobs must be an integer in 0..{MAX_COMPLETION_LOGPROBS}", "logprobs"
        )
    return logprobs


def chat_logprobs(entries: list[TokenLogprob], token_bytes: dict[int, bytes]) -> dict[str, Any]:
    """OpenAI's chat shape: {"content": [{token, logprob, bytes, top_logprobs}], ...}."""

    def one(token: int, logprob: float) -> dict[str, Any]:
        raw = token_bytes[token]
        return {
            "token": raw.decode("utf-8", errors="replace"),
            "logprob": logprob,
            "bytes": list(raw),
        }

    content = [
        {**one(e.token, e.logprob), "top_logprobs": [one(t, lp) for t, lp in e.top]}
        for e in entries
    ]
    return {"content": content, "refusal": None}


def completion_logprobs(
    entries: list[TokenLogprob], token_bytes: dict[int, bytes], offset: int = 0
) -> dict[str, Any]:
    """The legacy completions shape: tokens, token_logprobs, top_logprobs, text_offset."""
    tokens, offsets = [], []
    for e in entries:
        text = token_bytes[e.token].decode("utf-8", errors="replace")
        tokens.append(text)
        offsets.append(offset)
        offset += len(text)
    return {
        "tokens": tokens,
        "token_logprobs": [e.logprob for e in entries],
        "top_logprobs": [
            {token_bytes[t].decode("utf-8", errors="replace"): lp for t, lp in e.top}
            for e in entries
        ],
        "text_offset": offsets,
    }
