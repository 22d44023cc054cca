"""A draft taken from another specx artifact into an import, as that export wrote it: a user who
brings an Optimum or GenAI target can draft with the quantized draft `specx export` made from the
same weights (GGUF blocks as stored, on the specx kernels) instead of another tool's."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from specx.runtime.artifact import contract
from specx.runtime.artifact.contract import Manifest, ModelSpec
from specx.runtime.errors import InputError


@dataclass(frozen=True)
class Borrowed:
    """One model draft of a specx artifact: its spec there, the export its graph is stamped
    with, and the files to link or copy (the graph and its external data)."""

    artifact: Path
    spec: ModelSpec
    pair_id: str
    tokenizer: Path
    files: tuple[Path, ...]


def is_artifact(folder: Path) -> bool:
    return (folder / contract.MANIFEST_FILE).is_file()


def borrow(artifact: Path, name: str) -> Borrowed:
    """The draft of `artifact` that `name` picks: the one of that name, else the artifact's
    default drafter where it is a model, else its only model draft."""
    manifest = Manifest.read(artifact)
    models = {d.name: d for d in manifest.drafts if d.head is None}
    heads = [d.name for d in manifest.drafts if d.head is not None]
    default = manifest.default_drafter or (manifest.drafts[0].name if manifest.drafts else "")
    spec = models.get(name) or models.get(default)
    if spec is None and len(models) == 1:
        spec = next(iter(models.values()))
    if spec is None:
        why = f"its model drafts are {sorted(models)}" if models else "it has no model draft"
        also = f" (feature drafts {heads} need their own target's features)" if heads else ""
        raise InputError(
            f"--draft {name}={artifact}: which of the artifact's drafts? {why}{also}",
            "name one: --draft NAME=ARTIFACT with NAME one of its model drafts"
            if models
            else "export it with a model draft (specx export --draft int4 ...)",
        )
    graph = artifact / spec.graph
    # an exported graph's data lies beside it as GRAPH.data; an imported one's folder is its own
    # (its data named as its exporter named it, e.g. model.onnx_data)
    beside = graph.parent.iterdir() if "/" in spec.graph else graph.parent.glob(graph.name + ".*")
    files = (graph, *sorted(p for p in beside if p.is_file() and p != graph))
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise InputError(f"{artifact}: {missing} missing", "re-export the artifact")
    return Borrowed(
        artifact=artifact,
        spec=spec,
        pair_id=spec.pair_id or manifest.pair_id,
        tokenizer=artifact / manifest.tokenizer,
        files=files,
    )


def borrowed_spec(borrowed: Borrowed, name: str) -> ModelSpec:
    """Its spec in the new artifact: under the folder `name`, carrying its export's id."""
    graph = f"{name}/{borrowed.files[0].name}"
    return dataclasses.replace(
        borrowed.spec, role="draft", name=name, graph=graph, pair_id=borrowed.pair_id
    )
