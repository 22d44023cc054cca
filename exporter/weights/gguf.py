"""A GGUF file's quantized tensors by the Hugging Face parameter they became, as Blocks.

transformers dequantizes a GGUF into float32 parameters (load.py); this reads the same file's
blocks so that a quantized graph can carry them instead of rounding the float32 copy a second
time. A tensor is carried only where the blocks provably are the parameter: its dequantized
values must equal the loaded parameter (after the loader's own row permutation, which Llama
files apply to q/k), else the caller requantizes it and reports that.
"""

from __future__ import annotations

import contextlib
import copy
import mmap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from specx.exporter.architecture import describe
from specx.exporter.weights.blocks import CARRIED, Blocks, from_gguf

# Processors (transformers' per-architecture GGUF fixes) that leave matrices alone or only
# permute their rows; others (GPT-2 transposes, Bloom splits qkv) are not carried.
ROW_PROCESSORS = ("TensorProcessor", "LlamaTensorProcessor", "Gemma2TensorProcessor")
# Carried blocks must dequantize to the loaded parameter up to float32 rounding of the product.
MATCH_RELATIVE = 1e-5
CHECK_ROWS = 4096
ARCHITECTURE = "general.architecture"


class GgufBlocks:
    """Lookup of `path`'s quantized tensors for a model loaded from it (`config`: its config)."""

    def __init__(self, path: Path, config: Any) -> None:
        from gguf import MODEL_ARCH_NAMES, GGUFReader, get_tensor_name_map
        from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

        self.reader = GGUFReader(str(path))
        self.tensors = {t.name: t for t in self.reader.tensors}
        field = self.reader.fields[ARCHITECTURE]
        arch_name = bytes(field.parts[field.data[0]]).decode()
        self.arch_name = arch_name
        arch = next(k for k, v in MODEL_ARCH_NAMES.items() if v == arch_name)
        self.names = get_tensor_name_map(arch, describe(config).num_layers)
        cls = TENSOR_PROCESSORS.get(arch_name, TensorProcessor)
        self.processor = cls(config=config.to_dict()) if cls.__name__ in ROW_PROCESSORS else None

    def release(self) -> None:
        """Drop the file's pages from this process's resident memory (they stay in the page
        cache): each tensor is read once, and a mapping's touched pages count as resident."""
        mapping = getattr(self.reader.data, "_mmap", None)  # numpy.memmap's mmap object
        if mapping is not None and hasattr(mmap, "MADV_DONTNEED"):
            mapping.madvise(mmap.MADV_DONTNEED)

    def gguf_name(self, hf_name: str) -> str | None:
        base, _, suffix = hf_name.rpartition(".")
        name = self.names.get_name(base)
        if name is None or f"{name}.{suffix}" not in self.tensors:
            if hf_name.endswith("lm_head.weight"):  # a head tied in the file: the embedding
                return "token_embd.weight" if "token_embd.weight" in self.tensors else None
            return None
        return f"{name}.{suffix}"

    def stored_bits(self, hf_name: str) -> tuple[str, int] | None:
        """(GGUF type, bits its codes take as carried) of the parameter `hf_name`, None where the
        file has no carried type for it; reads no blocks."""
        name = self.gguf_name(hf_name)
        kind = None if name is None else self.tensors[name].tensor_type.name
        return None if kind not in CARRIED else (kind, CARRIED[kind][0])

    def blocks(self, hf_name: str, weight: np.ndarray) -> tuple[Blocks | None, str]:
        """The file's blocks of the parameter `hf_name`, equal to `weight` [N, K] (out x in);
        (None, why) where they cannot be carried."""
        name = self.gguf_name(hf_name)
        if name is None:
            return None, "not in the GGUF file"
        tensor = self.tensors[name]
        kind = tensor.tensor_type.name
        if kind not in CARRIED:
            return None, f"{kind} in the file"
        if self.processor is None:
            return None, "the loader reshapes this architecture's tensors"
        rows, cols = weight.shape
        raw = np.asarray(tensor.data)
        if raw.ndim != 2 or raw.shape[0] != rows:
            return None, f"{kind} tensor of another shape"
        blocks = from_gguf(kind, raw, rows, cols)
        order = self._row_order(name, rows)
        if order is not None:
            blocks = blocks.take_rows(order)
        largest = max(float(weight.max()), -float(weight.min()))  # no |weight| temporary
        tolerance = MATCH_RELATIVE * max(1e-30, largest)
        for start in range(0, rows, CHECK_ROWS):  # in slices: a float copy of one slice at most
            got = blocks.rows(start, start + CHECK_ROWS).dequantize()
            if float(np.max(np.abs(got - weight[start : start + CHECK_ROWS]))) > tolerance:
                return None, f"{kind} blocks differ from the loaded weights"
        self.release()
        return blocks, kind

    def stored_type(self, hf_name: str) -> str | None:
        """The GGUF type name of the parameter `hf_name` in the file, None where it is not
        there; reads no blocks."""
        name = self.gguf_name(hf_name)
        return None if name is None else str(self.tensors[name].tensor_type.name)

    def raw_blocks(self, hf_name: str, weight: np.ndarray) -> tuple[np.ndarray | None, str]:
        """The file's blocks of `hf_name` as stored, [N, bytes per row] uint8 with the loader's
        row order applied, where they provably are `weight` [N, K] (blocks()'s check); else
        (None, why). A view of the file where no rows move."""
        blocks, why = self.blocks(hf_name, weight)
        if blocks is None:
            return None, why
        name = self.gguf_name(hf_name)
        assert name is not None
        raw = np.asarray(self.tensors[name].data)
        order = self._row_order(name, raw.shape[0])
        return (raw if order is None else raw[order]), why

    def _row_order(self, name: str, rows: int) -> np.ndarray | None:
        """The row permutation the loader applies to `name` (None: none), found by running the
        loader's own processor on a column of row indices."""
        assert self.processor is not None
        probe = np.arange(rows, dtype=np.float64)[:, None]
        result = self.processor.process(weights=probe, name=name)
        order = np.asarray(result.weights).reshape(-1).astype(np.int64)
        return None if np.array_equal(order, np.arange(rows)) else order


