"""Fuzzed schemas and grammars: over HTTP with the official openai client, every response is a 200
whose output parses and validates (or stopped at its length) or a 4xx naming the field, never a
500; the server still answers /health afterwards and its memory stays bounded. Through `specx run`,
Lark, GBNF, regex and JSON Schema files exit 0 or 2, never with a traceback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from conftest import TinyPair, needs_exporter
from serve_tools import MODEL, client, serving

pytest.importorskip("uvicorn")
pytest.importorskip("llguidance")
openai = pytest.importorskip("openai")
hypothesis = pytest.importorskip("hypothesis")
jsonschema = pytest.importorskip("jsonschema")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

pytestmark = needs_exporter

# the server's resident memory may grow by at most this over the fuzz run (kept matchers,
# allocator slack); a leak per request would pass it within the run
RSS_GROWTH_BOUND = 300 * 2**20
PATTERNS = ["(a+)+b", "^(a|aa)*$", "[a-z]{1,3}(x|y)*", "((ab)*)*c", "(", "\\", "a{2,1}", ".*"]
FIELDS = ("response_format", "tools", "messages", "max_tokens")


def _properties(n: int) -> dict[str, Any]:
    return {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(n)}}


LEAVES = st.one_of(
    st.sampled_from(
        [
            {"type": "integer"},
            {"type": "string", "maxLength": 5},
            {"type": "boolean"},
            {"type": "null"},
            {"type": "nonsense"},
            {"$ref": "#/$defs/a"},
            {"$ref": "#/$defs/missing"},
            {"$ref": "#"},
            {"not": {}},
            {"type": "integer", "minimum": 5, "maximum": 1},
        ]
    ),
    st.builds(lambda n: {"enum": [f"v{i}" for i in range(n)]}, st.sampled_from([1, 3, 4000])),
    st.builds(lambda p: {"type": "string", "pattern": p}, st.sampled_from(PATTERNS)),
    st.builds(_properties, st.sampled_from([1, 4, 80, 600])),
)


def _object(members: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": members, "required": list(members)[:1]}


SCHEMAS = st.recursive(
    LEAVES,
    lambda inner: st.one_of(
        st.builds(lambda xs: {"anyOf": xs}, st.lists(inner, min_size=1, max_size=3)),
        st.builds(lambda xs: {"oneOf": xs}, st.lists(inner, min_size=1, max_size=3)),
        st.builds(lambda xs: {"allOf": xs}, st.lists(inner, min_size=1, max_size=3)),
        st.builds(lambda x: {"type": "array", "items": x, "maxItems": 2}, inner),
        st.builds(_object, st.dictionaries(st.sampled_from("abcd"), inner, max_size=3)),
    ),
    max_leaves=6,
)
# a root, maybe with definitions its references (cycles included) point into
ROOTS = st.builds(
    lambda root, a, b: {"$defs": {"a": a, "b": b}, **root} if isinstance(root, dict) else root,
    SCHEMAS,
    SCHEMAS,
    SCHEMAS,
)
GARBAGE = st.one_of(
    st.text(max_size=40),
    st.integers(),
    st.lists(st.integers(), max_size=3),
    st.binary(max_size=40).map(lambda b: b.decode("latin-1")),
    st.recursive(st.none() | st.booleans(), lambda x: st.lists(x, max_size=2), max_leaves=4),
)


def _valid(text: str, schema: Any) -> bool:
    """Whether the output parses and validates against the schema (a schema jsonschema itself
    cannot read is judged on parsing alone)."""
    data = json.loads(text)
    try:
        jsonschema.validate(data, schema)
    except jsonschema.ValidationError:
        return False
    except (jsonschema.SchemaError, jsonschema.exceptions.RefResolutionError, RecursionError):
        pass
    except Exception as e:  # referencing's Unresolvable and the like: the schema, not the output
        if type(e).__module__.split(".")[0] not in ("referencing", "jsonschema"):
            raise
    return True


def _resident_bytes() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * 4096


def _answer(api: Any, fmt: Any, tools: Any) -> str:
    """One fuzzed request: a 200 with valid output (or stopped at its length), or a 4xx naming
    the field; anything else fails the test. Returns which ("served" or "refused")."""
    extra: dict[str, Any] = {"response_format": fmt} if tools is None else {"tools": tools}
    if tools is not None:
        extra["tool_choice"] = "required"
    try:
        reply = api.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "The cat is"}],
            max_tokens=16,
            temperature=0,
            **extra,
        )
    except openai.BadRequestError as e:
        param = e.body.get("param") if isinstance(e.body, dict) else None
        assert param is not None and param.startswith(FIELDS), e.body
        return "refused"
    choice = reply.choices[0]
    if choice.finish_reason == "length" or tools is not None:
        return "served"  # a call is read back from the text (structured.py), checked there
    schema = fmt["json_schema"]["schema"] if fmt["type"] == "json_schema" else {"type": "object"}
    assert _valid(choice.message.content, schema), (choice.message.content, schema)
    return "served"


def _schema_format(schema: Any) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


REQUESTS = st.one_of(
    ROOTS.map(lambda s: (_schema_format(s), None)),
    GARBAGE.map(lambda g: (_schema_format(g), None)),
    GARBAGE.map(lambda g: ({"type": g}, None)),
    ROOTS.map(lambda s: (None, [{"type": "function", "function": {"name": "f", "parameters": s}}])),
)


def test_fuzzed_schemas_over_http_get_a_200_or_a_4xx_naming_the_field_never_a_500(
    llama_pair: TinyPair,
) -> None:
    with serving(llama_pair.artifact, max_concurrency=1) as (base, _server, _pipe):
        api = client(base)
        _answer(api, {"type": "json_object"}, None)  # warm: the grammar tokenizer is built
        before = _resident_bytes()

        @settings(
            max_examples=40,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        )
        @given(REQUESTS)
        def fuzz(request: tuple[Any, Any]) -> None:
            seen.append(_answer(api, *request))

        seen: list[str] = []
        fuzz()
        assert {"served", "refused"} <= set(seen)  # the run met both kinds
        grown = _resident_bytes() - before
        import httpx

        assert httpx.get(f"{base}/health", timeout=10).status_code == 200
        assert grown < RSS_GROWTH_BOUND, f"resident memory grew {grown / 2**20:.0f} MB"


LARK = st.sampled_from(
    [
        'start: a\na: a "x" | "y"\n',  # left recursion
        "start: foo\n",  # an undefined rule
        'start: "a" start | "b"\n',
        'start: /[a-z]+/ ("," /[a-z]+/)*\n',
        "start: %json {}\n",
        'start: ("a" | "b")* "c"\n',
    ]
)
GBNF = st.sampled_from(
    [
        'root ::= root "x" | "y"',
        "root ::= foo",
        'root ::= [a-z]+ ("," [a-z]+)*',
        'root ::= "a"{2,1}',
        "root ::= (",
    ]
)
REGEX = st.sampled_from(PATTERNS)
FILES = st.one_of(
    LARK.map(lambda t: (".lark", t)),
    GBNF.map(lambda t: (".gbnf", t)),
    REGEX.map(lambda t: (".regex", t)),
    ROOTS.map(lambda s: (".json", json.dumps(s))),
    GARBAGE.map(lambda g: (".json", g if isinstance(g, str) else json.dumps(g))),
    st.text(max_size=30).map(lambda t: (".lark", t)),
)


def test_fuzzed_grammar_files_through_run_exit_0_or_2_never_with_a_traceback(
    llama_pair: TinyPair, tmp_path: Path
) -> None:
    from click.testing import CliRunner

    from specx.apps.cli.main import main

    @settings(
        max_examples=25,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    @given(FILES)
    def fuzz(grammar: tuple[str, str]) -> None:
        codes.append(run(grammar))

    def run(grammar: tuple[str, str]) -> int:
        suffix, text = grammar
        path = tmp_path / f"grammar{suffix}"
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        args = ["run", str(llama_pair.artifact), "--prompt", "x", "--grammar", str(path), "-n", "8"]
        result = CliRunner().invoke(main, args)
        assert result.exit_code in (0, 2), (text, result.output, result.exception)
        assert result.exception is None or isinstance(result.exception, SystemExit), text
        assert "Traceback" not in result.output
        return int(result.exit_code)

    codes: list[int] = []
    fuzz()
    assert {0, 2} <= set(codes)  # the run met both kinds
