"""`specx serve` with real parts: a uvicorn server on 127.0.0.1 and the official `openai` client.

Each test starts its own server on a free port in a background thread and stops it at the end;
every wait is bounded.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from click.testing import CliRunner

from conftest import TinyPair, needs_exporter
from serve_tools import MODEL, client, serving

pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from specx.apps.cli.main import main  # noqa: E402

pytestmark = needs_exporter


@pytest.fixture
def slow_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every model pass takes 5 ms longer: tiny models generate thousands of tokens a second,
    too fast to disconnect from, queue behind or shut down in the middle of."""
    from specx.runtime.backends import OrtSession

    run = OrtSession._pass  # every pass: verify, decode and the prompt's (forward_last)

    def slow(self: OrtSession, tokens: Any, cache: Any, keep: int) -> Any:
        time.sleep(0.005)
        return run(self, tokens, cache, keep)

    monkeypatch.setattr(OrtSession, "_pass", slow)


def run_cli_chat(artifact: Any, prompt: str, n: int) -> dict[str, Any]:
    result = CliRunner().invoke(
        main, ["run", str(artifact), "-p", prompt, "--chat", "-n", str(n), "--json"]
    )
    assert result.exit_code == 0, result.output
    return dict(json.loads(result.stdout))


def test_a_greedy_chat_completion_equals_specx_run_chat_streamed_or_not(
    llama_pair: TinyPair,
) -> None:
    want = run_cli_chat(llama_pair.artifact, "The cat is", 20)
    with serving(llama_pair.artifact) as (base, _server, _pipe):
        api = client(base)
        assert [m.id for m in api.models.list().data] == [MODEL]
        reply = api.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "The cat is"}],
            max_tokens=20,
            temperature=0,
        )
        assert reply.choices[0].message.content == want["text"]
        assert reply.usage.completion_tokens == len(want["token_ids"])
        assert reply.usage.prompt_tokens == want["prompt_tokens"]
        assert reply.choices[0].finish_reason in ("length", "stop")
        extra = reply.model_extra or {}
        assert extra["specx"]["drafter"] == "mixed" and extra["specx"]["target_passes"] > 0
        pieces = []
        for event in api.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "The cat is"}],
            max_tokens=20,
            temperature=0,
            stream=True,
        ):
            if event.choices and event.choices[0].delta.content:
                pieces.append(event.choices[0].delta.content)
        assert "".join(pieces) == want["text"]


