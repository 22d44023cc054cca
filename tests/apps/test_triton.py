"""`specx triton` with a real Triton Inference Server: the tritonserver binary that the PyPI
package nvidia-pytriton ships (CPU, Python backend), fetched by scripts/fetch_tritonserver.sh, runs
the repository in the environment scripts/setup_triton.sh makes; tritonclient (HTTP and gRPC
streaming) and Triton's generate endpoints query it. scripts/test.sh sets SPECX_TRITONSERVER and
SPECX_TRITON_PYTHON; without them, or where the binary cannot start, the tests skip and say why.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import TinyPair, needs_exporter
from specx.runtime import Pipeline

SERVER = os.environ.get("SPECX_TRITONSERVER", "")
PYTHON = os.environ.get("SPECX_TRITON_PYTHON", "")
pytestmark = [
    needs_exporter,
    pytest.mark.skipif(
        not (Path(SERVER).is_file() and Path(PYTHON).is_file()),
        reason="SPECX_TRITONSERVER / SPECX_TRITON_PYTHON are not set (scripts/test.sh sets them)",
    ),
]
httpx = pytest.importorskip("httpx")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def tritonserver(repository: Path) -> Iterator[tuple[str, str]]:
    """A tritonserver on free local ports serving `repository`; (HTTP base, gRPC address)."""
    from specx.apps.triton.repository import python_environment

    env_of = python_environment(PYTHON)
    http, grpc = free_port(), free_port()
    env = dict(os.environ)
    env["PATH"] = f"{env_of.prefix}/bin:{env['PATH']}"
    env["PYTHONPATH"] = ":".join(env_of.site_packages)
    log = repository.parent / "tritonserver.log"
    backends = Path(SERVER).parent.parent / "backends"
    with log.open("w") as out:
        server = subprocess.Popen(
            [
                SERVER,
                "--model-repository",
                str(repository),
                "--backend-directory",
                str(backends),
                "--http-address",
                "127.0.0.1",
                "--http-port",
                str(http),
                "--grpc-address",
                "127.0.0.1",
                "--grpc-port",
                str(grpc),
                "--allow-metrics",
                "false",
                "--exit-timeout-secs",
                "10",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    base = f"http://127.0.0.1:{http}"
    deadline = time.monotonic() + 120
    ready = False
    while time.monotonic() < deadline and server.poll() is None:
        try:
            ready = httpx.get(base + "/v2/health/ready", timeout=2).status_code == 200
        except httpx.HTTPError:
            ready = False
        if ready:
            break
        time.sleep(0.5)
    if not ready:
        server.kill()
        server.wait(timeout=30)
        pytest.skip(f"tritonserver did not start here: {log.read_text()[-800:]}")
    try:
        yield base, f"127.0.0.1:{grpc}"
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=30)


@pytest.fixture(scope="module")
def triton(tmp_path_factory: Any, llama_pair: TinyPair) -> Iterator[tuple[str, str]]:
    from specx.apps.triton.repository import write_repository

    repository = tmp_path_factory.mktemp("triton") / "repository"
    write_repository(llama_pair.artifact, repository, instances=1, python=PYTHON)
    with tritonserver(repository) as addresses:
        yield addresses


def test_the_generate_endpoint_gives_specx_run_text_and_stats(
    triton: tuple[str, str], llama_pair: TinyPair
) -> None:
    base, _grpc = triton
    want = Pipeline.load(llama_pair.artifact).generate("The cat is", max_new_tokens=16)
    reply = httpx.post(
        base + "/v2/models/specx/generate",
        json={"text_input": "The cat is", "max_tokens": 16, "temperature": 0},
        timeout=60,
    )
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["text_output"] == want.text
    stats = json.loads(body["specx_stats"])
    assert stats["new_tokens"] == 16 and stats["drafter"] == "mixed"


def test_generate_stream_deltas_add_up_to_the_text(
    triton: tuple[str, str], llama_pair: TinyPair
) -> None:
    base, _grpc = triton
    want = Pipeline.load(llama_pair.artifact).generate("A dog", max_new_tokens=20, k=3).text
    events = []
    with httpx.stream(
        "POST",
        base + "/v2/models/specx/generate_stream",
        json={"text_input": "A dog", "max_tokens": 20, "stream": True, "k": "3"},
        timeout=60,
    ) as reply:
        for line in reply.iter_lines():
            if line.startswith("data:"):
                events.append(json.loads(line[5:]))
    assert len(events) > 2  # streamed, not one block
    assert "".join(e["text_output"] for e in events) == want
    assert json.loads(events[-1]["specx_stats"])["k"] == 3


def test_tritonclient_sees_the_model_over_http(triton: tuple[str, str]) -> None:
    import tritonclient.http as triton_http

    base, _grpc = triton
    client = triton_http.InferenceServerClient(base.removeprefix("http://"))
    assert client.is_server_ready() and client.is_model_ready("specx")
    metadata = client.get_model_metadata("specx")
    assert {t["name"] for t in metadata["inputs"]} >= {"text_input", "max_tokens", "stream"}
    assert {t["name"] for t in metadata["outputs"]} == {"text_output", "specx_stats"}


def test_tritonclient_grpc_streaming_sampled_text_follows_the_seed(
    triton: tuple[str, str], llama_pair: TinyPair
) -> None:
    import tritonclient.grpc as triton_grpc

    _base, grpc = triton
    want = Pipeline.load(llama_pair.artifact).generate(
        "The cat", max_new_tokens=24, temperature=0.8, seed=5
    )
    results: queue.Queue[Any] = queue.Queue()
    client = triton_grpc.InferenceServerClient(grpc)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    inputs = []
    for name, value, kind in (
        ("text_input", np.array([b"The cat"], dtype=np.object_), "BYTES"),
        ("max_tokens", np.array([24], dtype=np.int32), "INT32"),
        ("temperature", np.array([0.8], dtype=np.float32), "FP32"),
        ("seed", np.array([5], dtype=np.uint64), "UINT64"),
        ("stream", np.array([True]), "BOOL"),
    ):
        tensor = triton_grpc.InferInput(name, [1], kind)
        tensor.set_data_from_numpy(value)
        inputs.append(tensor)
    client.async_stream_infer("specx", inputs, enable_empty_final_response=True)
    pieces, stats = [], None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        result, error = results.get(timeout=60)
        assert error is None, error
        response = result.get_response()
        text = result.as_numpy("text_output")
        if text is not None:
            pieces += [t.decode() for t in text]
        if result.as_numpy("specx_stats") is not None:
            stats = json.loads(result.as_numpy("specx_stats")[0])
        if response.parameters["triton_final_response"].bool_param:
            break
    client.stop_stream()
    assert "".join(pieces) == want.text
    assert stats is not None and stats["new_tokens"] == 24


def test_a_bad_request_gets_an_error_and_the_model_keeps_serving(
    triton: tuple[str, str], llama_pair: TinyPair
) -> None:
    base, _grpc = triton
    reply = httpx.post(
        base + "/v2/models/specx/generate",
        json={"text_input": "The cat", "max_tokens": 4, "k": "99"},
        timeout=60,
    )
    assert reply.status_code >= 400 and "K must be in 0..16" in reply.json()["error"]
    again = httpx.post(
        base + "/v2/models/specx/generate",
        json={"text_input": "The cat", "max_tokens": 4},
        timeout=60,
    )
    assert again.status_code == 200


def test_a_batching_repository_serves_concurrent_requests_with_their_solo_text(
    tmp_path: Path, tokenizer: Any
) -> None:
    from concurrent.futures import ThreadPoolExecutor

    import tiny_models
    from specx.apps.triton.repository import write_repository
    from specx.exporter import ExportOptions, export_pair

    vocab = tokenizer.get_vocab_size()
    src = tiny_models.save(tiny_models.build_model("llama", vocab, 1), tokenizer, tmp_path / "m")
    artifact = tmp_path / "batched"
    options = ExportOptions(max_length=128, batched=True)
    export_pair(str(src), ["ngram"], artifact, options, log=lambda _m: None)
    prompts = ["The cat is", "def add(a, b):", "One, two, three,", "A key-value cache"]
    pipe = Pipeline.load(artifact)
    want = [pipe.generate(p, max_new_tokens=12, k=2, drafter="ngram").text for p in prompts]
    repository = tmp_path / "repository"
    write_repository(artifact, repository, python=PYTHON, batch=4, batch_context=96)
    assert (
        'key: "max_batch" value: { string_value: "4" }'
        in (repository / "specx" / "config.pbtxt").read_text()
    )
    with tritonserver(repository) as (base, _grpc):

        def ask(prompt: str) -> str:
            body = {"text_input": prompt, "max_tokens": 12, "k": "2", "drafter": "ngram"}
            reply = httpx.post(f"{base}/v2/models/specx/generate", json=body, timeout=120)
            assert reply.status_code == 200, reply.text
            return str(reply.json()["text_output"])

        with ThreadPoolExecutor(4) as pool:
            assert list(pool.map(ask, prompts)) == want
        bad = httpx.post(
            f"{base}/v2/models/specx/generate",
            json={"text_input": "x", "max_tokens": 4, "drafter": "nope"},
            timeout=60,
        )
        assert bad.status_code >= 400 and "drafter" in bad.json()["error"]
        assert ask(prompts[0]) == want[0]  # still serving
