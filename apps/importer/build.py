"""`import_pair`: a target folder and its drafts -> one artifact folder, checked, then moved
into place (nothing half-written)."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from specx.apps.importer.borrowed import Borrowed, borrow, borrowed_spec, is_artifact
from specx.apps.importer.checks import (
    CHECK_TEXT,
    load_tokenizer,
    multi_token_parity,
    rewrite_parity,
    same_tokenizer,
)
from specx.apps.importer.layout import Source, recognise
from specx.apps.importer.rewrite import rewrite_to_gqa
from specx.runtime.artifact import contract
from specx.runtime.artifact.contract import Manifest, ModelSpec, SpecialTokens
from specx.runtime.drafters.registry import keyword_kind, model_free_kinds
from specx.runtime.errors import InputError

Log = Callable[[str], None]


@dataclass(frozen=True)
class ImportOptions:
    max_length: int = 2048  # cache capacity, at most the model's max_position_embeddings
    check_k: int = 4  # the parity check's verify width is K + 1
    copy: bool = False  # copy the graphs into the artifact (default: link to them)
    variant: str | None = None  # model_<variant>.onnx of each folder (None: model.onnx)
    force: bool = False  # replace an existing output folder
    rewrite: str | None = None  # "gqa": Optimum graphs' attention as GroupQueryAttention


def _draft_entries(drafts: list[str]) -> list[tuple[str, Path | None]]:
    """(name, folder) per --draft: NAME=PATH or PATH (named draft, draft2, ...), or a model-free
    drafter's keyword (folder None). Checked before anything is read."""
    free = {k.name for k in model_free_kinds()}
    entries: list[tuple[str, Path | None]] = []
    for i, entry in enumerate(drafts):
        if entry in free:
            entries.append((entry, None))
            continue
        if keyword_kind(entry) is not None:
            raise InputError(
                f"--draft {entry} makes a draft from the target's weights, which an import "
                "does not have",
                f"pass a draft model's folder or a model-free drafter ({', '.join(sorted(free))})",
            )
        name, _, path = entry.rpartition("=")
        name = name or ("draft" if i == 0 else f"draft{i + 1}")
        folder = Path(path)
        if not folder.is_dir():
            raise InputError(f"--draft {entry}: {folder} is not a folder", "pass its folder")
        entries.append((name, folder))
    names = [n for n, _ in entries]
    if len(set(names)) != len(names):
        raise InputError(f"two drafts share a name: {names}", "name them with NAME=PATH")
    return entries


def _link_or_copy(source: Source | Borrowed, into: Path, copy: bool) -> None:
    into.mkdir(parents=True)
    for f in source.files:  # the graph and its external data keep their names: the graph
        target = into / f.name  # finds its data files beside itself
        if copy:
            shutil.copy2(f, target)
        else:
            os.symlink(f.resolve(), target)


def _special_tokens(source: Source) -> SpecialTokens:
    config = dict(source.config)
    generation = source.folder / "generation_config.json"
    if generation.is_file() and source.attention == "concat":
        try:
            config |= {k: v for k, v in json.loads(generation.read_text()).items() if v is not None}
        except (OSError, ValueError) as e:
            raise InputError(f"cannot read {generation}: {e}") from e
    tok = load_tokenizer(source.tokenizer)
    eos = config.get("eos_token_id")
    listed = eos if isinstance(eos, list) else [] if eos is None else [eos]
    eos_ids = tuple(int(i) for i in listed)
    bos = config.get("bos_token_id")
    pad = config.get("pad_token_id")
    return SpecialTokens(
        bos_token_id=int(bos) if bos is not None else None,
        eos_token_ids=eos_ids,
        pad_token_id=int(pad) if pad is not None else None,
        bos_token=tok.id_to_token(int(bos)) if bos is not None else None,
        eos_token=tok.id_to_token(eos_ids[0]) if eos_ids else None,
    )


def _chat_template(source: Source) -> str | None:
    jinja = source.tokenizer.parent / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text()
    config = source.tokenizer.parent / "tokenizer_config.json"
    if config.is_file():
        try:
            template = json.loads(config.read_text()).get("chat_template")
        except (OSError, ValueError) as e:
            raise InputError(f"cannot read {config}: {e}") from e
        return template if isinstance(template, str) else None
    return None