def test_completions_follow_the_pipeline_with_specx_extras(llama_pair: TinyPair) -> None:
    with serving(llama_pair.artifact) as (base, _server, pipe):
        api = client(base)
        for extra in ({"k": 3, "drafter": "ngram+other"}, {"k": "auto"}, {"k": 0}):
            want = pipe.generate("A dog", max_new_tokens=15, temperature=0.8, seed=3, **extra)
            got = api.completions.create(
                model=MODEL,
                prompt="A dog",
                max_tokens=15,
                temperature=0.8,
                seed=3,
                extra_body=extra,
            )
            assert got.choices[0].text == want.text, extra
        chunks = api.completions.create(
            model=MODEL,
            prompt="A dog",
            max_tokens=15,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        events = list(chunks)
        text = "".join(e.choices[0].text for e in events if e.choices)
        assert text == pipe.generate("A dog", max_new_tokens=15, k=4).text
        assert events[-1].usage.completion_tokens == 15


def test_stop_strings_end_the_text_before_them(llama_pair: TinyPair) -> None:
    with serving(llama_pair.artifact) as (base, _server, pipe):
        full = pipe.generate("The cat is", max_new_tokens=30).text
        stop = full[10:12]
        got = client(base).completions.create(
            model=MODEL, prompt="The cat is", max_tokens=30, temperature=0, stop=[stop]
        )
        assert got.choices[0].text == full[: full.index(stop)]
        assert got.choices[0].finish_reason == "stop"


def test_eight_concurrent_streams_all_get_their_own_text(llama_pair: TinyPair) -> None:
    prompts = [
        f"The {word} sat" for word in ["cat", "dog", "bird", "cow", "pig", "hen", "fox", "owl"]
    ]
    with serving(llama_pair.artifact, max_concurrency=2, max_queue=8) as (base, _s, pipe):
        want = [pipe.generate(p, max_new_tokens=24, k=3).text for p in prompts]

        def stream(prompt: str) -> str:
            events = client(base).completions.create(
                model=MODEL,
                prompt=prompt,
                max_tokens=24,
                temperature=0,
                stream=True,
                extra_body={"k": 3},
            )
            return "".join(e.choices[0].text for e in events if e.choices)

        with ThreadPoolExecutor(8) as pool:
            got = list(pool.map(stream, prompts))
        assert got == want


BAD = [
    ("not json", None, 400, None),
    ({"model": MODEL}, "chat", 400, "messages"),
    ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}, "chat", 400, "max_tokens"),
    (
        {"messages": [{"role": "user", "content": "hi"}], "temperature": -1},
        "chat",
        400,
        "temperature",
    ),
    ({"messages": [{"role": "user", "content": "hi"}], "top_p": 1.5}, "chat", 400, "top_p"),
    ({"messages": [{"role": "user", "content": "hi"}], "top_p": 0}, "chat", 400, "top_p"),
    ({"messages": [{"role": "user", "content": "word " * 300}]}, "chat", 400, "messages"),
    ({"messages": [{"role": "user", "content": "hi"}], "drafter": "turbo"}, "chat", 400, "drafter"),
    ({"messages": [{"role": "user", "content": "hi"}], "n": 2}, "chat", 400, "n"),
    ({"messages": [{"role": "user", "content": "hi"}], "logprobs": 3}, "chat", 400, "logprobs"),
    ({"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 3}, "chat", 400, None),
    ({"prompt": "hi", "logprobs": 9}, "completions", 400, "logprobs"),
    ({"prompt": "hi", "logit_bias": {"5": 3}}, "completions", 400, "logit_bias"),
    ({"prompt": "hi", "response_format": {"type": "xml"}}, "completions", 400, "response_format"),
    (
        {
            "prompt": "hi",
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "nonsense"}},
            },
        },
        "completions",
        400,
        "response_format",
    ),
    (
        {"messages": [{"role": "user", "content": "hi"}], "tool_choice": "required"},
        "chat",
        400,
        "tool_choice",
    ),
    (
        {
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"type": "function", "function": {"name": "a b"}}],
        },
        "chat",
        400,
        "tools[0]",
    ),
    ({"messages": [{"role": "robot", "content": "hi"}]}, "chat", 400, "messages[0].role"),
    ({"prompt": ""}, "completions", 400, "prompt"),
    ({"prompt": "hi", "stop": ["a", "b", "c", "d", "e"]}, "completions", 400, "stop"),
    ({"prompt": "hi", "k": 99}, "completions", 400, "k"),
    ({"prompt": "hi", "model": "gpt-9"}, "completions", 404, "model"),
]


def test_every_bad_request_gets_an_openai_error_and_the_server_keeps_serving(
    llama_pair: TinyPair,
) -> None:
    with serving(llama_pair.artifact) as (base, _server, pipe):
        want = pipe.generate("The cat", max_new_tokens=8, k=4).text
        for body, endpoint, status, param in BAD:
            path = "/v1/completions" if endpoint == "completions" else "/v1/chat/completions"
            content = body if isinstance(body, str) else json.dumps(body)
            reply = httpx.post(base + path, content=content, timeout=30)
            assert reply.status_code == status, (body, reply.text)
            error = reply.json()["error"]
            assert error["message"] and "Traceback" not in error["message"]
            assert param is None or error["param"] == param, (body, error)
            again = client(base).completions.create(
                model=MODEL, prompt="The cat", max_tokens=8, temperature=0
            )
            assert again.choices[0].text == want


