"""One ONNX Runtime session per graph, run through I/O binding against a KVCache.

``forward(tokens, cache)`` binds the cache's valid prefix as the ``past`` inputs and the slots
right after it as the ``new`` outputs, so keys and values are written straight into the cache;
the logits land in a preallocated host buffer. Nothing is allocated or copied per step apart
from the token ids and positions.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from specx.runtime import contract
from specx.runtime.contract import ModelSpec
from specx.runtime.errors import ArtifactError, InputError, ProviderError
from specx.runtime.kv_cache import NP_DTYPES, KVCache

PROVIDER_ALIASES = {
    "cpu": "CPUExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "tensorrt": "TensorrtExecutionProvider",
    "trt": "TensorrtExecutionProvider",
}
ORT_TYPES = {
    "tensor(int64)": "int64",
    "tensor(int32)": "int32",
    "tensor(float)": "float32",
    "tensor(float16)": "float16",
}

# Prefill runs in chunks of this many tokens: it bounds the logits buffer ([chunk, vocab]) and the
# attention scratch, and costs nothing in speed at this size.
DEFAULT_CHUNK = 128

# Thread pools. A speculative loop alternates between two sessions; with a pool per session
# (onnxruntime's default) the idle pool's spinning threads steal the cores from the busy one
# (2 cores: a target pass took 46 ms beside a spinning draft session, 26 ms alone). Two remedies:
#   global   one intra-op pool shared by every session of the process: the fastest. onnxruntime
#            then requires every session of the process to opt in (use_per_session_threads =
#            False), also those an embedding application creates itself, so the library makes it
#            opt-in (use_global_thread_pool) and the specx CLI, whose process is its own, uses it.
#   session  a pool per session (the library default), with spinning off for sessions that
#            alternate with another one.
_pool: dict[str, Any] = {"global": False, "threads": 0}


def use_global_thread_pool(threads: int | None = None) -> bool:
    """Share one intra-op thread pool among all onnxruntime sessions of this process.

    Call it before the process creates its first onnxruntime session; every session created
    afterwards must set ``use_per_session_threads = False`` (ModelSession does). Returns False if
    this onnxruntime cannot do it (then sessions keep their own pools).
    """
    if _pool["global"]:
        return True
    try:
        from onnxruntime.capi import _pybind_state

        _pybind_state.set_global_thread_pool_sizes(threads or 0, 1)
    except (ImportError, AttributeError, RuntimeError):
        return False
    _pool.update(threads=threads or 0)
    _pool["global"] = True
    return True


def _configure_threads(options: ort.SessionOptions, threads: int | None, alternating: bool) -> None:
    if _pool["global"]:
        options.use_per_session_threads = False  # the pool's size was fixed when it was made
        return
    if threads:
        options.intra_op_num_threads = threads
    if alternating:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")


def _both_runtimes_installed() -> bool:
    """onnxruntime and onnxruntime-gpu share one module; with both installed, whichever was
    installed last wins file by file and the GPU providers fail in odd ways."""
    import importlib.metadata as md

    found = 0
    for name in ("onnxruntime", "onnxruntime-gpu"):
        try:
            md.version(name)
            found += 1
        except md.PackageNotFoundError:
            continue
    return found == 2


def resolve_providers(requested: Sequence[str] | None) -> list[str]:
    """Map user names (cpu, cuda, tensorrt) to ONNX Runtime provider names; check availability."""
    names = list(requested or ["cpu"])
    available = ort.get_available_providers()
    wants_gpu = any(PROVIDER_ALIASES.get(n.lower(), n) != "CPUExecutionProvider" for n in names)
    if wants_gpu and _both_runtimes_installed():
        raise ProviderError(
            "both onnxruntime and onnxruntime-gpu are installed; they provide the same module",
            "pip uninstall -y onnxruntime onnxruntime-gpu && pip install onnxruntime-gpu "
            "(or scripts/setup.sh --gpu)",
        )
    resolved: list[str] = []
    for name in names:
        full = PROVIDER_ALIASES.get(name.lower(), name)
        if full not in available:
            hint = (
                "install the GPU runtime: `pip uninstall -y onnxruntime && pip install "
                "'specx[gpu]'` (never both packages in one environment)"
                if full != "CPUExecutionProvider"
                else "check the onnxruntime installation"
            )
            raise ProviderError(
                f"execution provider {name!r} is not available in this onnxruntime "
                f"(available: {', '.join(available)})",
                hint,
            )
        resolved.append(full)
    if "CPUExecutionProvider" not in resolved:
        resolved.append("CPUExecutionProvider")  # fallback for ops a GPU provider lacks
    return resolved


def device_of(providers: Sequence[str]) -> str:
    return (
        "cuda" if providers[0] in ("CUDAExecutionProvider", "TensorrtExecutionProvider") else "cpu"
    )


class ModelSession:
    """An ONNX graph that follows the contract, bound to caches through I/O binding."""

    def __init__(
        self,
        graph_path: Path,
        spec: ModelSpec,
        providers: Sequence[str] | None = None,
        threads: int | None = None,
        max_chunk: int = DEFAULT_CHUNK,
        provider_options: Sequence[dict[str, Any]] | None = None,
        alternating: bool = False,
    ) -> None:
        """alternating: this session takes turns with another one (target and draft)."""
        self.spec = spec
        self.path = graph_path
        self.providers = resolve_providers(providers)
        self.device = device_of(self.providers)
        if self.device == "cuda" and spec.attention == "gqa" and spec.dtype == "float32":
            raise ProviderError(
                f"{graph_path.name} is an fp32 GroupQueryAttention graph, which ONNX Runtime "
                "runs only on the CPU (its CUDA kernel is fp16/bf16)",
                "re-export with an fp16 profile (e.g. --profile gpu-datacenter) or "
                "--attention plain for CUDA",
            )
        if not graph_path.is_file():
            raise ArtifactError(
                f"graph file {graph_path} is missing", "re-export the artifact with `specx export`"
            )
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.log_severity_level = 3
        _configure_threads(options, threads, alternating)
        try:
            self.session = ort.InferenceSession(
                str(graph_path),
                options,
                providers=self.providers,
                provider_options=list(provider_options) if provider_options else None,
            )
        except Exception as e:  # onnxruntime raises its own Fail/InvalidGraph/... types
            raise ArtifactError(
                f"onnxruntime cannot load {graph_path.name}: {str(e).splitlines()[0][:300]}",
                "the file is corrupt or truncated; re-export the artifact",
            ) from e
        active = self.session.get_providers()
        if self.providers[0] not in active:
            raise ProviderError(
                f"{self.providers[0]} failed to initialise (active: {', '.join(active)})",
                "check the CUDA/TensorRT installation and that a GPU is visible",
            )
        self._check_io()
        self.max_chunk = max_chunk
        self.vocab_size = spec.vocab_size
        self._logits = np.empty((max_chunk, spec.vocab_size), np.float32)
        self._binding = self.session.io_binding()
        self._bound_cache: KVCache | None = None  # gqa: whose buffers the binding holds
        self._position_ids = spec.uses_position_ids
        self._cache_np_dtype = NP_DTYPES[spec.dtype]
        self.passes = 0  # forward calls, for stats and tests

    def fork(self) -> ModelSession:
        """A handle sharing the loaded graph but with its own binding and logits buffer.

        ONNX Runtime sessions may run concurrently; bindings and output buffers may not. Each
        concurrent generation therefore works on its own fork.
        """
        other = copy.copy(self)
        other._logits = np.empty_like(self._logits)
        other._binding = self.session.io_binding()
        other._bound_cache = None
        other.passes = 0
        return other

    def metadata(self) -> dict[str, str]:
        return dict(self.session.get_modelmeta().custom_metadata_map)

    def _check_io(self) -> None:
        got_in = {i.name: i for i in self.session.get_inputs()}
        got_out = {o.name: o for o in self.session.get_outputs()}
        for expected, got, kind in (
            (self.spec.expected_inputs(), got_in, "input"),
            (self.spec.expected_outputs(), got_out, "output"),
        ):
            names = {t.name for t in expected}
            extra = sorted(set(got) - names)
            if extra:
                raise ArtifactError(
                    f"{self.path.name} has {kind}(s) {extra[:4]} that the manifest does not list",
                    "the graph and manifest come from different exports; re-export",
                )
            for t in expected:
                node = got.get(t.name)
                if node is None:
                    raise ArtifactError(
                        f"{self.path.name} lacks the {kind} {t.name!r} that the manifest lists",
                        "the graph and manifest come from different exports; re-export",
                    )
                dtype = ORT_TYPES.get(node.type, node.type)
                if dtype != t.dtype or len(node.shape) != len(t.shape):
                    raise ArtifactError(
                        f"{self.path.name}: {kind} {t.name!r} is {dtype} of rank "
                        f"{len(node.shape)}, the manifest says {t.dtype} of rank {len(t.shape)}",
                        "the graph and manifest come from different exports; re-export",
                    )
                for got_dim, want_dim in zip(node.shape, t.shape, strict=True):
                    if (
                        isinstance(want_dim, int)
                        and isinstance(got_dim, int)
                        and got_dim != want_dim
                    ):
                        raise ArtifactError(
                            f"{self.path.name}: {kind} {t.name!r} has shape {node.shape}, the "
                            f"manifest says {list(t.shape)}",
                            "the graph and manifest come from different exports; re-export",
                        )

    def new_cache(self, capacity: int) -> KVCache:
        s = self.spec
        if capacity > s.max_length:
            raise InputError(
                f"a cache of {capacity} positions exceeds the {s.max_length} this graph was "
                "exported for",
                "re-export with a larger --max-length",
            )
        return KVCache(
            s.num_layers,
            s.kv_heads,
            s.head_dim,
            capacity,
            s.dtype,
            self.device,
            layout=s.attention,
        )

    def forward(self, tokens: np.ndarray, cache: KVCache) -> np.ndarray:
        """Run the new `tokens` ([seq] int64) on top of `cache`; the cache grows by seq.

        Returns the logits of every new position, [seq, vocab], as a view into a buffer that the
        next call overwrites.
        """
        seq = int(tokens.shape[0])
        past = cache.length
        if seq < 1 or seq > self.max_chunk:
            raise InputError(f"a pass takes 1..{self.max_chunk} tokens, got {seq}")
        if past + seq > cache.capacity:
            raise InputError(
                f"cache overflow: {past} cached + {seq} new positions exceed {cache.capacity}"
            )
        ids = np.ascontiguousarray(tokens, dtype=np.int64).reshape(1, seq)
        io = self._binding
        io.bind_cpu_input(contract.INPUT_IDS, ids)
        if self._position_ids:
            positions = np.arange(past, past + seq, dtype=np.int64).reshape(1, seq)
            io.bind_cpu_input(contract.POSITION_IDS, positions)
        if self.spec.attention == "gqa":
            self._bind_gqa(io, cache, past, seq)
        else:
            self._bind_plain(io, cache, past, seq)
        io.bind_output(
            contract.LOGITS,
            "cpu",
            0,
            np.float32,
            [1, seq, self.vocab_size],
            self._logits.ctypes.data,
        )
        self.session.run_with_iobinding(io)
        cache.advance(seq)
        self.passes += 1
        return self._logits[:seq]

    def _bind_plain(self, io: Any, cache: KVCache, past: int, seq: int) -> None:
        """past = the valid prefix of each buffer; new = the slots right after it."""
        dev, dt = cache.device, self._cache_np_dtype
        past_shape = [1, past, cache.kv_heads, cache.head_dim]
        new_shape = [1, seq, cache.kv_heads, cache.head_dim]
        for layer in range(cache.num_layers):
            io.bind_input(contract.past_key(layer), dev, 0, dt, past_shape, cache.key_ptr(layer))
            io.bind_input(
                contract.past_value(layer), dev, 0, dt, past_shape, cache.value_ptr(layer)
            )
            io.bind_output(
                contract.new_key(layer), dev, 0, dt, new_shape, cache.key_ptr(layer, past)
            )
            io.bind_output(
                contract.new_value(layer), dev, 0, dt, new_shape, cache.value_ptr(layer, past)
            )

    def _bind_gqa(self, io: Any, cache: KVCache, past: int, seq: int) -> None:
        """past and present = the same full buffer; the lengths say what is valid."""
        io.bind_cpu_input(contract.SEQLENS_K, np.array([past + seq - 1], dtype=np.int32))
        io.bind_cpu_input(contract.TOTAL_SEQUENCE_LENGTH, np.array(past + seq, dtype=np.int32))
        if self._bound_cache is cache:
            return  # the cache buffers are bound already and never move
        dev, dt, shape = cache.device, self._cache_np_dtype, list(cache.shape)
        for layer in range(cache.num_layers):
            for name_in, name_out, ptr in (
                (contract.past_key(layer), contract.present_key(layer), cache.key_ptr(layer)),
                (contract.past_value(layer), contract.present_value(layer), cache.value_ptr(layer)),
            ):
                io.bind_input(name_in, dev, 0, dt, shape, ptr)
                io.bind_output(name_out, dev, 0, dt, shape, ptr)
        self._bound_cache = cache

    def prefill(self, tokens: np.ndarray, cache: KVCache) -> np.ndarray | None:
        """Run any number of tokens in chunks; returns the last logits row (or None), a view
        that the next pass overwrites, like forward's."""
        last: np.ndarray | None = None
        for start in range(0, int(tokens.shape[0]), self.max_chunk):
            last = self.forward(tokens[start : start + self.max_chunk], cache)[-1]
        return last
