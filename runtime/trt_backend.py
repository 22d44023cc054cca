"""Run TensorRT engines (built by `specx export --engines` / `specx build`) with TensorRT's runtime.

Same surface as `ModelSession` (forward / prefill / new_cache / fork), same zero-copy cache idea:
the caches are device buffers, and each pass binds the valid prefix as `past` and the slots right
after it as the `new` outputs, by address (`set_tensor_address`). Optimization profile 0 serves
prefill chunks, profile 1 decode and verify; the context switches when the width needs it.

Why TensorRT's own runtime rather than onnxruntime's TensorRT provider: the engines are built with
the TensorRT API from the profile's explicit optimization profiles and recorded in the manifest;
running them as built (no second engine cache, no ONNX Runtime between the engine and the cache
buffers) keeps one source of truth for what runs on the device, and the backend stays ~150 lines
of ctypes-free-of-torch Python that a C++ service can mirror call for call.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np

from specx.runtime import contract
from specx.runtime.contract import ModelSpec
from specx.runtime.errors import ArtifactError, InputError, ProviderError
from specx.runtime.kv_cache import KVCache


def _import_tensorrt() -> Any:
    try:
        import tensorrt as trt
    except ImportError as e:
        raise ProviderError(
            "this artifact runs TensorRT engines, but TensorRT is not installed",
            "install tensorrt (same version as the engines), or run with --provider cpu/cuda",
        ) from e
    return trt


def check_engine_entry(entry: dict[str, Any]) -> None:
    """Refuse an engine built for another TensorRT version or another GPU."""
    from specx.runtime.cuda import compute_capability

    trt = _import_tensorrt()
    here = {"tensorrt": trt.__version__, "compute_capability": compute_capability()}
    for key, value in here.items():
        if entry.get(key) != value:
            raise ArtifactError(
                f"engine {entry.get('file')} was built for {key} {entry.get(key)}, this machine "
                f"has {value}",
                f"rebuild the engines here: specx build ARTIFACT --profile {entry.get('profile')}",
            )


class TensorRTSession:
    def __init__(self, folder: Path, spec: ModelSpec, entry: dict[str, Any]) -> None:
        from specx.runtime.cuda import DeviceBuffer

        check_engine_entry(entry)
        trt = _import_tensorrt()
        path = folder / entry["file"]
        if not path.is_file():
            raise ArtifactError(f"engine file {path} is missing", "rebuild: specx build ARTIFACT")
        self.spec = spec
        self.path = path
        self.device = "cudart"
        self.vocab_size = spec.vocab_size
        self._logger = trt.Logger(trt.Logger.WARNING)
        self._runtime = trt.Runtime(self._logger)
        self.engine = self._runtime.deserialize_cuda_engine(path.read_bytes())
        if self.engine is None:
            raise ArtifactError(f"TensorRT cannot load {path.name}", "rebuild the engines")
        self.max_seq = entry["max_seq"]  # {"prefill": n, "decode": m}
        self.max_chunk = int(self.max_seq["prefill"])
        self._entry = entry
        self._new_context()
        self._ids = DeviceBuffer(8 * self.max_chunk)
        self._positions = DeviceBuffer(8 * self.max_chunk)
        self._logits_dev = DeviceBuffer(4 * self.max_chunk * spec.vocab_size)
        self._logits = np.empty((self.max_chunk, spec.vocab_size), np.float32)
        self.passes = 0

    def _new_context(self) -> None:
        self.context = self.engine.create_execution_context()
        self._profile = -1

    def fork(self) -> TensorRTSession:
        from specx.runtime.cuda import DeviceBuffer

        other = copy.copy(self)
        other._new_context()
        other._ids = DeviceBuffer(8 * self.max_chunk)
        other._positions = DeviceBuffer(8 * self.max_chunk)
        other._logits_dev = DeviceBuffer(4 * self.max_chunk * self.vocab_size)
        other._logits = np.empty_like(self._logits)
        other.passes = 0
        return other

    def metadata(self) -> dict[str, str]:
        return {}

    def new_cache(self, capacity: int) -> KVCache:
        s = self.spec
        return KVCache(s.num_layers, s.kv_heads, s.head_dim, capacity, s.dtype, "cudart")

    def forward(self, tokens: np.ndarray, cache: KVCache) -> np.ndarray:
        seq, past = int(tokens.shape[0]), cache.length
        if seq < 1 or seq > self.max_chunk:
            raise InputError(f"a pass takes 1..{self.max_chunk} tokens, got {seq}")
        if past + seq > cache.capacity:
            raise InputError(f"cache overflow: {past} + {seq} > {cache.capacity}")
        profile = 1 if seq <= int(self.max_seq["decode"]) else 0
        if profile != self._profile:
            self.context.set_optimization_profile_async(profile, 0)
            self._profile = profile
        ctx = self.context
        self._ids.upload(tokens.astype(np.int64))
        self._positions.upload(np.arange(past, past + seq, dtype=np.int64))
        ctx.set_input_shape(contract.INPUT_IDS, (1, seq))
        ctx.set_input_shape(contract.POSITION_IDS, (1, seq))
        ctx.set_tensor_address(contract.INPUT_IDS, self._ids.ptr)
        ctx.set_tensor_address(contract.POSITION_IDS, self._positions.ptr)
        past_shape = (1, past, cache.kv_heads, cache.head_dim)
        for layer in range(cache.num_layers):
            for name, ptr in (
                (contract.past_key(layer), cache.key_ptr(layer)),
                (contract.past_value(layer), cache.value_ptr(layer)),
            ):
                ctx.set_input_shape(name, past_shape)
                ctx.set_tensor_address(name, ptr)
            ctx.set_tensor_address(contract.new_key(layer), cache.key_ptr(layer, past))
            ctx.set_tensor_address(contract.new_value(layer), cache.value_ptr(layer, past))
        ctx.set_tensor_address(contract.LOGITS, self._logits_dev.ptr)
        if not ctx.execute_async_v3(0):
            raise ProviderError(f"TensorRT failed to run {self.path.name}")
        out = self._logits[:seq]
        self._logits_dev.download(out)  # a synchronous copy: waits for the engine
        cache.advance(seq)
        self.passes += 1
        return out

    def prefill(self, tokens: np.ndarray, cache: KVCache) -> np.ndarray | None:
        last: np.ndarray | None = None
        for start in range(0, int(tokens.shape[0]), self.max_chunk):
            last = self.forward(tokens[start : start + self.max_chunk], cache)[-1]
        return last
