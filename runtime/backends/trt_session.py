"""The TensorRT backend: engines built by `specx export --engines` / `specx build`, run by
TensorRT's own runtime.

Same zero-copy cache protocol as the plain ONNX graphs: the caches are device buffers
(``CudaMemory``), and each pass binds the valid prefix as `past` and the slots right after it as
the `new` outputs, by address (`set_tensor_address`). Optimization profile 0 serves prefill
chunks, profile 1 decode and verify; the context switches when the width needs it.

Why TensorRT's own runtime rather than onnxruntime's TensorRT provider: the engines are built with
the TensorRT API from the profile's explicit optimization profiles and recorded in the manifest;
running them as built (no second engine cache, no ONNX Runtime between the engine and the cache
buffers) keeps one source of truth for what runs on the device, and the backend stays small
enough for a C++ service to mirror call for call.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np

from specx.runtime.artifact import contract
from specx.runtime.artifact.contract import ModelSpec
from specx.runtime.backends.base import GraphSession
from specx.runtime.backends.cuda import CudaMemory, DeviceBuffer, compute_capability
from specx.runtime.errors import ArtifactError, ProviderError
from specx.runtime.kv_cache import KVCache


def import_tensorrt(builder: bool = False) -> Any:
    """The tensorrt module, or a clear error. builder: the engines are to be built, which needs
    the full package (the lean/dispatch runtimes and PyPI's stub have no Builder)."""
    try:
        import tensorrt as trt
    except ImportError as e:
        raise ProviderError(
            "TensorRT is not installed in this environment",
            "on a GPU machine: pip install tensorrt (from NVIDIA's index) or use JetPack's "
            "python3-libnvinfer; engines can only be built where they will run"
            if builder
            else "install tensorrt (the version the engines were built with), or run with "
            "--provider cpu/cuda",
        ) from e
    if builder and not hasattr(trt, "Builder"):
        raise ProviderError(
            "this TensorRT package has no builder (a lean/dispatch runtime or a stub)",
            "install the full tensorrt package on a machine with an NVIDIA GPU",
        )
    return trt


def check_engine_entry(entry: dict[str, Any]) -> None:
    """Refuse an engine built for another TensorRT version or another GPU."""
    trt = import_tensorrt()
    here = {"tensorrt": trt.__version__, "compute_capability": compute_capability()}
    for key, value in here.items():
        if entry.get(key) != value:
            raise ArtifactError(
                f"engine {entry.get('file')} was built for {key} {entry.get(key)}, this machine "
                f"has {value}",
                f"rebuild the engines here: specx build ARTIFACT --profile {entry.get('profile')}",
            )


class TensorRTSession(GraphSession):
    def __init__(self, folder: Path, spec: ModelSpec, entry: dict[str, Any]) -> None:
        check_engine_entry(entry)
        trt = import_tensorrt()
        path = folder / entry["file"]
        if not path.is_file():
            raise ArtifactError(f"engine file {path} is missing", "rebuild: specx build ARTIFACT")
        self.spec = spec
        self.path = path
        self.memory = CudaMemory()
        self._logger = trt.Logger(trt.Logger.WARNING)
        self._runtime = trt.Runtime(self._logger)
        self.engine = self._runtime.deserialize_cuda_engine(path.read_bytes())
        if self.engine is None:
            raise ArtifactError(f"TensorRT cannot load {path.name}", "rebuild the engines")
        self.max_seq = entry["max_seq"]  # {"prefill": n, "decode": m}
        self.max_chunk = int(self.max_seq["prefill"])
        self.passes = 0
        self._new_buffers()

    def _new_buffers(self) -> None:
        self.context = self.engine.create_execution_context()
        self._profile = -1
        self._ids = DeviceBuffer(8 * self.max_chunk)
        self._positions = DeviceBuffer(8 * self.max_chunk)
        self._logits_dev = DeviceBuffer(4 * self.max_chunk * self.vocab_size)
        self._logits = np.empty((self.max_chunk, self.vocab_size), np.float32)

    def fork(self) -> TensorRTSession:
        other = copy.copy(self)
        other._new_buffers()
        other.passes = 0
        return other

    @property
    def pair_id(self) -> None:
        return None  # an engine file has no metadata; the manifest's engine entry names its graph

    def forward(self, tokens: np.ndarray, cache: KVCache) -> np.ndarray:
        seq, past = int(tokens.shape[0]), cache.length
        self.check_pass(seq, cache)
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
        cache.advance(seq, tokens)
        self.passes += 1
        return out
