"""The embedding API: ``Pipeline.load(folder).generate(prompt)``, or ``.stream(prompt)``.

A pipeline loads each graph once. Every generation borrows a workspace (the target's binding,
its KV cache, a drafter with its own cache) from a pool and gives it back at the end, so one
pipeline can be shared by threads: concurrent generations run on separate workspaces, and
repeated generations reuse the same buffers instead of allocating new ones.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from specx.runtime.adaptive import AdaptiveK
from specx.runtime.contract import PAIR_ID_KEY, TOKENIZER_FILE, Manifest, ModelSpec
from specx.runtime.drafters import Drafter, HybridDrafter, ModelDrafter, NgramDrafter
from specx.runtime.errors import ArtifactError, InputError
from specx.runtime.generate import KPolicy, decode_loop
from specx.runtime.kv_cache import KVCache
from specx.runtime.sampling import SamplingParams
from specx.runtime.session import ModelSession
from specx.runtime.stats import Stats
from specx.runtime.tokenizer import TextCodec

MAX_K = 16


def _usable(provider: str, manifest: Manifest) -> bool:
    if provider == "cpu":
        return True
    if provider == "tensorrt":
        import importlib.util

        return bool(manifest.engines) and importlib.util.find_spec("tensorrt") is not None
    import onnxruntime as ort

    return "CUDAExecutionProvider" in ort.get_available_providers()


def choose_providers(requested: Sequence[str] | None, manifest: Manifest) -> list[str]:
    """The command line's providers as given (errors name what is missing); otherwise the
    profile's, in its order, keeping those usable here, with cpu last as the fallback."""
    if requested:
        return [p.lower() for p in requested]
    wanted = list((manifest.profile or {}).get("providers", ["cpu"]))
    usable = [p for p in wanted if _usable(p, manifest)]
    return usable if "cpu" in usable else [*usable, "cpu"]


DEFAULT_K = 4


@dataclass
class GenerationResult:
    text: str
    token_ids: list[int]
    prompt_token_ids: list[int]
    stats: Stats
    finished: bool = True  # False when the consumer stopped early (e.g. Ctrl-C)

    def to_json(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "token_ids": self.token_ids,
            "prompt_tokens": len(self.prompt_token_ids),
            "finished": self.finished,
            "stats": self.stats.to_json(),
        }


@dataclass
class _Workspace:
    drafter_name: str
    target: ModelSession
    cache: KVCache
    drafter: Drafter | None


@dataclass
class Generation:
    """An iterator of text deltas; ``result`` is complete once iteration ends (or stops)."""

    _iterator: Iterator[str]
    result: GenerationResult

    def __iter__(self) -> Iterator[str]:
        return self._iterator

    def __next__(self) -> str:
        return next(self._iterator)

    def close(self) -> None:
        self._iterator.close()  # type: ignore[attr-defined]


