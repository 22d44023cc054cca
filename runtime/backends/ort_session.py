"""The ONNX Runtime backend (CPU and CUDA providers): one session per graph, I/O binding.

``forward(tokens, cache)`` binds the cache's buffers as the graph's cache inputs and outputs, so
keys and values are written straight into the cache; the logits land in a preallocated host
buffer. Nothing is allocated or copied per step apart from the token ids and positions.

    plain graphs   past = the valid prefix of each buffer, new = the slots right after it
    gqa graphs     past and present = the same full buffer, bound once per cache; the lengths
                   (seqlens_k, total_sequence_length) say what is valid
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from specx.runtime.artifact import contract
from specx.runtime.artifact.contract import ModelSpec
from specx.runtime.artifact.requirements import min_onnxruntime, release
from specx.runtime.backends.base import DEFAULT_CHUNK, GraphSession
from specx.runtime.backends.cache_binding import bind_cache, bind_concat, bind_host_output
from specx.runtime.backends.providers import GPU_PROVIDERS, check_threads, resolve_providers
from specx.runtime.concat_cache import ConcatCache
from specx.runtime.errors import ArtifactError, InputError, ProviderError
from specx.runtime.kernels import library as kernels
from specx.runtime.kv_cache import NP_DTYPES, BatchKVCache, KVCache
from specx.runtime.memory import HOST, DeviceMemory

CONCAT_ROOM = 2  # an imported graph's cache: slots beyond its capacity, in passes of max_chunk

ORT_TYPES = {
    "tensor(int64)": "int64",
    "tensor(int32)": "int32",
    "tensor(float)": "float32",
    "tensor(float16)": "float16",
    "tensor(bool)": "bool",
}

# Thread pools. A speculative loop alternates between two sessions; with a pool per session
# (onnxruntime's default) the idle pool's spinning threads steal cores from the busy one
# (docs/bench/measurements.md). Two remedies:
#   global   one intra-op pool shared by every session of the process: the fastest. onnxruntime
#            then requires every session of the process to opt in (use_per_session_threads =
#            False), also those an embedding application creates itself, so the library makes it
#            opt-in (use_global_thread_pool) and the specx CLI, whose process is its own, uses it.
#   session  a pool per session (the library default), with spinning off for sessions that
#            alternate with another one.
_pool: dict[str, Any] = {"global": False}


def use_global_thread_pool(threads: int | None = None) -> bool:
    """Share one intra-op thread pool among all onnxruntime sessions of this process.

    Call it before the process creates its first onnxruntime session; every session created
    afterwards must set ``use_per_session_threads = False`` (OrtSession does). Returns False if
    this onnxruntime cannot do it (then sessions keep their own pools).
    """
    check_threads(threads)
    if _pool["global"]:
        return True
    try:
        from onnxruntime.capi import _pybind_state

        _pybind_state.set_global_thread_pool_sizes(threads or 0, 1)
    except (ImportError, AttributeError, RuntimeError):
        return False
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


def session_options(
    threads: int | None,
    alternating: bool,
    operators: Sequence[str] = (),
    graph: str = "the graph",
    libraries: Sequence[dict[str, Any]] = (),
) -> ort.SessionOptions:
    """The options every specx session runs with (the export's parity check uses them too);
    `operators`: the graph's "domain:OpType" list, which says whether the specx kernels library
    must be registered (refused with advice where it is not built)."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    _configure_threads(options, threads, alternating)
    kernels.register(options, operators, graph, libraries)
    return options


class OrtValueBuffer:
    def __init__(self, value: Any) -> None:
        self.value = value

    @property
    def ptr(self) -> int:
        return int(self.value.data_ptr())

    def to_host(self) -> np.ndarray:
        return np.asarray(self.value.numpy())


class OrtDeviceMemory:
    """Tensors from ONNX Runtime's own allocator on a GPU, zero-filled from the host once."""

    def __init__(self, device: str, device_id: int = 0) -> None:
        self.device = device
        self.device_id = device_id

    def allocate(self, shape: tuple[int, ...], dtype: Any) -> OrtValueBuffer:
        zeros = np.zeros(shape, dtype)
        return OrtValueBuffer(ort.OrtValue.ortvalue_from_numpy(zeros, self.device, self.device_id))


def _check_runnable(graph_path: Path, spec: ModelSpec, on_gpu: bool) -> None:
    """Refuse a graph this ONNX Runtime and provider cannot run, before loading it."""
    if on_gpu and spec.attention == "gqa" and spec.dtype == "float32":
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
    needed, why = min_onnxruntime(spec)
    if release(ort.__version__) < needed:
        raise ProviderError(
            f"{graph_path.name} needs onnxruntime >= {needed[0]}.{needed[1]} ({why}); this is "
            f"{ort.__version__}",
            f"pip install 'onnxruntime>={needed[0]}.{needed[1]}'",
        )


def _load(
    graph_path: Path,
    providers: list[str],
    options: Any,
    provider_options: Sequence[dict[str, Any]] | None,
) -> Any:
    """An InferenceSession of the graph whose first provider is active."""
    try:
        session = ort.InferenceSession(
            str(graph_path),
            options,
            providers=providers,
            provider_options=list(provider_options) if provider_options else None,
        )
    except Exception as e:  # onnxruntime raises its own Fail/InvalidGraph/... types
        raise ArtifactError(
            f"onnxruntime cannot load {graph_path.name}: {str(e).splitlines()[0][:300]}",
            "the file is corrupt or truncated; re-export the artifact",
        ) from e
    active = session.get_providers()
    if providers[0] not in active:
        raise ProviderError(
            f"{providers[0]} failed to initialise (active: {', '.join(active)})",
            "check the CUDA/TensorRT installation and that a GPU is visible",
        )
    return session


class OrtSession(GraphSession):
    """An ONNX graph that follows the contract, run by ONNX Runtime through I/O binding."""

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
        on_gpu = self.providers[0] in GPU_PROVIDERS
        _check_runnable(graph_path, spec, on_gpu)
        options = session_options(
            threads, alternating, spec.operators, graph_path.name, spec.op_libraries
        )
        self.session = _load(graph_path, self.providers, options, provider_options)
        self._check_io()
        self._check_capacity()
        self.memory: DeviceMemory = OrtDeviceMemory("cuda") if on_gpu else HOST
        self.max_chunk = max_chunk
        self.passes = 0
        self._logits = np.empty((max_chunk, spec.vocab_size), np.float32)
        self._logits16 = (
            np.empty((max_chunk, spec.vocab_size), np.float16)
            if spec.logits_dtype == "float16"
            else None
        )
        self._batch_logits = np.empty((0, spec.vocab_size), np.float32)
        # a target's features output ([chunk, F]); a head's hidden_out ([chunk, hidden])
        self._features = np.empty((max_chunk, spec.feature_size), np.float32)
        self._batch_features = np.empty((0, spec.feature_size), np.float32)
        self._hidden_out = np.empty((max_chunk, spec.hidden_size), np.float32)
        self._head_zeros: dict[str, np.ndarray] = {}
        self.last_features = None
        self._binding = self.session.io_binding()
        # whose cache buffers the binding holds: a KVCache (gqa), or (a BatchKVCache, first row,
        # rows) for forward_rows; None: rebind before the next pass
        self._bound: KVCache | tuple[BatchKVCache, int, int] | None = None
        self._position_ids = spec.uses_position_ids
        # an imported graph's count of last positions to return logits for: [] or [1]
        self._keep = next(
            ((t.name, len(t.shape)) for t in spec.inputs if t.name in contract.LOGITS_TO_KEEP),
            None,
        )
        # ids, positions and mask as the graph takes them (an imported graph's may be int32)
        self._ids_dt, self._pos_dt, self._mask_dt = (
            np.dtype(spec.index_dtype(n)) for n in contract.INDEX_INPUTS
        )
        self._ones = np.ones(spec.max_length + max_chunk, self._mask_dt)  # genai: the mask
        self._cache_np_dtype = NP_DTYPES[spec.dtype]

    def fork(self) -> OrtSession:
        """ONNX Runtime sessions may run concurrently; bindings and output buffers may not."""
        other = copy.copy(self)
        other._logits = np.empty_like(self._logits)
        if self._logits16 is not None:
            other._logits16 = np.empty_like(self._logits16)
        other._batch_logits = np.empty_like(self._batch_logits)
        other._features = np.empty_like(self._features)
        other._batch_features = np.empty_like(self._batch_features)
        other._hidden_out = np.empty_like(self._hidden_out)
        other._head_zeros = {}
        other.last_features = None
        other._binding = self.session.io_binding()
        other._bound = None
        other.passes = 0
        return other

    @property
    def pair_id(self) -> str | None:
        if self.spec.attention in contract.IMPORTED:
            return None  # an imported graph, never rewritten: the manifest's record is the one
        metadata = self.session.get_modelmeta().custom_metadata_map
        return str(metadata.get(contract.PAIR_ID_KEY, ""))  # "": the graph records no export

    def _check_capacity(self) -> None:
        """The manifest may not promise more positions than the graph was exported for (its
        rotary tables and masks end there); graphs from before this record skip the check."""
        metadata = self.session.get_modelmeta().custom_metadata_map
        recorded = metadata.get(contract.MAX_LENGTH_KEY)
        if recorded is not None and recorded.isdigit() and self.spec.max_length > int(recorded):
            raise ArtifactError(
                f"the manifest gives {self.path.name} max_length {self.spec.max_length}, but the "
                f"graph was exported for {recorded} positions",
                "re-export the artifact with `specx export` (or restore its manifest.json)",
            )

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

    def forward(self, tokens: np.ndarray, cache: KVCache) -> np.ndarray:
        return self._pass(tokens, cache, int(tokens.shape[0]))

    def forward_last(self, tokens: np.ndarray, cache: KVCache) -> np.ndarray:
        """A graph with a logits count (LOGITS_TO_KEEP) computes its head on the last row only."""
        return self._pass(tokens, cache, 1 if self._keep is not None else int(tokens.shape[0]))[-1]

    def _pass(self, tokens: np.ndarray, cache: KVCache, keep: int) -> np.ndarray:
        """The pass over `tokens`; the logits of its last `keep` positions ([keep, vocab])."""
        seq = int(tokens.shape[0])
        self.check_pass(seq, cache)
        past = cache.length
        ids = np.ascontiguousarray(tokens, dtype=self._ids_dt).reshape(1, seq)
        io = self._binding
        io.bind_cpu_input(contract.INPUT_IDS, ids)
        if self._position_ids:
            positions = np.arange(past, past + seq, dtype=self._pos_dt).reshape(1, seq)
            io.bind_cpu_input(contract.POSITION_IDS, positions)
        if self._keep is not None:  # the last `keep` new positions' logits
            shape = (1,) * self._keep[1]  # [] or [1]
            io.bind_cpu_input(self._keep[0], np.full(shape, keep, dtype=np.int64))
        concat = self.spec.attention == "concat"
        if concat:
            self._bind_concat(io, cache, seq)
        elif self.spec.attention in contract.FULL_BUFFER:
            self._bind_full(io, cache, past, seq)
        else:
            self._bind_plain(io, cache, past, seq)
        half = self._logits16  # an imported fp16 graph's logits, read as float32
        logits = self._logits if half is None else half
        bind_host_output(io, contract.LOGITS, logits[:keep][None])  # [1, keep, vocab]
        features = self.spec.feature_size
        if features:
            bind_host_output(io, contract.FEATURES, self._features[:seq][None])
        self.session.run_with_iobinding(io)
        if half is not None:
            self._logits[:keep] = half[:keep]  # exact: every float16 is a float32
        if isinstance(cache, ConcatCache):
            cache.end_pass(seq, ids[0])
        else:
            cache.advance(seq, ids[0])
        self.passes += 1
        if features:
            self.last_features = self._features[:seq]
        return self._logits[:keep]

    def forward_head(
        self,
        tokens: np.ndarray,
        features: np.ndarray | None,
        hidden: np.ndarray | None,
        cache: KVCache,
    ) -> tuple[np.ndarray, np.ndarray]:
        head = self.spec.head
        if head is None:
            raise InputError(f"{self.path.name} is not a feature draft's graph")
        seq = int(tokens.shape[0])
        self.check_pass(seq, cache)
        past = cache.length
        io = self._binding
        io.bind_cpu_input(
            contract.INPUT_IDS, np.ascontiguousarray(tokens, np.int64).reshape(1, seq)
        )
        positions = np.arange(past, past + seq, dtype=np.int64).reshape(1, seq)
        io.bind_cpu_input(contract.POSITION_IDS, positions)
        from_target = features is not None
        if features is None:
            features = self._zeros("features", seq, head.feature_size)
        if hidden is None:
            hidden = self._zeros("hidden", seq, self.spec.hidden_size)
        io.bind_cpu_input(
            contract.FEATURES, np.ascontiguousarray(features, np.float32).reshape(1, seq, -1)
        )
        io.bind_cpu_input(
            contract.HIDDEN, np.ascontiguousarray(hidden, np.float32).reshape(1, seq, -1)
        )
        io.bind_cpu_input(contract.FROM_TARGET, np.full((1, seq, 1), from_target, dtype=np.bool_))
        self._bind_plain(io, cache, past, seq)
        bind_host_output(io, contract.LOGITS, self._logits[:seq][None])  # [1, seq, vocab]
        bind_host_output(io, contract.HIDDEN_OUT, self._hidden_out[:seq][None])
        self.session.run_with_iobinding(io)
        cache.advance(seq, tokens)
        self.passes += 1
        return self._logits[:seq], self._hidden_out[:seq]

    def _zeros(self, name: str, seq: int, width: int) -> np.ndarray:
        """Zeros for the input a head pass does not read (kept, not allocated per pass)."""
        buf = self._head_zeros.get(name)
        if buf is None or buf.shape[0] < seq:
            buf = self._head_zeros[name] = np.zeros((max(seq, self.max_chunk), width), np.float32)
        return buf[:seq]

    def _bind_plain(self, io: Any, cache: KVCache, past: int, seq: int) -> None:
        self._bound = None
        bind_cache(io, cache, past, seq)

    def _bind_concat(self, io: Any, cache: KVCache, seq: int) -> None:
        if not isinstance(cache, ConcatCache):
            raise InputError(
                f"{self.path.name} is an imported graph: its caches come from its own new_cache"
            )
        self._bound = None
        bind_concat(io, cache, seq)

    def new_cache(self, capacity: int) -> KVCache:
        if self.spec.attention != "concat" or capacity > self.spec.max_length:
            return super().new_cache(capacity)  # (which refuses a capacity beyond the graph's)
        s = self.spec
        room = CONCAT_ROOM * self.max_chunk
        return ConcatCache(
            s.num_layers, s.kv_heads, s.head_dim, capacity, room, s.dtype, self.memory,
            s.index_dtype(contract.ATTENTION_MASK),
        )  # fmt: skip

    def _bind_full(self, io: Any, cache: KVCache, past: int, seq: int) -> None:
        """The lengths say what is valid; the buffers are bound once per cache."""
        if self.spec.attention == "batched":
            io.bind_cpu_input(contract.WRITE_INDICES, np.array([past], dtype=np.int64))
        elif self.spec.attention == "genai":  # its op derives lengths and positions from this
            io.bind_cpu_input(contract.ATTENTION_MASK, self._ones[: past + seq][None])
        else:
            io.bind_cpu_input(contract.SEQLENS_K, np.array([past + seq - 1], dtype=np.int32))
            io.bind_cpu_input(contract.TOTAL_SEQUENCE_LENGTH, np.array(past + seq, dtype=np.int32))
        if self._bound is cache:
            return  # the cache buffers are bound already and never move
        bind_cache(io, cache, past, seq)
        self._bound = cache

    def forward_rows(
        self, tokens: np.ndarray, counts: np.ndarray, cache: BatchKVCache, first_row: int = 0
    ) -> np.ndarray:
        """One pass over cache rows first_row .. first_row + batch - 1 of a BatchKVCache.

        tokens [batch, seq] int64: row b's counts[b] real tokens, then padding; they go at
        positions lengths[row] .. Each row's length grows by its count (the caller truncates to
        what it keeps). Returns logits [batch, seq, vocab], a view that the next call overwrites.

        A batched graph takes any such pass. A gqa graph (same cache layout) takes the passes
        GroupQueryAttention can run over rows of different lengths: one row of any width, or
        one token per row (rows with no token are written at their length and stay empty).
        """
        batch, seq = int(tokens.shape[0]), int(tokens.shape[1])
        rows = slice(first_row, first_row + batch)
        starts = cache.lengths[rows].copy()  # [batch]
        self._check_rows(cache, first_row, batch, seq, starts)
        io = self._binding
        io.bind_cpu_input(contract.INPUT_IDS, np.ascontiguousarray(tokens, dtype=np.int64))
        positions = starts[:, None] + np.arange(seq, dtype=np.int64)[None, :]  # [batch, seq]
        if self._position_ids:
            io.bind_cpu_input(contract.POSITION_IDS, positions)
        if self.spec.attention == "gqa":
            io.bind_cpu_input(contract.SEQLENS_K, (starts + seq - 1).astype(np.int32))
            total = np.array(int(starts.max()) + seq, dtype=np.int32)
            io.bind_cpu_input(contract.TOTAL_SEQUENCE_LENGTH, total)
        else:
            io.bind_cpu_input(contract.WRITE_INDICES, starts)
        if self._keep is not None:  # every row's every new position's logits
            io.bind_cpu_input(self._keep[0], np.full((1,) * self._keep[1], seq, dtype=np.int64))
        self._bind_rows(io, cache, first_row, batch)
        logits, features = self._bind_row_outputs(io, batch, seq)
        self.session.run_with_iobinding(io)
        for b in range(batch):
            cache.record(first_row + b, int(starts[b]), tokens[b], int(counts[b]))
        cache.lengths[rows] = starts + counts
        self.passes += 1
        if features is not None:
            self.last_features = features
        return logits

    def _check_rows(
        self, cache: BatchKVCache, first_row: int, batch: int, seq: int, starts: np.ndarray
    ) -> None:
        """Refuse a pass this graph cannot run or the cache cannot hold."""
        gqa = self.spec.attention == "gqa"
        if not (self.spec.attention == "batched" or (gqa and (batch == 1 or seq == 1))):
            raise InputError(
                f"{self.path.name} is a {self.spec.attention} graph; {batch} rows of {seq} "
                "tokens in one pass need a batched graph",
                "re-export with `specx export --batched`",
            )
        if first_row + batch > cache.rows or seq < 1:
            raise InputError(
                f"rows {first_row}..{first_row + batch - 1} of {cache.rows}, seq {seq}"
            )
        if int(starts.max()) + seq > cache.capacity:
            raise InputError(
                f"cache overflow: a row at {int(starts.max())} + {seq} positions exceeds "
                f"{cache.capacity}"
            )

    def _bind_rows(self, io: Any, cache: BatchKVCache, first_row: int, batch: int) -> None:
        """Bind the rows' cache buffers as past and present; they never move, so this binds
        again only when a pass takes other rows."""
        bound = self._bound
        if isinstance(bound, tuple) and bound[0] is cache and bound[1:] == (first_row, batch):
            return
        dev, dev_id, dt = cache.device, cache.device_id, self._cache_np_dtype
        shape = [batch, cache.kv_heads, cache.capacity, cache.head_dim]
        for layer in range(cache.num_layers):
            for name_in, name_out, ptr in (
                (contract.past_key(layer), contract.present_key(layer), cache.key_ptr),
                (contract.past_value(layer), contract.present_value(layer), cache.value_ptr),
            ):
                io.bind_input(name_in, dev, dev_id, dt, shape, ptr(layer, first_row))
                io.bind_output(name_out, dev, dev_id, dt, shape, ptr(layer, first_row))
        self._bound = (cache, first_row, batch)

    def _bind_row_outputs(
        self, io: Any, batch: int, seq: int
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Bind logits (and features, where the graph has them) to reused host buffers; returns
        their views: [batch, seq, vocab] and [batch, seq, features] or None."""
        need = batch * seq
        if self._batch_logits.shape[0] < need:
            self._batch_logits = np.empty((need, self.vocab_size), np.float32)
        logits = self._batch_logits[:need].reshape(batch, seq, self.vocab_size)
        bind_host_output(io, contract.LOGITS, logits)
        width = self.spec.feature_size
        if not width:
            return logits, None
        if self._batch_features.shape[0] < need:
            self._batch_features = np.empty((need, width), np.float32)
        features = self._batch_features[:need].reshape(batch, seq, width)
        bind_host_output(io, contract.FEATURES, features)
        return logits, features

    def batched(self) -> OrtSession | None:
        """Batched graphs take any pass over rows; gqa graphs (same cache layout) the passes
        GroupQueryAttention runs over rows of different lengths (forward_rows); plain graphs
        none."""
        return self if self.spec.attention in ("batched", "gqa") else None

    def new_batch_cache(self, rows: int, capacity: int) -> BatchKVCache:
        s = self.spec
        if capacity > s.max_length:
            raise InputError(
                f"a cache of {capacity} positions exceeds the {s.max_length} this graph was "
                "exported for",
                "ask for fewer tokens, or re-export with a larger --max-length",
            )
        return BatchKVCache(
            s.num_layers, s.kv_heads, s.head_dim, rows, capacity, s.dtype, self.memory
        )
