"""The one registry of drafters: every kind, how the runtime builds it from an artifact, and what
the exporter must make for it. The CLI, the exporter, the memory planner, the TensorRT engine
builder and the bench all read it; a new drafter is one module in this package plus one entry in
KINDS.

Names a user meets: at export, ``--draft`` takes a model source (a path, ``NAME=PATH``) or a
keyword (``int8``, ``int4``, ``ngram``, ``suffix``, ``ngram+X``, ``suffix+X``); at run time,
``--draft`` takes a name the artifact offers (``drafter_names``): every exported draft by its
name, ``ngram``, ``suffix``, ``ngram+NAME`` and ``suffix+NAME`` for every exported draft, and
``none``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from specx.runtime.artifact.contract import Manifest, ModelSpec
from specx.runtime.backends.base import GraphSession
from specx.runtime.drafters.base import Drafter
from specx.runtime.drafters.eagle import EagleDrafter
from specx.runtime.drafters.hybrid import PREFIX, PREFIXES, SUFFIX_PREFIX, HybridDrafter
from specx.runtime.drafters.model import ModelDrafter
from specx.runtime.drafters.ngram import NgramDrafter
from specx.runtime.drafters.suffix import SuffixDrafter, SuffixHistory
from specx.runtime.errors import InputError

NO_DRAFTER = "none"  # the target alone

# What the exporter makes for a kind:
EXPORT_NOTHING = "nothing"  # no graph of its own
EXPORT_MODEL = "model"  # a second model, traced and parity-checked like the target
EXPORT_TARGET = "target"  # nothing: the target's own graph drafts
EXPORT_QUANTIZED = "quantized"  # a weight-quantized copy of the target's graph
EXPORT_HEAD = "head"  # a feature head's graph, and the target's graph with its features


@dataclass(frozen=True)
class DraftResources:
    """What building a drafter for one generation workspace needs from the pipeline."""

    manifest: Manifest
    session_for: Callable[[ModelSpec], GraphSession]  # a fork of the loaded graph of a draft
    capacity: int  # cache positions
    history: SuffixHistory | None = None  # earlier generations' outputs (suffix drafting)


@dataclass(frozen=True)
class DrafterKind:
    name: str
    summary: str  # one line for help texts
    export: str  # one of the EXPORT_* recipes
    build: Callable[[str, DraftResources], Drafter]  # (the name it was asked by, resources)
    keyword: str | None = None  # the --draft word that asks for it at export (None: a source)
    fp16: bool = True  # can be exported under an fp16 profile
    tensorrt: bool = True  # its graph can be built into a TensorRT engine
    benchmarked: bool = True  # `specx bench` runs it by default


def _model(name: str, res: DraftResources) -> ModelDrafter:
    spec = res.manifest.find_draft(name)
    return ModelDrafter(
        res.session_for(spec),
        res.capacity,
        res.manifest.target.vocab_size,
        res.manifest.special_tokens.eos_token_ids,
        name=name,
    )


def _eagle(name: str, res: DraftResources) -> EagleDrafter:
    spec = res.manifest.find_draft(name)
    return EagleDrafter(
        res.session_for(spec),
        res.capacity,
        res.manifest.target.vocab_size,
        res.manifest.special_tokens.eos_token_ids,
        name=name,
    )


def _ngram(name: str, res: DraftResources) -> NgramDrafter:
    return NgramDrafter(eos_token_ids=res.manifest.special_tokens.eos_token_ids)


def _suffix(name: str, res: DraftResources) -> SuffixDrafter:
    return SuffixDrafter(res.history, res.manifest.special_tokens.eos_token_ids)


def _hybrid(name: str, res: DraftResources) -> HybridDrafter:
    inner = split_hybrid(name)
    assert inner is not None
    kind = kind_of_spec(res.manifest, res.manifest.find_draft(inner))
    lookup = _suffix("suffix", res) if name.startswith(SUFFIX_PREFIX) else _ngram("ngram", res)
    return HybridDrafter(lookup, kind.build(inner, res))


KINDS: dict[str, DrafterKind] = {
    kind.name: kind
    for kind in (
        DrafterKind(
            "model",
            "a smaller model of the target's family and tokenizer (PATH, or NAME=PATH)",
            EXPORT_MODEL,
            _model,
        ),
        DrafterKind(
            "self",
            "the target drafting for itself (the target's own source): shows the mechanics, "
            "cannot speed anything up",
            EXPORT_TARGET,
            _model,
            benchmarked=False,
        ),
        DrafterKind(
            "int8",
            "an 8-bit weight-quantized copy of the target (ONNX Runtime CPU ops)",
            EXPORT_QUANTIZED,
            _model,
            keyword="int8",
            fp16=False,
            tensorrt=False,
        ),
        DrafterKind(
            "int4",
            "a 4-bit weight-quantized copy of the target (ONNX Runtime CPU ops)",
            EXPORT_QUANTIZED,
            _model,
            keyword="int4",
            fp16=False,
            tensorrt=False,
        ),
        DrafterKind(
            "eagle",
            "a feature draft (EAGLE-1/2/3 head: one layer over the target's hidden states), "
            "imported from an EAGLE or speculators checkpoint or made by `specx distill` "
            "(NAME=PATH)",
            EXPORT_HEAD,
            _eagle,
            fp16=False,
            tensorrt=False,
        ),
        DrafterKind(
            "ngram",
            "n-gram prompt lookup (no model; always available at run time)",
            EXPORT_NOTHING,
            _ngram,
            keyword="ngram",
        ),
        DrafterKind(
            "suffix",
            "suffix drafting: continuations of the longest match in the text so far and in "
            "earlier generations of the same user (no model; always available at run time)",
            EXPORT_NOTHING,
            _suffix,
            keyword="suffix",
        ),
        DrafterKind(
            "hybrid",
            "ngram+X or suffix+X: a lookup when the text so far has a match, draft X otherwise "
            "(exports X; the hybrid becomes the default)",
            EXPORT_NOTHING,
            _hybrid,
            keyword=PREFIX,
        ),
    )
}
# Names a model draft may not take at export: they mean something else on the command line.
RESERVED_NAMES = (
    NO_DRAFTER,
    "target",
    "auto",
    SUFFIX_PREFIX,
    *(k.keyword for k in KINDS.values() if k.keyword),
)


def keyword_kind(entry: str) -> DrafterKind | None:
    """The kind an export --draft entry names by keyword (int8, int4, ngram, suffix); None for a
    model source. ngram+X and suffix+X are hybrids: see split_hybrid."""
    return next((k for k in KINDS.values() if k.keyword == entry == k.name), None)


def model_free_kinds() -> list[DrafterKind]:
    """Drafters that need no graph (n-gram lookup): every artifact offers them."""
    return [k for k in KINDS.values() if k.export == EXPORT_NOTHING and k.keyword == k.name]


def hybrid_prefix(entry: str) -> str | None:
    """The lookup part of a hybrid's name (ngram+ or suffix+), else None."""
    return next((p for p in PREFIXES if entry.startswith(p)), None)


