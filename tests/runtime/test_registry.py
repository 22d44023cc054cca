"""The drafter registry: what an artifact offers, and a new drafter as one module plus one entry."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import TinyPair, needs_exporter
from specx.runtime import Pipeline
from specx.runtime.artifact.contract import Manifest
from specx.runtime.drafters import registry
from specx.runtime.drafters.base import EMPTY, LOOKUP, NONE, DraftPlan, DraftRequest, Proposal

pytestmark = needs_exporter


def test_an_artifact_offers_its_drafts_lookup_hybrids_and_none(llama_pair: TinyPair) -> None:
    manifest = Manifest.read(llama_pair.artifact)
    assert registry.drafter_names(manifest) == [
        "mixed",
        "other",
        "self",
        "ngram",
        "suffix",
        "ngram+mixed",
        "ngram+other",
        "ngram+self",
        "suffix+mixed",
        "suffix+other",
        "suffix+self",
        "none",
    ]
    kinds = {d.name: registry.kind_of_spec(manifest, d).name for d in manifest.drafts}
    assert kinds == {"mixed": "model", "other": "model", "self": "self"}
    assert registry.benchmark_drafters(manifest) == ["mixed", "other", "ngram", "suffix"]
    assert registry.default_drafter(manifest) == "mixed"


class RepeatDrafter:
    """Proposes the last token again, k times: a drafter in a dozen lines."""

    name = "repeat"

    def start(self, prompt: np.ndarray, request: DraftRequest) -> None:
        pass

    def source(self, context: np.ndarray) -> str:
        return LOOKUP if context.size else NONE

    def propose(self, context: np.ndarray, k: int, plan: DraftPlan | None = None) -> Proposal:
        return Proposal(np.full(k, context[-1], dtype=np.int64) if k > 0 else EMPTY)

    def commit(self, num_accepted: int) -> None:
        pass


def test_a_new_drafter_is_one_module_plus_one_registry_entry(
    llama_pair: TinyPair, monkeypatch: pytest.MonkeyPatch
) -> None:
    kind = registry.DrafterKind(
        "repeat",
        "the last token again",
        registry.EXPORT_NOTHING,
        lambda name, resources: RepeatDrafter(),
        keyword="repeat",
    )
    monkeypatch.setitem(registry.KINDS, "repeat", kind)
    pipe = Pipeline.load(llama_pair.artifact)
    assert "repeat" in pipe.drafter_names
    prompt = np.array([7, 7, 7, 7, 7, 7], dtype=np.int64)
    want = pipe.generate(prompt, max_new_tokens=30, k=0).token_ids
    result = pipe.generate(prompt, max_new_tokens=30, k=3, drafter="repeat")
    assert result.token_ids == want and result.stats.proposed > 0
    from specx.exporter.drafts import resolve_drafts

    entry = resolve_drafts(["repeat"], str(llama_pair.sources["target"]))[0]
    assert (entry.name, entry.kind.name) == ("repeat", "repeat")  # the exporter knows it too


def test_export_entries_resolve_names_keywords_and_hybrids(llama_pair: TinyPair) -> None:
    from specx.exporter.drafts import default_drafter, resolve_drafts
    from specx.runtime.errors import ExportError

    target = str(llama_pair.sources["target"])
    other = str(llama_pair.sources["other"])
    given = ["ngram+int8", "int4", f"small={other}", other, target, "ngram"]
    entries = resolve_drafts(given, target)
    assert [(e.name, e.kind.name, e.hybrid) for e in entries] == [
        ("int8", "int8", True),
        ("int4", "int4", False),
        ("small", "model", False),
        ("draft4", "model", False),
        ("self", "self", False),
        ("ngram", "ngram", False),
    ]
    assert default_drafter(entries) == "ngram+int8"
    for bad, message in (
        (["none=" + other], "reserved"),
        (["int8=" + other], "reserved"),
        (["x=ngram"], "always named 'ngram'"),
        (["ngram+ngram"], "in front of a draft model"),
        ([f"a={other}", f"a={other}"], "two drafts are named"),
    ):
        with pytest.raises(ExportError, match=message):
            resolve_drafts(bad, target)
