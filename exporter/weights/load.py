"""Load a causal LM and its tokenizer from a folder, a .gguf file, or a hub id; check pairs."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from specx.exporter.architecture import Architecture, check_architecture, describe
from specx.runtime.artifact.contract import SpecialTokens
from specx.runtime.errors import ExportError

Log = Callable[[str], None]


@dataclass
class SourceModel:
    model: Any  # a transformers PreTrainedModel, eval mode, float32
    tokenizer: Any  # a transformers fast tokenizer
    source: str
    load_s: float
    weights: Any  # a sources.WeightSource: the model's tensors one at a time

    @property
    def config(self) -> Any:
        return self.model.config

    @property
    def model_type(self) -> str:
        return str(self.model.config.model_type)

    @cached_property
    def architecture(self) -> Architecture:
        """What specx reads of its config (exporter/architecture.py)."""
        return describe(self.config, self.source)


def _config_errors() -> tuple[type[BaseException], ...]:
    """What reading a bad config.json raises: OS and value errors, and huggingface_hub's strict
    dataclass validation (transformers 5 checks field types with it)."""
    try:
        from huggingface_hub.errors import StrictDataclassError
    except ImportError:
        return (OSError, ValueError, TypeError)
    return (OSError, ValueError, TypeError, StrictDataclassError)


CONFIG_ERRORS = _config_errors()


def locate(source: str, log: Log) -> tuple[str, dict[str, Any]]:
    """(folder or hub id, from_pretrained keyword arguments) of `source`; refuses what is not
    a model."""
    path = Path(source).expanduser()
    if path.suffix.lower() == ".gguf":
        if not path.is_file():
            raise ExportError(f"{source} does not exist", "check the path of the .gguf file")
        return str(path.parent), {"gguf_file": path.name}
    if path.exists():
        if not path.is_dir():
            raise ExportError(
                f"{source} is neither a model folder nor a .gguf file",
                "pass a Hugging Face model folder (with config.json) or a .gguf file",
            )
        if not (path / "config.json").is_file():
            raise ExportError(
                f"{source} holds no config.json",
                "pass a folder written by save_pretrained (config.json, weights, tokenizer)",
            )
        return str(path), {}
    if source.count("/") == 1 and not source.startswith((".", "/", "~")):
        log(f"  {source} is not a local path; trying the Hugging Face hub")
        return source, {}
    raise ExportError(
        f"{source} does not exist", "pass a model folder, a .gguf file, or a hub id (org/name)"
    )


def _config(folder: str, kwargs: dict[str, Any], source: str) -> Any:
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(folder, **kwargs)
    except CONFIG_ERRORS as e:
        raise ExportError(
            f"cannot read the model config of {source}: {str(e).splitlines()[0][:300]}",
            "check the path and its config.json (a hub id needs network access)",
        ) from e
    check_architecture(config, source)
    return config


def _tokenizer(folder: str, kwargs: dict[str, Any], source: str) -> Any:
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, **kwargs)
    except (OSError, ValueError, ImportError, RuntimeError, TypeError) as e:
        raise ExportError(
            f"cannot load the tokenizer of {source}: {str(e).splitlines()[0][:300]}",
            "check that the folder holds a tokenizer (for .gguf: pip install gguf)",
        ) from e
    if not getattr(tokenizer, "is_fast", False):
        raise ExportError(
            f"{source} has no fast tokenizer (tokenizer.json)",
            "save the model with a fast tokenizer (transformers' PreTrainedTokenizerFast)",
        )
    return tokenizer


def load_source(source: str, log: Log) -> SourceModel:
    """Load `source` whole, as the user would with transformers, in float32 on the CPU."""
    import torch
    from transformers import AutoModelForCausalLM

    t0 = time.perf_counter()
    folder, kwargs = locate(source, log)
    if kwargs:
        log(f"  reading {kwargs['gguf_file']} (GGUF weights are dequantized to float32)")
    _config(folder, kwargs, source)
    try:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, **kwargs)
    except (OSError, ValueError, ImportError, RuntimeError, TypeError) as e:
        # RuntimeError, TypeError: the weights do not fit the config (torch's own messages)
        raise ExportError(
            f"cannot load {source}: {str(e).splitlines()[0][:300]}",
            "check that the folder holds weights and a tokenizer (for .gguf: pip install gguf "
            "accelerate)",
        ) from e
    tokenizer = _tokenizer(folder, kwargs, source)
    model.eval()
    from specx.exporter.weights.sources import LoadedWeights

    weights = LoadedWeights(model)
    return SourceModel(model, tokenizer, source, time.perf_counter() - t0, weights)


def open_source(source: str, log: Log) -> SourceModel:
    """`source` for an export, streamed: its config and tokenizer, and a model whose weights
    are read a module at a time (sources.py) instead of loaded whole."""
    from transformers import GenerationConfig

    from specx.exporter.weights.gguf import parsed_once
    from specx.exporter.weights.sources import meta_model, open_weights, stream_weights

    t0 = time.perf_counter()
    folder, kwargs = locate(source, log)
    with parsed_once() if kwargs else contextlib.nullcontext():  # a .gguf: parsed once
        config = _config(folder, kwargs, source)
        tokenizer = _tokenizer(folder, kwargs, source)
        local = Path(folder)
        if not local.is_dir():  # a hub id: the files, fetched once
            try:
                from huggingface_hub import snapshot_download

                local = Path(snapshot_download(folder))
            except (OSError, ValueError) as e:
                raise ExportError(
                    f"cannot fetch {source}: {str(e).splitlines()[0][:300]}",
                    "download the model to a folder first (a hub id needs network access)",
                ) from e
        path = local / kwargs["gguf_file"] if kwargs else local
        model = meta_model(config)
        weights = open_weights(path, model)
    stream_weights(model, weights)
    if not kwargs:  # a folder's generation_config.json (end-of-turn ids), as from_pretrained
        with contextlib.suppress(OSError):
            model.generation_config = GenerationConfig.from_pretrained(str(local))
    return SourceModel(model, tokenizer, source, time.perf_counter() - t0, weights)


def eos_token_ids(src: SourceModel) -> tuple[int, ...]:
    ids: list[int] = []
    gen = getattr(src.model, "generation_config", None)
    for value in (getattr(gen, "eos_token_id", None), src.tokenizer.eos_token_id):
        if value is None:
            continue
        for v in value if isinstance(value, list | tuple) else [value]:
            if int(v) not in ids:
                ids.append(int(v))
    return tuple(ids)


def special_tokens(src: SourceModel) -> SpecialTokens:
    tok = src.tokenizer
    return SpecialTokens(
        bos_token_id=tok.bos_token_id,
        eos_token_ids=eos_token_ids(src),
        pad_token_id=tok.pad_token_id,
        bos_token=tok.bos_token,
        eos_token=tok.eos_token,
    )


def chat_template(src: SourceModel) -> str | None:
    template = getattr(src.tokenizer, "chat_template", None)
    if isinstance(template, dict):
        template = template.get("default")
    return template if isinstance(template, str) else None


def model_vocab_size(src: SourceModel) -> int:
    return int(src.model.get_output_embeddings().weight.shape[0])


def check_pair(target: SourceModel, draft: SourceModel) -> None:
    """Refuse a pair whose tokenizers disagree; name the first difference.

    Model vocabularies (embedding rows) may differ by padding rows beyond the tokenizer.
    """
    t_vocab, d_vocab = target.tokenizer.get_vocab(), draft.tokenizer.get_vocab()
    if t_vocab != d_vocab:
        t_by_id = {i: s for s, i in t_vocab.items()}
        d_by_id = {i: s for s, i in d_vocab.items()}
        for i in sorted(set(t_by_id) | set(d_by_id)):
            if t_by_id.get(i) != d_by_id.get(i):
                raise ExportError(
                    f"the tokenizers of {target.source} and {draft.source} differ: token id {i} "
                    f"is {t_by_id.get(i)!r} in the target and {d_by_id.get(i)!r} in the draft",
                    "a draft must share the target's tokenizer; pick a draft of the same family",
                )
    t_special, d_special = special_tokens(target), special_tokens(draft)
    for field in ("bos_token_id", "eos_token_ids", "pad_token_id"):
        tv, dv = getattr(t_special, field), getattr(d_special, field)
        if tv != dv:
            raise ExportError(
                f"the special tokens differ: {field} is {tv} in the target and {dv} in the draft",
                "a draft must share the target's tokenizer and special tokens",
            )
    size = len(target.tokenizer)
    for src in (target, draft):
        if model_vocab_size(src) < size:
            raise ExportError(
                f"{src.source} has {model_vocab_size(src)} output rows for a tokenizer of "
                f"{size} tokens",
                "the model cannot produce every token of its tokenizer; check the model",
            )