def _spec(source: Source, role: str, name: str, options: ImportOptions) -> ModelSpec:
    c = source.config
    heads = int(c.get("num_attention_heads", source.kv_heads))
    hidden = int(c.get("hidden_size", heads * source.head_dim))
    logits = next(t for t in source.outputs if t.name == contract.LOGITS)
    vocab = logits.shape[2] if isinstance(logits.shape[2], int) else int(c["vocab_size"])
    positions = int(c.get("max_position_embeddings", options.max_length))
    return ModelSpec(
        role=role,
        name=name,
        graph=f"{name}/{source.graph.name}",
        architecture=source.architecture,
        source=str(source.folder.resolve()),
        num_layers=source.num_layers,
        num_heads=heads,
        kv_heads=source.kv_heads,
        head_dim=source.head_dim,
        hidden_size=hidden,
        vocab_size=int(vocab),
        max_length=min(options.max_length, positions),
        dtype=source.dtype,
        num_parameters=0,  # unknown without reading the graph's initializers (the onnx package)
        weight_bytes=sum(f.stat().st_size for f in source.files),
        inputs=source.inputs,
        outputs=source.outputs,
        variant=source.variant,
        attention=source.attention,
    )


def _rewritten(
    src: Source,
    spec: ModelSpec,
    folder: Path,
    ids: np.ndarray,
    options: ImportOptions,
    pair_id: str,
    log: Log,
) -> ModelSpec:
    """The source's graph with GroupQueryAttention layers, checked against the original; its
    spec carries that check as `parity` for the caller to file."""
    into = folder / spec.name
    gqa = dataclasses.replace(
        spec, graph=f"{spec.name}/{src.graph.name}", attention="gqa", inputs=(), outputs=()
    )  # its I/O: the contract's for a gqa graph without position_ids
    gqa = dataclasses.replace(gqa, inputs=gqa.expected_inputs(), outputs=gqa.expected_outputs())
    graph = rewrite_to_gqa(src, gqa, into, options.copy, pair_id)
    weights = sum(f.stat().st_size for f in into.iterdir())
    rewritten = dataclasses.replace(gqa, weight_bytes=weights)
    check = rewrite_parity(src.graph, spec, graph, rewritten, ids)
    log(
        f"  {spec.name}: attention rewritten as GroupQueryAttention; against the original graph: "
        f"max|dlogit| {check['max_abs_logit_diff']:.1e}, argmax agrees "
        f"{100 * check['argmax_agreement']:.0f}%"
    )
    return dataclasses.replace(rewritten, parity=check)


def _staging(output: Path, force: bool) -> Path:
    if output.exists() and not force:
        raise InputError(f"{output} exists", "pass --force to replace it, or another -o")
    output.parent.mkdir(parents=True, exist_ok=True)
    staged = output.parent / f".{output.name}.import-{uuid.uuid4().hex[:8]}"
    staged.mkdir()
    return staged


def _move_into_place(staged: Path, output: Path) -> None:
    if output.exists():
        old = output.parent / f".{output.name}.old-{uuid.uuid4().hex[:8]}"
        output.rename(old)
        staged.rename(output)
        shutil.rmtree(old, ignore_errors=True)
    else:
        staged.rename(output)


def import_pair(
    target: Path, drafts: list[str], output: Path, options: ImportOptions, log: Log
) -> Manifest:
    """Recognise and check every folder, then write the artifact (atomically)."""
    entries = _draft_entries(drafts)
    if options.check_k < 1:
        raise InputError(f"--check-k must be >= 1, got {options.check_k}")
    log(f"target: {target}")
    tsrc = recognise(target, options.variant)
    sources: list[tuple[str, str, Source | Borrowed]] = [("target", "target", tsrc)]
    for name, folder in entries:
        if folder is not None:
            log(f"draft {name!r}: {folder}")
            dsrc: Source | Borrowed = (
                borrow(folder, name) if is_artifact(folder) else recognise(folder, options.variant)
            )
            same_tokenizer(tsrc.tokenizer, dsrc.tokenizer)
            sources.append(("draft", name, dsrc))
    staged = _staging(output, options.force)
    try:
        manifest = _write(staged, sources, entries, options, log)
        _move_into_place(staged, output)
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    log(f"done: {output}")
    return manifest


