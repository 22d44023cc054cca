"""A model's weights one tensor at a time, as transformers would load them, never all at once.

An export reads the source three ways, none of which holds the whole model in memory:

- `WeightSource.tensor(name)`: one parameter, float32, in the layout and values
  `from_pretrained(..., dtype=float32)` gives it (a GGUF tensor dequantized and passed through
  transformers' own per-architecture processor; a safetensors tensor cast to float32; a tied
  parameter read under the name the checkpoint stores it by);
- `stand_in(config, dtype)`: the model's structure with parameters of the right shapes whose
  memory is never touched (the kernel backs untouched pages with its shared zero page), for
  tracing the graph;
- `stream_weights(meta_model(config), source)`: the model itself, on the meta device, each module's
  parameters read from the source just before its forward and dropped after it: the parity
  reference, running transformers' own forward with at most one module's weights in memory.

`tests/exporter/test_streamed_export.py` checks that every tensor equals what `from_pretrained`
loads, for folders and GGUF files of every family.
"""

from __future__ import annotations

import ctypes
import json
import re
from pathlib import Path
from typing import Any

import numpy as np

from specx.exporter.weights.gguf import GgufBlocks
from specx.runtime.errors import ExportError

_LAYER = re.compile(r"\.(?:layers|h)\.(\d+)\.")


def release_heap() -> None:
    """Hand freed heap memory back to the system. Dequantizing a tensor leaves many
    medium-sized temporaries behind, and glibc keeps the freed heap pages resident unless asked
    (docs/bench/measurements.md); other C libraries: nothing to do."""
    try:
        libc = ctypes.CDLL(None)
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return
    trim(0)


def layer_of(name: str) -> int | None:
    """The decoder layer a parameter belongs to (None: embedding, final norm, head)."""
    found = _LAYER.search(f".{name}")
    return int(found.group(1)) if found else None


class WeightSource:
    """One checkpoint's tensors by the model's parameter names (see the module docstring)."""

    gguf: GgufBlocks | None = None

    def __init__(self, model: Any) -> None:
        # Tied parameters (one tensor under several names): each name -> the name stored.
        groups: dict[int, list[str]] = {}
        for name, p in model.named_parameters(remove_duplicate=False):
            groups.setdefault(id(p), []).append(name)
        self.aliases = {n: names for names in groups.values() for n in names}
        self.shapes = {n: tuple(p.shape) for n, p in model.named_parameters(remove_duplicate=False)}

    def keys(self) -> set[str]:
        raise NotImplementedError

    def read(self, key: str) -> np.ndarray:
        raise NotImplementedError

    def tensor(self, name: str) -> np.ndarray:
        """Parameter `name` as float32, [out, in] for matrices."""
        keys = self.keys()
        stored = next((n for n in self.aliases.get(name, [name]) if n in keys), None)
        if stored is None:
            raise ExportError(
                f"the checkpoint has no tensor for {name}, which the model's config needs",
                "check that the weights belong to this config (and are complete)",
            )
        array = self.read(stored)
        want = self.shapes.get(name)
        if want is not None and tuple(array.shape) != want:
            raise ExportError(
                f"the checkpoint's {stored} is {tuple(array.shape)}, the config needs {want}",
                "check that the weights belong to this config",
            )
        return array

    def close(self) -> None:
        """Release open files (nothing to do for most sources)."""


class SafetensorsSource(WeightSource):
    """A folder written by save_pretrained: model.safetensors, or shards with an index.

    A file is opened for each tensor read and closed after it: safetensors maps the file, and a
    mapping's touched pages count as this process's resident memory while it is open, so one
    handle held through the export grew it by the whole model (tests/exporter/
    test_streamed_export.py measures it)."""

    def __init__(self, folder: Path, model: Any) -> None:
        super().__init__(model)
        from safetensors import safe_open

        index = folder / "model.safetensors.index.json"
        if index.is_file():
            weight_map = json.loads(index.read_text())["weight_map"]
            files = sorted(set(weight_map.values()))
        else:
            files = [p.name for p in sorted(folder.glob("*.safetensors"))]
        self.where: dict[str, Path] = {}
        for f in files:
            handle = safe_open(str(folder / f), framework="pt")
            self.where.update(dict.fromkeys(handle.keys(), folder / f))
            del handle

    def keys(self) -> set[str]:
        return set(self.where)

    def read(self, key: str) -> np.ndarray:
        import torch
        from safetensors import safe_open

        handle = safe_open(str(self.where[key]), framework="pt")
        t = handle.get_tensor(key)  # may be a view of the mapping: copied out before it closes
        array = np.array(t.to(torch.float32).numpy(), copy=True)
        del t, handle
        return array


class TorchBinSource(WeightSource):
    """A folder with pytorch_model.bin (memory-mapped, read a tensor at a time)."""

    def __init__(self, path: Path, model: Any) -> None:
        super().__init__(model)
        import torch

        self.state = torch.load(str(path), map_location="cpu", mmap=True, weights_only=True)

    def keys(self) -> set[str]:
        return set(self.state)

    def read(self, key: str) -> np.ndarray:
        import torch

        return self.state[key].to(torch.float32).numpy()


READ_ROWS = 4096  # GGUF rows dequantized at a time


