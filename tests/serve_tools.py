"""A real `specx serve` for tests: uvicorn on 127.0.0.1 in a background thread, and the official
`openai` client pointed at it; every wait is bounded."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from specx.apps.serve import ServeConfig, Server
from specx.runtime import Pipeline

MODEL = "tiny"


@contextmanager
def serving(
    artifact: Any, batch: int = 0, prefix: Any = None, context: int = 96, **config: Any
) -> Iterator[tuple[str, Any, Pipeline]]:
    """batch: rows of a shared batch of `context` positions (Pipeline.enable_batching; 0: each
    request alone); prefix: the pipeline's PrefixConfig (default: prompts reused)."""
    import uvicorn

    pipeline = Pipeline.load(artifact, prefix=prefix)
    if batch:
        pipeline.enable_batching(max_batch=batch, context=context)
    app = Server(pipeline, ServeConfig(model_name=MODEL, **config)).app()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=10, lifespan="on")
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.started, "the server did not start"
    try:
        yield f"http://127.0.0.1:{port}", server, pipeline
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        assert not thread.is_alive(), "the server did not stop"
        sock.close()
        if batch:
            pipeline.disable_batching()


def client(base: str) -> Any:
    return __import__("openai").OpenAI(
        base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=60
    )
