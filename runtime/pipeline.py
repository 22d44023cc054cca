"""The embedding API: ``Pipeline.load(folder).generate(prompt)``, or ``.stream(prompt)``.

A pipeline loads each graph once. Every generation borrows a workspace (the target's binding,
its KV cache, a drafter with its own cache) from a pool and gives it back at the end, so one
pipeline can be shared by threads: concurrent generations run on separate workspaces, and
repeated generations reuse the same buffers instead of allocating new ones. A workspace's caches
keep what they hold after a generation: the next one takes the workspace whose cache shares the
longest prefix with its prompt and reads only the rest (runtime/prefix).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from specx.runtime.artifact.contract import TOKENIZER_FILE, Manifest, ModelSpec
from specx.runtime.backends import GraphSession, choose_providers, open_graph
from specx.runtime.backends.base import BatchedGraph
from specx.runtime.backends.providers import check_threads
from specx.runtime.batch.decoder import BatchDecoder
from specx.runtime.batch.scheduler import BatchScheduler, Submission
from specx.runtime.batch.widths import WidthPlanner
from specx.runtime.constraint import Constraint, Grammar, GrammarTokenizer
from specx.runtime.decode import choice, sequence
from specx.runtime.decode.adaptive import AdaptiveK
from specx.runtime.decode.choice import LearnedPolicies
from specx.runtime.decode.loop import decode_loop
from specx.runtime.decode.policy import KPolicy
from specx.runtime.decode.sequence import Emit
from specx.runtime.decode.stats import Stats
from specx.runtime.drafters import registry
from specx.runtime.drafters.base import Drafter, reads_prompt_features
from specx.runtime.drafters.suffix import SuffixHistory
from specx.runtime.errors import ArtifactError, InputError, concerning
from specx.runtime.grammar_limits import DEFAULT_LIMITS, GrammarLimits
from specx.runtime.kv_cache import KVCache
from specx.runtime.prefix.cache import PrefixCache, PrefixConfig
from specx.runtime.result import Generation, GenerationResult
from specx.runtime.settings import MAX_K, GenerationSettings
from specx.runtime.tokenizer import TextCodec
from specx.runtime.workspaces import Workspace, WorkspacePool

Prompt = str | Sequence[int] | np.ndarray


class Pipeline:
    def __init__(
        self,
        folder: Path,
        manifest: Manifest,
        codec: TextCodec,
        providers: Sequence[str] | None,
        threads: int | None,
        prefix: PrefixConfig | None = None,
    ) -> None:
        check_threads(threads)
        self.folder = folder
        self.manifest = manifest
        self.codec = codec
        self.providers = choose_providers(providers, manifest)
        self.threads = threads
        self._alternating = any(d.graph != manifest.target.graph for d in manifest.drafts)
        self.target = self._open(manifest.target)
        self._drafts: dict[str, GraphSession] = {}
        self.workspaces = WorkspacePool(self._new_workspace)  # generations alone run on these
        self._lock = threading.Lock()
        self._learned = LearnedPolicies()  # -k auto: what each drafter's runs taught
        self._free_drafters: dict[str, list[Drafter | None]] = {}  # for batched generations
        self._scheduler: BatchScheduler | None = None
        self.batch_pass_costs = WidthPlanner()  # what batched passes cost, measured as they run
        self._grammar_tokenizer: GrammarTokenizer | None = None
        # what a grammar may cost the matcher (grammar_limits.py); a server may raise them
        self.grammar_limits: GrammarLimits = DEFAULT_LIMITS
        self.prefixes = PrefixCache(prefix or PrefixConfig())  # prompts kept between generations
        self.history = SuffixHistory()  # earlier generations' outputs, for suffix drafting

    @classmethod
    def load(
        cls,
        folder: str | Path,
        providers: Sequence[str] | None = None,
        threads: int | None = None,
        prefix: PrefixConfig | None = None,
    ) -> Pipeline:
        """Open an artifact written by `specx export`: manifest, graphs, tokenizer.json.
        prefix: how prompts are kept between generations (default: reused, with a host store
        of DEFAULT_STORE_MB)."""
        path = Path(folder)
        manifest = Manifest.read(path)
        codec = TextCodec(
            path / manifest.tokenizer, manifest.special_tokens, manifest.chat_template
        )
        default = manifest.default_drafter
        if default is not None and default not in registry.drafter_names(manifest):
            raise ArtifactError(
                f"the manifest's default_drafter {default!r} is not a drafter of this artifact "
                f"({', '.join(registry.drafter_names(manifest))})",
                "re-export the artifact with `specx export`",
            )
        if manifest.tokenizer_vocab_size and codec.vocab_size != manifest.tokenizer_vocab_size:
            raise ArtifactError(
                f"{TOKENIZER_FILE} has {codec.vocab_size} tokens, the manifest says "
                f"{manifest.tokenizer_vocab_size}",
                "the tokenizer comes from another export; re-export the artifact",
            )
        return cls(path, manifest, codec, providers, threads, prefix)

    def _open(self, spec: ModelSpec) -> GraphSession:
        return open_graph(
            self.folder, self.manifest, spec, self.providers, self.threads, self._alternating
        )

    # -- drafters -------------------------------------------------------------------------
    @property
    def drafter_names(self) -> list[str]:
        return registry.drafter_names(self.manifest)

    @property
    def default_drafter(self) -> str:
        return registry.default_drafter(self.manifest)

    def draft_session(self, spec: ModelSpec) -> GraphSession:
        """The loaded graph of a draft model (opened on first use; the target's own graph when
        the target drafts for itself). Generations use forks of it."""
        if spec.graph == self.manifest.target.graph:
            return self.target
        with self._lock:
            if spec.graph not in self._drafts:
                self._drafts[spec.graph] = self._open(spec)
            return self._drafts[spec.graph]

    def new_drafter(self, drafter_name: str) -> Drafter | None:
        """A drafter of its own (with its own cache) for one generation at a time."""
        resources = registry.DraftResources(
            self.manifest,
            lambda spec: self.draft_session(spec).fork(),
            self.manifest.max_length,
            self.history,
        )
        return registry.build_drafter(drafter_name, resources)

    def take_drafter(self, drafter_name: str) -> Drafter | None:
        """A drafter from the pool kept for batched generations (give it back when done)."""
        with self._lock:
            free = self._free_drafters.setdefault(drafter_name, [])
            if free:
                return free.pop()
        return self.new_drafter(drafter_name)

    def give_drafter(self, drafter_name: str, drafter: Drafter | None) -> None:
        with self._lock:
            self._free_drafters[drafter_name].append(drafter)

    def enable_batching(self, max_batch: int = 4, context: int | None = None) -> None:
        """From now on, generations of any thread share target passes: up to `max_batch`
        sequences per pass, each in a batch row of `context` positions (default: the artifact's
        context, at most 1024; attention reads whole rows, so smaller rows are faster). A
        generation too long for a row runs alone, as before. Needs a batched graph."""
        if not 1 <= max_batch <= 256:
            raise InputError(f"max_batch must be in 1..256, got {max_batch}")
        session = self.batched_session()
        limit = min(self.manifest.max_length, session.spec.max_length)
        context = context if context is not None else min(limit, 1024)
        if not 2 <= context <= limit:
            raise InputError(
                f"the batch context must be in 2..{limit} positions, got {context}",
                "pass a smaller context",
            )
        self.disable_batching()
        decoder = BatchDecoder(
            session.fork(),
            max_batch,
            context,
            self.single_graph(),
            self.batch_pass_costs,
            self.prefixes,
        )
        self._scheduler = BatchScheduler(decoder)

    def disable_batching(self) -> None:
        """Stop the batch scheduler (running batched generations end with an error)."""
        if self._scheduler is not None:
            self._scheduler.stop()
            self._scheduler = None

    @property
    def batching(self) -> BatchScheduler | None:
        return self._scheduler

    def _new_workspace(self, drafter_name: str) -> Workspace:
        target = self.target.fork()
        cache = target.new_cache(self.manifest.max_length)
        return Workspace(drafter_name, target, cache, self.new_drafter(drafter_name))

    def idle_workspaces(self, drafter: str) -> int:
        """Workspaces of a drafter waiting in the pool (each holds its caches)."""
        return len(self.workspaces.idle(drafter))

    def remember_policy(self, drafter: str, policy: KPolicy, batched: bool = False) -> None:
        """Keep what a -k auto generation learned, for the next ones with this drafter (batched
        generations apart: their costs are the batch's, choice.policy_memory)."""
        self._learned.remember(drafter, policy, batched)

    def forget_policies(self) -> None:
        """Drop what -k auto has learned (the next generations start from nothing, as in a new
        process: specx bench's sessions start so)."""
        self._learned.forget()

    def learned_policy(self, drafter: str) -> AdaptiveK | None:
        """What -k auto has learned with a drafter so far (later requests start from it)."""
        return self._learned.learned(drafter)

    # -- generation -----------------------------------------------------------------------
    def grammar_tokenizer(self) -> GrammarTokenizer:
        """llguidance's view of the tokenizer (built on first use; InputError without it)."""
        with self._lock:
            if self._grammar_tokenizer is None:
                path = self.folder / self.manifest.tokenizer
                self._grammar_tokenizer = GrammarTokenizer(
                    path.read_text(encoding="utf-8"),
                    self.manifest.target.vocab_size,
                    self.manifest.special_tokens.eos_token_ids,
                )
            return self._grammar_tokenizer

    def constraint(self, grammar: Grammar) -> Constraint:
        """A fresh matcher of `grammar` over this artifact's tokenizer (InputError if the grammar
        is invalid)."""
        with concerning("grammar"):
            return self.grammar_tokenizer().constraint(grammar, self.grammar_limits)

    def token_bytes(self, ids: Sequence[int]) -> dict[int, bytes]:
        """Each token's own bytes (a byte-level token may hold part of a character)."""
        try:
            native = self.grammar_tokenizer().native
        except InputError:  # no llguidance: the decoded text, whole characters only
            return {int(t): self.codec.decode([t]).encode("utf-8") for t in set(ids)}
        return {int(t): bytes(native.decode_bytes([int(t)])) for t in set(ids)}

    def encode_prompt(
        self, prompt: Prompt, chat: bool = False, system: str | None = None
    ) -> np.ndarray:
        """The prompt's token ids (a chat prompt through the model's template), checked against
        the context and the vocabulary."""
        with concerning("prompt"):
            return self._encode_prompt(prompt, chat, system)

    def _encode_prompt(self, prompt: Prompt, chat: bool, system: str | None) -> np.ndarray:
        if isinstance(prompt, str):
            if not prompt.strip():
                raise InputError("the prompt is empty", "pass some text with --prompt")
            try:
                prompt.encode("utf-8")
            except UnicodeEncodeError as e:  # lone surrogates: bytes that were not UTF-8
                raise InputError(
                    f"the prompt is not valid UTF-8 text (character {e.start})",
                    "pass the prompt as UTF-8 text",
                ) from e
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

    def resolve_policy(
        self, settings: GenerationSettings, batched: bool = False
    ) -> tuple[KPolicy, int, str]:
        """(K policy, K to report, drafter name) for these settings on this artifact."""
        return choice.resolve_policy(self.manifest, settings, self._learned, batched)

    def validate(self, settings: GenerationSettings) -> None:
        """Raise the InputError that `stream` would raise for these settings on this artifact
        (drafter, K against the profile, the grammar), without starting anything."""
        self.resolve_policy(settings)
        if settings.grammar is not None:
            self.constraint(settings.grammar)

    def stream(
        self, prompt: Prompt, settings: GenerationSettings | None = None, **options: Any
    ) -> Generation:
        """Start a generation; iterate the returned object for text as it is accepted.

        `settings` (a GenerationSettings) and/or keyword options: any of its fields (k,
        max_new_tokens, drafter, max_k, draft_p_min, sampling, chat, system) or a sampling
        field as a shortcut (temperature, top_k, top_p, min_p, seed, verification).
        k: draft tokens per step, 0 for the target alone, or "auto" (chosen per step, up to
        max_k); temperature 0 (the default) is greedy.
        """
        settings = GenerationSettings.of(settings, **options)
        ids, constraint = self.prepare(prompt, settings)
        scheduler = self._scheduler
        batched = scheduler is not None and scheduler.fits(
            int(ids.shape[0]), settings.max_new_tokens, MAX_K
        )
        seq, result, name = self.new_sequence(ids, settings, constraint, batched)
        if scheduler is not None and batched:
            tokens = self._submit(scheduler, seq, name)
        else:
            tokens = self._solo(seq, name)
        return Generation(self._text(tokens, seq, name, batched, result), result)

    def prepare(
        self, prompt: Prompt, settings: GenerationSettings
    ) -> tuple[np.ndarray, Constraint | None]:
        """Check a generation's drafter and K (before its prompt), compile its grammar and encode
        its prompt: (prompt ids, the grammar's fresh matcher or None)."""
        self.resolve_policy(settings)
        constraint = None if settings.grammar is None else self.constraint(settings.grammar)
        return self.encode_prompt(prompt, settings.chat, settings.system), constraint

    def new_sequence(
        self,
        prompt_ids: np.ndarray,
        settings: GenerationSettings,
        constraint: Constraint | None = None,
        batched: bool = False,
        emit: Emit | None = None,
    ) -> tuple[sequence.Sequence, GenerationResult, str]:
        """A generation's sequence (its drafter is given when it starts), the result it fills
        and its drafter's name. batched: it runs as a batch row (-k auto starts from what
        batches taught it)."""
        policy, k_shown, name = self.resolve_policy(settings, batched)
        stats = Stats(k=k_shown, drafter=name, adaptive=isinstance(policy, AdaptiveK))
        result = GenerationResult("", [], prompt_ids.tolist(), stats, finished=False)
        if settings.logprobs is not None:
            result.logprobs = []
        seq = sequence.Sequence(
            prompt_ids,
            settings,
            policy,
            None,
            stats,
            self.manifest.target.vocab_size,
            frozenset(self.manifest.special_tokens.eos_token_ids),
            constraint,
            result.logprobs,
            emit,
            self.prefixes if self.prefixes.enabled else None,
        )
        return seq, result, name

    def _solo(self, seq: sequence.Sequence, drafter_name: str) -> Iterator[np.ndarray]:
        """The generation alone, on a workspace of its own."""
        workspace = self.workspaces.acquire(drafter_name, seq.prompt, seq.settings.cache_scope)
        seq.drafter = workspace.drafter
        try:
            yield from decode_loop(workspace.target, workspace.cache, seq, self._resume)
        finally:
            self.workspaces.release(workspace)

    def _resume(self, cache: KVCache, seq: sequence.Sequence) -> None:
        """Keep the prefix of the sequence's prompt the target's cache holds (decode_loop)."""
        refuse = ""
        if reads_prompt_features(seq.drafter):
            refuse = "the feature draft reads the target's features of every prompt position"
        done = self.prefixes.resume(
            cache, 0, self.manifest.target.graph, seq.prompt[:-1], seq.settings.cache_scope, refuse
        )
        seq.stats.reused_prompt_tokens = done.tokens
        seq.stats.prompt_cache, seq.stats.prompt_cache_note = done.source, done.note

    def _submit(
        self, scheduler: BatchScheduler, seq: sequence.Sequence, drafter_name: str
    ) -> Iterator[np.ndarray]:
        """The generation as a row of the shared batch (enable_batching)."""
        drafter = seq.drafter = self.take_drafter(drafter_name)
        submission = Submission(seq, release=lambda: self.give_drafter(drafter_name, drafter))
        yield from scheduler.submit(submission).tokens()

    def _text(
        self,
        tokens: Iterator[np.ndarray],
        seq: sequence.Sequence,
        drafter_name: str,
        batched: bool,
        result: GenerationResult,
    ) -> Iterator[str]:
        decoder = self.codec.stream_decoder()
        try:
            for step in tokens:
                result.token_ids.extend(step.tolist())
                delta = decoder.push(step.tolist())
                result.text += delta
                if delta:
                    yield delta
            tail = decoder.flush()
            result.text += tail
            result.finished = True
            if tail:
                yield tail
        finally:
            tokens.close()  # type: ignore[attr-defined]  # a generator: frees its workspace
            if not result.finished:
                result.text += decoder.flush()
                result.stats.stop_reason = result.stats.stop_reason or "interrupted"
            self.remember_policy(drafter_name, seq.policy, batched)

    def generate(
        self, prompt: Prompt, settings: GenerationSettings | None = None, **options: Any
    ) -> GenerationResult:
        """Generate to completion; returns text, token ids and stats."""
        generation = self.stream(prompt, settings, **options)
        for _ in generation:
            pass
        return generation.result

    # -- batched generation -----------------------------------------------------------------
    def batched_session(self) -> BatchedGraph:
        """The target's batched graph (several sequences per pass), opened on first use."""
        spec = self.manifest.batched
        if spec is None:
            raise InputError(
                "this artifact has no batched graph",
                "re-export it with `specx export --batched`",
            )
        with self._lock:
            if spec.graph not in self._drafts:
                self._drafts[spec.graph] = self._open(spec)
            session = self._drafts[spec.graph]
        graph = session.batched()
        if graph is None:
            raise InputError(
                f"the {type(session).__name__} backend runs no batched passes",
                "batch with ONNX Runtime (--provider cpu or cuda)",
            )
        return graph

    def single_graph(self) -> BatchedGraph | None:
        """A fork of the target's own graph for the batch passes it can take (gqa graphs)."""
        graph = self.target.batched()
        return graph.fork() if graph is not None and graph.spec.attention == "gqa" else None

    def generate_batch(
        self,
        prompts: Sequence[Prompt],
        settings: GenerationSettings | Sequence[GenerationSettings] | None = None,
        max_batch: int = 8,
        on_tokens: Callable[[int, np.ndarray], None] | None = None,
        **options: Any,
    ) -> list[GenerationResult]:
        """Generate for several prompts at once: up to `max_batch` sequences share each target
        pass (continuous batching: a finished sequence's row goes to the next prompt at once).
        `settings` is one GenerationSettings for all prompts or one per prompt; each sequence's
        output is what `generate` gives it alone. `on_tokens(i, ids)` is called with prompt i's
        tokens as each step commits them (streaming)."""
        from specx.runtime.batch.run import run_batch

        if isinstance(settings, Sequence):
            if len(settings) != len(prompts):
                raise InputError(f"{len(settings)} settings for {len(prompts)} prompts")
            per_prompt = [GenerationSettings.of(s, **options) for s in settings]
        else:
            per_prompt = [GenerationSettings.of(settings, **options)] * len(prompts)
        return run_batch(self, prompts, per_prompt, max_batch, on_tokens)
