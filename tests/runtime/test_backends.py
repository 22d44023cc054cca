"""The backend seam: every backend implements GraphSession, caches live in the backend's
memory, and the TensorRT backend refuses engines built for another GPU or TensorRT."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from specx.runtime.backends import GraphSession, OrtSession
from specx.runtime.backends.trt_session import TensorRTSession
from specx.runtime.errors import ArtifactError, InputError
from specx.runtime.kv_cache import KVCache
from specx.runtime.memory import HOST


def test_both_backends_implement_the_graph_session_seam() -> None:
    assert issubclass(OrtSession, GraphSession) and issubclass(TensorRTSession, GraphSession)
    for backend in (OrtSession, TensorRTSession):
        assert not getattr(backend, "__abstractmethods__", ())  # forward, fork, pair_id written


class Echo(GraphSession):
    """A backend in a few lines: logits say which token was fed; the cache only advances."""

    def __init__(self) -> None:
        from specx.runtime.artifact.contract import ModelSpec

        self.spec = ModelSpec(
            role="target",
            name="target",
            graph="echo.onnx",
            architecture="llama",
            source="",
            num_layers=1,
            num_heads=1,
            kv_heads=1,
            head_dim=2,
            hidden_size=2,
            vocab_size=5,
            max_length=16,
            dtype="float32",
            num_parameters=0,
            weight_bytes=0,
            inputs=(),
            outputs=(),
        )
        self.memory = HOST
        self.max_chunk = 3
        self.passes = 0

    @property
    def pair_id(self) -> None:
        return None

    def forward(self, tokens: np.ndarray, cache: KVCache) -> np.ndarray:
        self.check_pass(int(tokens.shape[0]), cache)
        cache.advance(int(tokens.shape[0]))
        self.passes += 1
        return np.eye(self.vocab_size, dtype=np.float32)[tokens]

    def fork(self) -> Echo:
        return Echo()


def test_prefill_and_bounds_are_written_once_for_every_backend() -> None:
    session = Echo()
    cache = session.new_cache(16)
    assert cache.device == "cpu" and cache.length == 0
    last = session.prefill(np.array([1, 2, 3, 4, 0, 2, 3]), cache)  # chunks of 3, 3, 1
    assert session.passes == 3 and cache.length == 7
    assert last is not None and int(np.argmax(last)) == 3
    with pytest.raises(InputError, match="exceeds the 16 this graph was exported for"):
        session.new_cache(17)
    with pytest.raises(InputError, match=r"a pass takes 1\.\.3 tokens"):
        session.forward(np.array([1, 2, 3, 4]), cache)
    cache.advance(8)
    with pytest.raises(InputError, match="cache overflow"):
        session.forward(np.array([1, 2]), cache)


def test_an_engine_built_for_another_gpu_or_tensorrt_is_refused_with_rebuild_advice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import types

    import specx.runtime.backends.trt_session as backend

    monkeypatch.setattr(
        backend, "import_tensorrt", lambda builder=False: types.SimpleNamespace(__version__="10.9")
    )
    monkeypatch.setattr(backend, "compute_capability", lambda device=0: "8.7")
    entry = {
        "file": "target.gpu.engine",
        "tensorrt": "10.9",
        "compute_capability": "9.0",
        "profile": "gpu-datacenter",
    }
    with pytest.raises(
        ArtifactError,
        match=r"compute_capability 9\.0, this machine has 8\.7.*"
        "specx build ARTIFACT --profile gpu-datacenter",
    ):
        backend.check_engine_entry(entry)
    entry.update(compute_capability="8.7", tensorrt="10.3")
    with pytest.raises(ArtifactError, match=r"built for tensorrt 10\.3, this machine has 10\.9"):
        backend.check_engine_entry(entry)
    entry.update(tensorrt="10.9")
    backend.check_engine_entry(entry)  # a matching engine passes


@pytest.mark.parametrize(("version", "refused"), [("1.19.2", True), ("1.20.0", False)])
def test_a_graph_is_refused_by_an_onnxruntime_too_old_to_run_it_right(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, version: str, refused: bool
) -> None:
    """gqa graphs give wrong verify logits before onnxruntime 1.20 (docs/artifact-format.md)."""
    import onnxruntime

    from conftest import HAS_EXPORTER
    from specx.runtime.artifact.contract import Manifest
    from specx.runtime.errors import ProviderError

    if not HAS_EXPORTER:
        pytest.skip("needs specx[export]")
    pair = request.getfixturevalue("llama_pair")
    spec = Manifest.read(pair.artifact).target
    assert spec.attention == "gqa" and "com.microsoft:GroupQueryAttention" in spec.operators
    monkeypatch.setattr(onnxruntime, "__version__", version)
    if refused:
        with pytest.raises(ProviderError, match=r"needs onnxruntime >= 1\.20 \(multi-token"):
            OrtSession(pair.artifact / spec.graph, spec)
    else:
        OrtSession(pair.artifact / spec.graph, spec)


def test_the_int4_draft_needs_onnxruntime_1_22() -> None:
    from specx.runtime.artifact.requirements import min_onnxruntime, release

    spec = Echo().spec
    int4 = dataclasses.replace(spec, variant="int4", attention="gqa")  # operators not recorded
    assert min_onnxruntime(int4)[0] == (1, 22)
    assert min_onnxruntime(spec)[0] == (1, 16)
    assert release("1.20.1") == (1, 20) and release("1.32.0.dev20261101") == (1, 32)