def split_hybrid(entry: str) -> str | None:
    """X for an entry ngram+X or suffix+X, else None."""
    prefix = hybrid_prefix(entry)
    return entry.removeprefix(prefix) if prefix is not None else None


def kind_of_spec(manifest: Manifest, spec: ModelSpec) -> DrafterKind:
    """The kind of an exported draft model."""
    if spec.head is not None:
        return KINDS["eagle"]
    by_variant = KINDS.get(spec.variant)
    derived = spec.parity.get("kind") == "quantized"  # a model draft may be int4/int8 too
    if by_variant is not None and by_variant.export == EXPORT_QUANTIZED and derived:
        return by_variant
    if spec.graph == manifest.target.graph:
        return KINDS["self"]
    return KINDS["model"]


def drafter_names(manifest: Manifest) -> list[str]:
    """What `--draft` may name for this artifact: its draft models, n-gram lookup and suffix
    drafting (always), each draft model behind either lookup, and none."""
    models = [d.name for d in manifest.drafts]
    free = [k.name for k in model_free_kinds()]
    hybrids = [p + m for p in PREFIXES for m in models]
    return [*models, *free, *hybrids, NO_DRAFTER]


def default_drafter(manifest: Manifest) -> str:
    if manifest.default_drafter:
        return manifest.default_drafter
    return manifest.drafts[0].name if manifest.drafts else NO_DRAFTER


def benchmark_drafters(manifest: Manifest) -> list[str]:
    """The drafters `specx bench` measures unless told otherwise."""
    models = [d.name for d in manifest.drafts if kind_of_spec(manifest, d).benchmarked]
    return [*models, *(k.name for k in model_free_kinds() if k.benchmarked)]


def build_drafter(name: str, resources: DraftResources) -> Drafter | None:
    """The drafter `name` for one workspace (None: the target alone)."""
    manifest = resources.manifest
    if name not in drafter_names(manifest):
        raise InputError(
            f"unknown drafter {name!r}", f"choose one of: {', '.join(drafter_names(manifest))}"
        )
    if name == NO_DRAFTER:
        return None
    if name in (k.name for k in model_free_kinds()):
        kind = KINDS[name]
    elif split_hybrid(name) is not None:
        kind = KINDS["hybrid"]
    else:
        kind = kind_of_spec(manifest, manifest.find_draft(name))
    return kind.build(name, resources)