def _write(
    folder: Path,
    sources: list[tuple[str, str, Source | Borrowed]],
    entries: list[tuple[str, Path | None]],
    options: ImportOptions,
    log: Log,
) -> Manifest:
    tsrc = sources[0][2]
    assert isinstance(tsrc, Source)  # the target is a folder's decoder, never borrowed
    shutil.copy2(tsrc.tokenizer, folder / contract.TOKENIZER_FILE)
    tokenizer = load_tokenizer(tsrc.tokenizer)
    ids = np.asarray(tokenizer.encode(CHECK_TEXT).ids, dtype=np.int64)
    if len(ids) < options.check_k + 2:
        ids = np.resize(np.arange(min(64, tokenizer.get_vocab_size()), dtype=np.int64), 32)
    specs: list[ModelSpec] = []
    pair_id = uuid.uuid4().hex
    for role, name, src in sources:
        if isinstance(src, Borrowed):
            specs.append(_borrowed(src, name, folder, ids, options, log))
            continue
        spec = _spec(src, role, name, options)
        rewritten = options.rewrite == "gqa" and src.attention == "concat"
        if rewritten:
            spec = _rewritten(src, spec, folder, ids, options, pair_id, log)
        else:
            _link_or_copy(src, folder / name, options.copy)
        parity = multi_token_parity(folder / spec.graph, spec, ids, options.check_k)
        if rewritten:
            parity["rewrite"] = spec.parity
        log(
            f"  {name}: {src.num_layers} layers, {src.variant}; a {options.check_k + 1}-token "
            f"pass against one-token passes: max|dlogit| {parity['max_abs_logit_diff']:.1e}, "
            f"argmax agrees {100 * parity['argmax_agreement']:.0f}%"
        )
        specs.append(dataclasses.replace(spec, parity=parity))
    target_spec, draft_specs = specs[0], tuple(specs[1:])
    manifest = Manifest(
        format_version=contract.format_version_for(draft_specs, target_spec),
        pair_id=pair_id,
        target=target_spec,
        drafts=draft_specs,
        tokenizer=contract.TOKENIZER_FILE,
        tokenizer_vocab_size=tokenizer.get_vocab_size(with_added_tokens=True),
        special_tokens=_special_tokens(tsrc),
        chat_template=_chat_template(tsrc),
        max_length=min(s.max_length for s in specs),
        exporter=_record(sources, options),
        default_drafter=entries[0][0] if entries else None,
    )
    manifest.write(folder)
    return manifest


def _borrowed(
    src: Borrowed, name: str, folder: Path, ids: np.ndarray, options: ImportOptions, log: Log
) -> ModelSpec:
    """A draft of another specx artifact, linked or copied as exported, checked like the rest;
    the export's own parity kept beside the import's check."""
    spec = borrowed_spec(src, name)
    _link_or_copy(src, folder / name, options.copy)
    parity = multi_token_parity(folder / spec.graph, spec, ids, options.check_k)
    log(
        f"  {name}: {src.spec.name} of {src.artifact} (export {src.pair_id}), {spec.variant}; "
        f"a {options.check_k + 1}-token pass against one-token passes: max|dlogit| "
        f"{parity['max_abs_logit_diff']:.1e}, argmax agrees {100 * parity['argmax_agreement']:.0f}%"
    )
    return dataclasses.replace(spec, parity={**parity, "export": src.spec.parity})


def _record(
    sources: list[tuple[str, str, Source | Borrowed]], options: ImportOptions
) -> dict[str, Any]:
    from importlib.metadata import version

    return {
        "tool": "specx import",
        "specx": version("specx"),
        "layouts": {name: _layout(src) for _, name, src in sources},
        "graphs": "copied" if options.copy else "linked",
        "sources": {name: str(src.files[0].resolve()) for _, name, src in sources},
        "options": {"max_length": options.max_length, "check_k": options.check_k},
        "rewrites": {
            name: "concat -> gqa"
            for _, name, src in sources
            if options.rewrite == "gqa" and _layout(src) == "concat"
        },
    }


def _layout(src: Source | Borrowed) -> str:
    """How the import found the graph: "concat" or "genai", or "specx" (another artifact's)."""
    return "specx" if isinstance(src, Borrowed) else src.attention