def test_a_client_that_disconnects_mid_stream_frees_its_slot(
    long_pair: TinyPair, slow_passes: None
) -> None:
    with serving(long_pair.artifact, max_concurrency=1, max_queue=0) as (base, _s, pipe):
        body = {"prompt": "The cat", "max_tokens": 1900, "temperature": 0, "stream": True}
        with httpx.stream("POST", base + "/v1/completions", json=body, timeout=60) as reply:
            lines = reply.iter_lines()
            assert any(line.startswith("data:") for line in lines)  # it is streaming
            assert httpx.get(base + "/health").json()["active"] == 1
        deadline = time.monotonic() + 10  # closed: the generation stops after its current step
        while httpx.get(base + "/health").json()["active"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert httpx.get(base + "/health").json()["active"] == 0
        assert pipe.idle_workspaces(pipe.default_drafter) == 1  # its caches are back in the pool
        metrics = httpx.get(base + "/metrics").text
        generated = next(
            float(line.split()[-1])
            for line in metrics.splitlines()
            if line.startswith("specx_generated_tokens_total")
        )
        assert 0 < generated < 1900  # stopped mid-way, not run to the end
        short = httpx.post(base + "/v1/completions", json={"prompt": "hi", "max_tokens": 3})
        assert short.status_code == 200


def test_past_the_queue_a_request_gets_429_with_retry_after(
    long_pair: TinyPair, slow_passes: None
) -> None:
    with serving(long_pair.artifact, max_concurrency=1, max_queue=0) as (base, _s, _pipe):
        body = {"prompt": "The cat", "max_tokens": 1900, "temperature": 0, "stream": True}
        with httpx.stream("POST", base + "/v1/completions", json=body, timeout=60) as running:
            lines = running.iter_lines()  # kept: a dropped iterator closes the response
            next(lines)
            refused = httpx.post(base + "/v1/completions", json={"prompt": "hi", "max_tokens": 2})
            assert refused.status_code == 429
            assert int(refused.headers["Retry-After"]) >= 1
            assert refused.json()["error"]["code"] == "busy"


def test_a_request_past_its_time_limit_gets_504(long_pair: TinyPair, slow_passes: None) -> None:
    with serving(long_pair.artifact, request_timeout_s=0.3) as (base, _s, pipe):
        started = time.monotonic()
        reply = httpx.post(
            base + "/v1/completions",
            json={"prompt": "The cat", "max_tokens": 1900, "temperature": 0},
            timeout=60,
        )
        assert reply.status_code == 504 and "time limit" in reply.json()["error"]["message"]
        assert time.monotonic() - started < 10
        assert pipe.idle_workspaces(pipe.default_drafter) == 1


def test_metrics_and_health_report_the_serving_state(llama_pair: TinyPair) -> None:
    with serving(llama_pair.artifact) as (base, _server, _pipe):
        assert httpx.get(base + "/health").json()["status"] == "ok"
        client(base).completions.create(model=MODEL, prompt="The cat", max_tokens=12, temperature=0)
        httpx.post(base + "/v1/completions", json={"prompt": ""})
        text = httpx.get(base + "/metrics").text
        values = {
            line.split(" ")[0]: float(line.split(" ")[-1])
            for line in text.splitlines()
            if line and not line.startswith("#")
        }
        assert values['specx_requests_total{endpoint="completions",status="200"}'] == 1
        assert values['specx_requests_total{endpoint="completions",status="400"}'] == 1
        assert values["specx_generated_tokens_total"] == 12
        assert 0 < values["specx_acceptance_rate"] <= 1 and values["specx_tokens_per_second"] > 0
        assert values["specx_queue_depth"] == 0 and values["specx_active_requests"] == 0
        assert values["specx_time_to_first_token_seconds_count"] == 1


def test_shutdown_lets_a_running_stream_finish(long_pair: TinyPair, slow_passes: None) -> None:
    with serving(long_pair.artifact) as (base, server, pipe):
        body = {"prompt": "The cat", "max_tokens": 300, "temperature": 0, "stream": True}
        want = pipe.generate("The cat", max_new_tokens=300, k=4).text
        with httpx.stream("POST", base + "/v1/completions", json=body, timeout=60) as reply:
            lines = reply.iter_lines()
            first = next(line for line in lines if line.startswith("data:"))
            server.should_exit = True  # what SIGTERM does
            rest = [line for line in lines if line.startswith("data:")]
        texts = [json.loads(line[5:])["choices"] for line in [first, *rest] if "[DONE]" not in line]
        assert "".join(c[0]["text"] for c in texts if c) == want
        assert rest[-1].strip() == "data: [DONE]"


def test_serve_refuses_bad_options_cleanly(llama_pair: TinyPair) -> None:
    for args, message in (
        (["--port", "70000"], "--port must be in 1..65535"),
        (["--max-concurrency", "0"], "--max-concurrency must be >= 1"),
    ):
        result = CliRunner().invoke(main, ["serve", str(llama_pair.artifact), *args])
        assert result.exit_code == 2 and message in result.stderr, result.output


def test_the_runtime_core_never_imports_the_server_stack() -> None:
    import subprocess
    import sys

    code = (
        "import sys, specx.runtime\nfrom specx.runtime import Pipeline\n"
        "print([m for m in ('starlette', 'uvicorn', 'sse_starlette', 'prometheus_client')"
        " if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "[]", out.stderr


def test_seeded_sampling_is_the_same_text_over_http_for_any_k(llama_pair: TinyPair) -> None:
    with serving(llama_pair.artifact) as (base, _server, _pipe):
        texts = {
            client(base)
            .completions.create(
                model=MODEL,
                prompt="The cat",
                max_tokens=20,
                temperature=1.0,
                seed=11,
                extra_body={"k": k},
            )
            .choices[0]
            .text
            for k in (0, 2, 5, "auto")
        }
        assert len(texts) == 1


def test_with_an_api_key_only_requests_carrying_it_are_served(
    llama_pair: TinyPair, tmp_path: Any
) -> None:
    """The official client's api_key is the bearer token; without it or with another key the
    server answers 401 in OpenAI's shape (the client raises AuthenticationError); /health and
    /metrics stay open."""
    keys = ("first-key", "second-key")
    with serving(llama_pair.artifact, api_keys=keys) as (base, _server, _pipe):
        for key in keys:
            good = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0, timeout=60)
            reply = good.completions.create(model=MODEL, prompt="The cat", max_tokens=4)
            assert reply.usage.completion_tokens == 4
            assert [m.id for m in good.models.list().data] == [MODEL]
        for wrong in ("first-ke", "first-key2", "unused"):
            bad = openai.OpenAI(base_url=f"{base}/v1", api_key=wrong, max_retries=0, timeout=60)
            with pytest.raises(openai.AuthenticationError) as refused:
                bad.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4
                )
            assert refused.value.status_code == 401
        bare = httpx.post(base + "/v1/completions", json={"prompt": "a"}, timeout=30)
        assert bare.status_code == 401
        assert bare.json()["error"]["code"] == "invalid_api_key"
        assert bare.headers["www-authenticate"] == "Bearer"
        basic = httpx.get(base + "/v1/models", headers={"Authorization": "Basic first-key"})
        assert basic.status_code == 401
        assert httpx.get(base + "/health", timeout=30).status_code == 200
        metrics = httpx.get(base + "/metrics", timeout=30).text
        assert 'endpoint="unauthorized"' in metrics
    # negative control: without keys the same bare request is served
    with serving(llama_pair.artifact) as (base, _server, _pipe):
        body = {"prompt": "a", "max_tokens": 2}
        assert httpx.post(base + "/v1/completions", json=body, timeout=30).status_code == 200


def test_serve_reads_api_keys_from_a_file_and_refuses_an_empty_one(
    llama_pair: TinyPair, tmp_path: Any
) -> None:
    from specx.apps.serve.auth import read_keys

    keys = tmp_path / "keys"
    keys.write_text("# team keys\nalpha\n\n  beta  \n")
    assert read_keys(("gamma",), keys) == ("gamma", "alpha", "beta")
    empty = tmp_path / "empty"
    empty.write_text("# nothing yet\n")
    for args, message in (
        (["--api-key-file", str(empty)], "holds no key"),
        (["--api-key-file", str(tmp_path / "missing")], "cannot read the API key file"),
        (["--api-key", "two words"], "empty or contains whitespace"),
    ):
        result = CliRunner().invoke(main, ["serve", str(llama_pair.artifact), *args])
        assert result.exit_code == 2 and message in result.stderr, result.output