@contextlib.contextmanager
def parsed_once() -> Iterator[None]:
    """Within the block each GGUF file is parsed once. transformers' loader parses the whole file
    for the config, again for the tokenizer, and GgufBlocks reads it for the tensors; each parse
    walks the vocabulary's fields (hundreds of thousands of strings) in Python, and a reader
    holding them takes more memory than the vocabulary's text (half a GB for 151,936 tokens):
    once the loader has read them, the shared reader keeps only the tensors."""
    import gguf
    import transformers.modeling_gguf_pytorch_utils as hf_gguf

    make_reader, load_checkpoint = gguf.GGUFReader, hf_gguf.load_gguf_checkpoint
    readers: dict[tuple[str, str], Any] = {}
    checkpoints: dict[str, dict[str, Any]] = {}

    def reader(path: Any, mode: Any = "r") -> Any:
        key = (str(Path(path).resolve()), str(mode))
        if key not in readers:
            readers[key] = make_reader(path, mode)
        return readers[key]

    def checkpoint(path: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        if args or set(kwargs) - {"return_tensors"} or kwargs.get("return_tensors"):
            return load_checkpoint(path, *args, **kwargs)  # tensors: not what is shared here
        key = str(Path(path).resolve())
        if key not in checkpoints:
            checkpoints[key] = load_checkpoint(path, return_tensors=False)
            for (name, _), kept in readers.items():
                if name == key:  # its fields are parsed now: GgufBlocks needs one of them
                    kept.fields = {k: v for k, v in kept.fields.items() if k == ARCHITECTURE}
        return copy.deepcopy(checkpoints[key])  # callers pop and rewrite the dicts

    setattr(gguf, "GGUFReader", reader)  # noqa: B010  (a module attribute, patched for the block)
    setattr(hf_gguf, "load_gguf_checkpoint", checkpoint)  # noqa: B010
    try:
        yield
    finally:
        setattr(gguf, "GGUFReader", make_reader)  # noqa: B010
        setattr(hf_gguf, "load_gguf_checkpoint", load_checkpoint)  # noqa: B010