class GgufSource(WeightSource):
    """A .gguf file: each tensor dequantized and processed as transformers' loader does."""

    def __init__(self, path: Path, model: Any) -> None:
        super().__init__(model)
        from transformers.modeling_gguf_pytorch_utils import (
            TENSOR_PROCESSORS,
            TensorProcessor,
            get_gguf_hf_weights_map,
            load_gguf_checkpoint,
        )

        self.gguf = self.blocks = GgufBlocks(path, model.config)
        parsed = load_gguf_checkpoint(str(path), return_tensors=False)
        arch = self.blocks.arch_name
        self.processor = TENSOR_PROCESSORS.get(arch, TensorProcessor)(config=parsed["config"])
        to_hf = get_gguf_hf_weights_map(model, self.processor)
        self.by_hf = {hf: g for g, hf in to_hf.items() if g in self.blocks.tensors}

    def keys(self) -> set[str]:
        return set(self.by_hf)

    def read(self, key: str) -> np.ndarray:
        from gguf import dequantize

        name = self.by_hf[key]
        tensor = self.blocks.tensors[name]
        data = tensor.data  # [rows, bytes per row] (quantized) or [rows, cols]
        if data.ndim == 2 and data.shape[0] > READ_ROWS:  # in slices: few temporaries at once
            first = dequantize(data[:1], tensor.tensor_type)
            weights = np.empty((data.shape[0], first.shape[1]), dtype=first.dtype)
            for start in range(0, data.shape[0], READ_ROWS):
                stop = start + READ_ROWS
                weights[start:stop] = dequantize(data[start:stop], tensor.tensor_type)
        else:
            weights = dequantize(data, tensor.tensor_type)
        self.blocks.release()
        result = self.processor.process(
            weights=weights, name=name, tensor_key_mapping={}, parsed_parameters={}
        )
        if result.name != name:
            raise ExportError(
                f"transformers' loader renames the GGUF tensor {name} to {result.name}",
                "export this architecture from a Hugging Face folder instead",
            )
        return np.ascontiguousarray(result.weights, dtype=np.float32)


class LoadedWeights(WeightSource):
    """A model already loaded whole (`load.load_source`: distill trains on it anyway)."""

    def __init__(self, model: Any) -> None:
        super().__init__(model)
        self.params = dict(model.named_parameters(remove_duplicate=False))

    def keys(self) -> set[str]:
        return set(self.params)

    def read(self, key: str) -> np.ndarray:
        return np.asarray(self.params[key].detach().float().numpy())


def open_weights(path: Path, model: Any) -> WeightSource:
    """The weight source of a local model (a .gguf file or a folder); `model` its meta model."""
    if path.suffix.lower() == ".gguf":
        return GgufSource(path, model)
    if list(path.glob("*.safetensors")):
        return SafetensorsSource(path, model)
    if (path / "pytorch_model.bin").is_file():
        return TorchBinSource(path / "pytorch_model.bin", model)
    raise ExportError(
        f"{path} holds no weights (model.safetensors or pytorch_model.bin)",
        "pass a folder written by save_pretrained, or a .gguf file",
    )


def meta_model(config: Any) -> Any:
    """The model of `config` with parameters on the meta device (no memory) and real buffers
    (rotary frequencies, embedding scales: computed from the config as in a normal load)."""
    import torch
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.tie_weights()  # as from_pretrained does once it has loaded the weights
    return model.eval()


def _replace_parameters(model: Any, make: Any) -> None:
    """Give every parameter (tied ones once) the tensor make(parameter) returns."""
    import torch

    made: dict[int, Any] = {}
    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if p is None:
                continue
            if id(p) not in made:
                made[id(p)] = torch.nn.Parameter(make(p), requires_grad=False)
            module._parameters[name] = made[id(p)]


def stand_in(config: Any, dtype: Any) -> Any:
    """The model of `config` for tracing: parameters of the right shapes and `dtype` whose pages
    are never written (resident memory stays near zero however large the model), buffers real
    (cast to `dtype` like model.to(dtype) does)."""
    import torch

    model = meta_model(config)
    _replace_parameters(model, lambda p: torch.empty(p.shape, dtype=dtype))
    for module in model.modules():
        for name, b in list(module._buffers.items()):
            if b is not None and b.is_floating_point():
                module._buffers[name] = b.to(dtype)
    return model


def _load(module: Any, prefix: str, source: WeightSource) -> None:
    """Give `module`'s own parameters their values from `source` (`prefix`: its name)."""
    import torch

    for n, p in list(module._parameters.items()):
        if p is not None:
            array = source.tensor(f"{prefix}.{n}" if prefix else n)
            value = torch.from_numpy(np.require(array, requirements="W"))  # writable for torch
            module._parameters[n] = torch.nn.Parameter(value, requires_grad=False)


def stream_weights(model: Any, source: WeightSource) -> Any:
    """`model` (a meta_model) with modules that read their weights from `source` just before
    their forward and drop them after it (see the module docstring)."""
    for prefix, module in model.named_modules():
        own = {n: p for n, p in module._parameters.items() if p is not None}
        if not own:
            continue

        def load(mod: Any, _args: Any, prefix: str = prefix) -> None:
            if not getattr(mod, "_specx_pinned", False):
                _load(mod, prefix, source)

        def unload(mod: Any, _args: Any, _out: Any, own: dict[str, Any] = own) -> None:
            if not getattr(mod, "_specx_pinned", False):
                mod._parameters.update(own)  # back to the meta parameters

        module.register_forward_pre_hook(load)
        module.register_forward_hook(unload)
    return model


def pin(model: Any, modules: list[Any], source: WeightSource) -> None:
    """Load the weights of `modules` (of a streamed model) for good: what is read outside a
    forward (a feature head takes the target's embedding and LM head)."""
    prefixes = {id(m): n for n, m in model.named_modules()}
    for module in modules:
        _load(module, prefixes[id(module)], source)
        module._specx_pinned = True
