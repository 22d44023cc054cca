"""The export's `--draft` entries, resolved once against the drafter registry.

An entry is a model source (a folder, a .gguf file, a hub id), ``NAME=SOURCE``, or a registry
keyword (``int8``, ``int4``, ``ngram``, ``suffix``); ``ngram+ENTRY`` or ``suffix+ENTRY`` exports
ENTRY and makes the hybrid the artifact's default drafter. Unnamed model drafts are called
draft, draft2, ...; the target's own source drafts as ``self``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from specx.exporter.weights.load import locate
from specx.runtime.drafters import registry
from specx.runtime.drafters.registry import DrafterKind
from specx.runtime.errors import ExportError

NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")
HEAD_CONFIG = "config.json"


def is_head_checkpoint(path: str | Path) -> bool:
    """Whether `path` is a folder holding a feature head (an EAGLE or speculators checkpoint, or
    one `specx distill` wrote), judged by its config.json."""
    folder = Path(path)
    config = folder / HEAD_CONFIG
    if not folder.is_dir() or not config.is_file():
        return False
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    if not isinstance(data, dict):
        return False
    if data.get("speculators_model_type") in ("eagle", "eagle3"):
        return True
    architectures = " ".join(str(a) for a in data.get("architectures") or [])
    if "eagle" in architectures.lower():
        return True
    # the EAGLE authors' EAGLE-1/2 heads call themselves LlamaForCausalLM: their weights tell
    return bool({"fc.weight", "fusion_fc.weight"} & _weight_names(folder))


def _weight_names(folder: Path) -> set[str]:
    """Tensor names of model.safetensors (from its JSON header) without loading anything."""
    path = folder / "model.safetensors"
    try:
        with path.open("rb") as f:
            size = int.from_bytes(f.read(8), "little")
            if not 0 < size < 100_000_000:
                return set()
            header = json.loads(f.read(size))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        pass
    else:
        return set(header) if isinstance(header, dict) else set()
    bin_path = folder / "pytorch_model.bin"  # a zip whose pickle spells the names
    try:
        import zipfile

        with zipfile.ZipFile(bin_path) as z:
            pickled = b"".join(z.read(n) for n in z.namelist() if n.endswith("data.pkl"))
    except (OSError, zipfile.BadZipFile):
        return set()
    return {name for name in ("fc.weight", "fusion_fc.weight") if name.encode() in pickled}


@dataclass(frozen=True)
class DraftEntry:
    name: str  # how `specx run --draft` selects it
    source: str  # the model source, or the keyword
    kind: DrafterKind
    # given as ngram+ENTRY or suffix+ENTRY: that prefix; the artifact's default is then the
    # hybrid PREFIX + NAME
    lookup: str = ""

    @property
    def hybrid(self) -> bool:
        return bool(self.lookup)


def same_source(a: str, b: str) -> bool:
    pa, pb = Path(a).expanduser(), Path(b).expanduser()
    if pa.exists() and pb.exists():
        return pa.resolve() == pb.resolve()
    return a == b


def _kind(source: str, target: str) -> DrafterKind:
    keyword = None if Path(source).exists() else registry.keyword_kind(source)
    if keyword is not None:
        return keyword
    if is_head_checkpoint(source):
        return registry.KINDS["eagle"]
    return registry.KINDS["self" if same_source(source, target) else "model"]


def resolve_drafts(drafts: Sequence[str], target: str) -> list[DraftEntry]:
    entries: list[DraftEntry] = []
    for i, entry in enumerate(drafts):
        inner = None if Path(entry).exists() else registry.split_hybrid(entry)
        item = inner if inner is not None else entry
        name, sep, source = item.partition("=")
        if not sep or not NAME.fullmatch(name) or Path(item).exists():
            source = item
            kind = _kind(item, target)
            if kind.keyword is not None:
                name = item
            elif kind.name in ("self", "eagle"):
                name = kind.name
            else:
                name = "draft" if i == 0 else f"draft{i + 1}"
        else:
            kind = _kind(source, target)
        if kind.export == registry.EXPORT_NOTHING and name != kind.keyword:
            raise ExportError(
                f"the {kind.name} drafter is always named {kind.keyword!r}",
                f"use --draft {kind.keyword}",
            )
        if name in registry.RESERVED_NAMES and name != kind.keyword:
            raise ExportError(f"draft name {name!r} is reserved", "choose another NAME=SOURCE")
        if inner is not None and kind.export == registry.EXPORT_NOTHING:
            raise ExportError(
                f"{entry}: a lookup can only be put in front of a draft model",
                "use ngram+int8, ngram+int4, ngram+PATH or ngram+NAME=PATH (or suffix+...)",
            )
        if name in (e.name for e in entries):
            raise ExportError(f"two drafts are named {name!r}", "give each draft its own NAME=")
        prefix = registry.hybrid_prefix(entry) if inner is not None else None
        entries.append(DraftEntry(name, source, kind, lookup=prefix or ""))
    return entries


def default_drafter(entries: list[DraftEntry]) -> str | None:
    """The first entry is the default drafter of `specx run` (None: no drafts given)."""
    if not entries:
        return None
    first = entries[0]
    return first.lookup + first.name


def check_sources(target: str, entries: Sequence[DraftEntry]) -> None:
    """Every model source of the export is found before any work starts (a file, a folder with
    a config.json, a hub id's shape), with the loader's own messages: a misspelled draft fails
    at once, not after minutes spent on the target. A hub id's config is read here too."""
    from specx.exporter.planning.profile import read_config

    models = [(target, "--target")]
    models += [
        (e.source, f"--draft {e.lookup}{e.source}" if e.lookup else "--draft")
        for e in entries
        if _is_model(e)
    ]
    for source, flag in models:
        named = next((e for e in entries if e.name == source and e.source != source), None)
        if named is not None and not Path(source).exists():
            prefixes = " and ".join(f"{p}{named.name}" for p in registry.PREFIXES)
            raise ExportError(
                f"--draft {source!r} is the name of the draft {named.source}, not a model source",
                f"every exported draft also runs as {prefixes} (specx run --draft "
                f"{registry.PREFIXES[0]}{named.name}); to make that the artifact's default, give "
                f"it first as --draft {registry.PREFIXES[0]}{named.source}",
            )
        try:
            locate(source, lambda _line: None)  # the loader says it again, when it loads
        except ExportError as e:
            raise ExportError(f"{flag}: {e.message}", e.hint) from e
        if not Path(source).expanduser().exists():  # a hub id: its config, now
            read_config(source)


def _is_model(entry: DraftEntry) -> bool:
    """Whether the entry's source is a model the export reads (not a keyword or the target)."""
    return entry.kind.export in (registry.EXPORT_MODEL, registry.EXPORT_HEAD)
