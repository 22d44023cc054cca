"""`specx serve` over a batching pipeline: concurrent OpenAI requests share the batch's passes
and each gets the text it would get alone."""

from __future__ import annotations

from typing import Any

import pytest

from batch_tools import PROMPTS
from conftest import needs_exporter
from specx.runtime import Pipeline

pytestmark = needs_exporter


def test_specx_serve_batches_concurrent_openai_requests(batched_llama: Any) -> None:
    import socket
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    pytest.importorskip("uvicorn")
    openai = pytest.importorskip("openai")
    import uvicorn

    from specx.apps.serve import ServeConfig, Server

    artifact, _ = batched_llama
    pipe = Pipeline.load(artifact)
    want = [pipe.generate(p, max_new_tokens=16, k=3, drafter="mixed").text for p in PROMPTS[:4]]
    pipe.enable_batching(max_batch=4, context=96)
    app = Server(pipe, ServeConfig(model_name="tiny", max_concurrency=4)).app()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        client = openai.OpenAI(
            base_url=f"http://127.0.0.1:{sock.getsockname()[1]}/v1",
            api_key="unused",
            max_retries=0,
            timeout=60,
        )

        def ask(prompt: str) -> str:
            out = client.completions.create(
                model="tiny",
                prompt=prompt,
                max_tokens=16,
                temperature=0,
                extra_body={"k": 3, "drafter": "mixed"},
            )
            return out.choices[0].text

        with ThreadPoolExecutor(4) as pool:
            got = list(pool.map(ask, PROMPTS[:4]))
        assert got == want
        assert max(pipe.batching.decoder.rows_per_pass) > 1
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()
        pipe.disable_batching()