class Pipeline:
    def __init__(
        self,
        folder: Path,
        manifest: Manifest,
        codec: TextCodec,
        providers: Sequence[str] | None,
        threads: int | None,
    ) -> None:
        self.folder = folder
        self.manifest = manifest
        self.codec = codec
        self.providers = choose_providers(providers, manifest)
        self.threads = threads
        self._alternating = any(d.graph != manifest.target.graph for d in manifest.drafts)
        self.target = self._open_graph(manifest.target)
        self._drafts: dict[str, ModelSession] = {}
        self._pool: dict[str, list[_Workspace]] = {}
        self._lock = threading.Lock()
        self._learned: dict[str, AdaptiveK] = {}  # -k auto: what each drafter's runs taught

    @classmethod
    def load(
        cls,
        folder: str | Path,
        providers: Sequence[str] | None = None,
        threads: int | None = None,
    ) -> Pipeline:
        """Open an artifact written by `specx export`: manifest, graphs, tokenizer.json."""
        path = Path(folder)
        manifest = Manifest.read(path)
        codec = TextCodec(
            path / manifest.tokenizer, manifest.special_tokens, manifest.chat_template
        )
        if manifest.tokenizer_vocab_size and codec.vocab_size != manifest.tokenizer_vocab_size:
            raise ArtifactError(
                f"{TOKENIZER_FILE} has {codec.vocab_size} tokens, the manifest says "
                f"{manifest.tokenizer_vocab_size}",
                "the tokenizer comes from another export; re-export the artifact",
            )
        return cls(path, manifest, codec, providers, threads)

    def _open_graph(self, spec: ModelSpec) -> Any:
        if self.providers[0] == "tensorrt":
            entry = next((e for e in self.manifest.engines if e["graph"] == spec.graph), None)
            if entry is None:
                raise ArtifactError(
                    f"this artifact has no TensorRT engine for {spec.graph}",
                    "build them (specx build ARTIFACT --profile NAME) or use --provider cuda/cpu",
                )
            from specx.runtime.trt_backend import TensorRTSession

            return TensorRTSession(self.folder, spec, entry)
        session = ModelSession(
            self.folder / spec.graph,
            spec,
            self.providers,
            self.threads,
            alternating=self._alternating,
        )
        pair_id = session.metadata().get(PAIR_ID_KEY)
        if pair_id != self.manifest.pair_id:
            raise ArtifactError(
                f"{spec.graph} belongs to export {pair_id!r}, the manifest to "
                f"{self.manifest.pair_id!r}: graphs from different exports are mixed",
                "use the folder of one `specx export` run as it was written",
            )
        return session

    # -- drafters -------------------------------------------------------------------------
    @property
    def drafter_names(self) -> list[str]:
        """Model drafts of the artifact, n-gram lookup (always there), each model draft behind a
        lookup (ngram+NAME), then none."""
        models = [d.name for d in self.manifest.drafts]
        return [*models, "ngram", *(f"ngram+{m}" for m in models), "none"]

    @property
    def default_drafter(self) -> str:
        if self.manifest.default_drafter:
            return self.manifest.default_drafter
        return self.manifest.drafts[0].name if self.manifest.drafts else "none"

    def _draft_session(self, spec: ModelSpec) -> ModelSession:
        if spec.graph == self.manifest.target.graph:
            return self.target  # the target drafting for itself shares its loaded graph
        if spec.graph not in self._drafts:
            self._drafts[spec.graph] = self._open_graph(spec)
        return self._drafts[spec.graph]

    def _new_workspace(self, drafter_name: str) -> _Workspace:
        target = self.target.fork()
        cache = target.new_cache(self.manifest.max_length)
        drafter: Drafter | None = None
        eos = self.manifest.special_tokens.eos_token_ids
        if drafter_name == "ngram":
            drafter = NgramDrafter(eos_token_ids=eos)
        elif drafter_name.startswith("ngram+"):
            model = self._model_drafter(drafter_name.removeprefix("ngram+"))
            drafter = HybridDrafter(NgramDrafter(eos_token_ids=eos), model)
        elif drafter_name != "none":
            drafter = self._model_drafter(drafter_name)
        return _Workspace(drafter_name, target, cache, drafter)

    def _model_drafter(self, drafter_name: str) -> ModelDrafter:
        spec = self.manifest.find_draft(drafter_name)
        return ModelDrafter(
            self._draft_session(spec).fork(),
            self.manifest.max_length,
            self.manifest.target.vocab_size,
            self.manifest.special_tokens.eos_token_ids,
            name=drafter_name,
        )

    def _acquire(self, drafter_name: str) -> _Workspace:
        with self._lock:
            free = self._pool.setdefault(drafter_name, [])
            if free:
                return free.pop()
            return self._new_workspace(drafter_name)

    def _release(self, workspace: _Workspace) -> None:
        with self._lock:
            self._pool[workspace.drafter_name].append(workspace)

    # -- generation -----------------------------------------------------------------------
    def encode_prompt(
        self,
        prompt: str | Sequence[int] | np.ndarray,
        chat: bool = False,
        system: str | None = None,
    ) -> np.ndarray:
        if isinstance(prompt, str):
            if not prompt.strip():
                raise InputError("the prompt is empty", "pass some text with --prompt")
            ids = self.codec.encode_chat(prompt, system) if chat else self.codec.encode(prompt)
        else:
            ids = np.asarray(prompt, dtype=np.int64).reshape(-1)
        if ids.shape[0] == 0:
            raise InputError("the prompt encodes to no tokens", "pass some text")
        limit = self.manifest.max_length
        if ids.shape[0] > limit:
            raise InputError(
                f"the prompt has {ids.shape[0]} tokens; this artifact's maximum context is {limit}",
                "shorten the prompt, or re-export with a larger --max-length",
            )
        vocab = self.manifest.target.vocab_size
        if int(ids.min()) < 0 or int(ids.max()) >= vocab:
            raise InputError(f"prompt token ids must lie in [0, {vocab})")
        return ids

    def _resolve(
        self, k: int | str | None, drafter: str | None, max_k: int
    ) -> tuple[KPolicy, int, str]:
        """(K policy, K to report, drafter name) from the user's choices."""
        name = drafter or self.default_drafter
        if name not in self.drafter_names:
            raise InputError(
                f"unknown drafter {name!r}", f"choose one of: {', '.join(self.drafter_names)}"
            )
        if not 1 <= max_k <= MAX_K:
            raise InputError(f"max K must be in 1..{MAX_K}, got {max_k}")
        profile = self.manifest.profile or {}
        limit = int(profile.get("k_max", MAX_K))
        if k is None:
            k = 0 if name == "none" else int(profile.get("k_default", DEFAULT_K))
        if k == "auto":
            if name == "none":
                raise InputError("-k auto needs a drafter", "pass --draft NAME (or ngram)")
            max_k = min(max_k, limit)
            policy = AdaptiveK(max_k=max_k)
            with self._lock:
                previous = self._learned.get(name)
            if previous is not None:
                policy.inherit(previous)
            return policy, max_k, name
        if isinstance(k, str):
            try:
                k = int(k)
            except ValueError as e:
                raise InputError(f"K must be a number or 'auto', got {k!r}") from e
        if not 0 <= k <= MAX_K:
            raise InputError(f"K must be in 0..{MAX_K}, got {k}", "e.g. -k 4, or -k 0 for none")
        if k > limit:
            raise InputError(
                f"K={k} exceeds the profile's k_max {limit} (its engines verify at most "
                f"{limit + 1} tokens per pass)",
                f"use -k {limit} or less, or re-export with a profile allowing more",
            )
        if k == 0:
            name = "none"
        elif name == "none":
            raise InputError(
                f"K={k} needs a drafter, and this artifact has no draft model",
                "use -k 0 (target alone), --draft ngram, or export with --draft",
            )
        return KPolicy(k), k, name

    def stream(
        self,
        prompt: str | Sequence[int] | np.ndarray,
        *,
        max_new_tokens: int = 128,
        k: int | str | None = None,
        drafter: str | None = None,
        max_k: int = 8,
        draft_p_min: float = 0.0,
        sampling: SamplingParams | None = None,
        chat: bool = False,
        system: str | None = None,
        temperature: float | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        min_p: float | None = None,
        seed: int | None = None,
    ) -> Generation:
        """Start a generation; iterate the returned object for text as it is accepted.

        k: draft tokens per step, 0 for the target alone, or "auto" (chosen per step, up to
        max_k). draft_p_min: a model draft stops proposing when its top probability falls below.
        Sampling is set either with `sampling=SamplingParams(...)` or with the keyword shortcuts
        (temperature, top_k, top_p, min_p, seed); temperature 0 (the default) is greedy.
        """
        if max_new_tokens < 1:
            raise InputError(f"max-new-tokens must be >= 1, got {max_new_tokens}")
        if not 0.0 <= draft_p_min < 1.0:
            raise InputError(f"draft-p-min must be in [0, 1), got {draft_p_min}")
        policy, k_shown, drafter_name = self._resolve(k, drafter, max_k)
        shortcuts = {
            "temperature": temperature,
            "top_k": top_k,
            "top_p": top_p,
            "min_p": min_p,
            "seed": seed,
        }
        given = {name: v for name, v in shortcuts.items() if v is not None}
        if sampling is not None and given:
            raise InputError("pass either sampling=SamplingParams(...) or the keyword shortcuts")
        sampling = sampling or SamplingParams(**given)  # type: ignore[arg-type]
        prompt_ids = self.encode_prompt(prompt, chat, system)
        stats = Stats(k=k_shown, drafter=drafter_name, adaptive=isinstance(policy, AdaptiveK))
        result = GenerationResult("", [], prompt_ids.tolist(), stats, finished=False)
        return Generation(
            self._run(
                prompt_ids, max_new_tokens, policy, drafter_name, draft_p_min, sampling, result
            ),
            result,
        )

    def _run(
        self,
        prompt_ids: np.ndarray,
        max_new_tokens: int,
        policy: KPolicy,
        drafter_name: str,
        draft_p_min: float,
        sampling: SamplingParams,
        result: GenerationResult,
    ) -> Iterator[str]:
        workspace = self._acquire(drafter_name)
        if isinstance(workspace.drafter, ModelDrafter):
            workspace.drafter.min_confidence = draft_p_min
        elif isinstance(workspace.drafter, HybridDrafter):
            workspace.drafter.model.min_confidence = draft_p_min
        decoder = self.codec.stream_decoder()
        try:
            for tokens in decode_loop(
                workspace.target,
                workspace.cache,
                workspace.drafter,
                prompt_ids,
                max_new_tokens,
                policy,
                sampling,
                self.manifest.special_tokens.eos_token_ids,
                result.stats,
            ):
                result.token_ids.extend(tokens.tolist())
                delta = decoder.push(tokens.tolist())
                result.text += delta
                if delta:
                    yield delta
            tail = decoder.flush()
            result.text += tail
            result.finished = True
            if tail:
                yield tail
        finally:
            if not result.finished:
                result.text += decoder.flush()
                result.stats.stop_reason = result.stats.stop_reason or "interrupted"
            if isinstance(policy, AdaptiveK) and policy.history:
                with self._lock:
                    self._learned[drafter_name] = policy
            self._release(workspace)

    def generate(
        self,
        prompt: str | Sequence[int] | np.ndarray,
        **options: Any,
    ) -> GenerationResult:
        """Generate to completion; returns text, token ids and stats."""
        generation = self.stream(prompt, **options)
        for _ in generation:
            pass
        return generation.result
