"""A reference consumer of specx artifacts, written from docs/artifact-format.md alone.

It imports nothing from specx: numpy, onnxruntime and tokenizers only, as a service in another
language would use their equivalents. It runs the target alone, a model draft, a feature draft
(EAGLE-style head reading the target's features), n-gram lookup, suffix drafting over the
context and the hybrids, on gqa, plain and imported (concat, genai)
graphs, greedy or with drafter-invariant sampling, and reproduces
specx's token ids (tests/runtime/test_reference_consumer.py checks that on every graph variant).
When the format changes, this file and the document change in the same commit.

    python reference/consumer.py ARTIFACT --prompt TEXT [-n 64] [--draft NAME] [-k 4]
                                 [--temperature T --top-k K --top-p P --min-p M --seed S]
                                 [--op-library specx_kernels=PATH]

prints one JSON object: token_ids, text, and the speculative counts (steps, proposed, accepted).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

FORMAT_VERSION = 4  # the newest manifest this reader understands (2: feature drafts, 3: concat,
# 4: the logits count of exported gqa graphs)
PREFILL_CHUNK = 128  # prompt tokens per pass
NGRAM_MAX, NGRAM_MIN, LOOKAHEAD = 3, 1, 64  # the n-gram drafter's parameters
HYBRID_MIN_MATCH = 2  # a hybrid uses its lookup when the match continues for at least this many
NP = {"float32": np.float32, "float16": np.float16}
MIN_HOLES, ROOM = 32, 256  # a concat cache: holes kept before compacting; slots beyond capacity


# Where each op library a manifest may name is built (op_libraries: name -> shared library);
# specx_kernels, the ops of the "specx" domain, is named by SPECX_KERNELS_LIBRARY or --op-library.
OP_LIBRARIES: dict[str, str] = {}


def op_library(record: dict[str, Any]) -> str:
    """The shared library of a manifest's op_libraries entry, or an error that says what to do."""
    name = record["name"]
    path = OP_LIBRARIES.get(name) or (
        os.environ.get("SPECX_KERNELS_LIBRARY") if name == "specx_kernels" else None
    )
    if not path or not Path(path).is_file():
        raise SystemExit(
            f"the graph needs the op library {name} {record['version']} (domain "
            f"{record['domain']}): pass --op-library {name}=PATH to its build"
        )
    return path


class Model:
    """One graph, its preallocated cache and the cache length n (the only truth)."""

    def __init__(self, folder: Path, spec: dict[str, Any], capacity: int) -> None:
        self.spec = spec
        options = ort.SessionOptions()
        for library in spec.get("op_libraries", []):  # custom ops the graph needs
            options.register_custom_ops_library(op_library(library))
        self.session = ort.InferenceSession(
            str(folder / spec["graph"]), options, providers=["CPUExecutionProvider"]
        )
        self.inputs = {i.name for i in self.session.get_inputs()}
        self.ranks = {i.name: len(i.shape) for i in self.session.get_inputs()}
        # ids, positions and mask are int64, but where the manifest records int32 (imported)
        self.narrow = {t["name"] for t in spec["inputs"] if t["dtype"] == "int32"}
        self.genai = spec.get("attention", "plain") == "genai"  # imported: gqa, own names
        self.gqa = spec.get("attention", "plain") == "gqa" or self.genai
        self.concat = spec.get("attention", "plain") == "concat"  # imported: past + new out
        layers, heads, dim = spec["num_layers"], spec["kv_heads"], spec["head_dim"]
        shape = (1, heads, capacity, dim) if self.gqa else (1, capacity, heads, dim)
        self.dtype = NP[spec["dtype"]]
        self.keys = [np.zeros(shape, self.dtype) for _ in range(layers)]  # zeroed, never moved
        self.values = [np.zeros(shape, self.dtype) for _ in range(layers)]
        self.capacity = capacity
        self.vocab = spec["vocab_size"]
        self._n = 0
        if self.concat:  # the slots computed so far (holes too), each valid position's slot
            self.keys = [np.zeros((1, heads, 0, dim), self.dtype) for _ in range(layers)]
            self.values = [np.zeros((1, heads, 0, dim), self.dtype) for _ in range(layers)]
            self.mask: list[int] = []
            self.slot_of: list[int] = []
        outputs = {o["name"]: o for o in spec["outputs"]}
        # a target's features output / a feature head's hidden_out: [batch, seq, width]
        self.extra = {k: outputs[k]["shape"][2] for k in ("features", "hidden_out") if k in outputs}
        self.last: dict[str, np.ndarray] = {}  # those outputs of the last pass, [s, width]

    @property
    def n(self) -> int:
        return self._n

    @n.setter
    def n(self, value: int) -> None:
        if self.concat:  # rolled-back positions stay as holes, masked out
            for slot in self.slot_of[value : self._n]:
                self.mask[slot] = 0
            del self.slot_of[value:]
        self._n = value

    def index(self, name: str) -> type:
        """The type of an index input: int64, or int32 where the manifest says so."""
        return np.int32 if name in self.narrow else np.int64

    def concat_forward(self, tokens: list[int]) -> np.ndarray:
        """An imported graph's pass: past = the slots so far, present = past + new."""
        s, n = len(tokens), self.n
        if len(self.mask) - n > max(MIN_HOLES, n // 4) or len(self.mask) + s > self.capacity + ROOM:
            keep = np.array(self.slot_of, dtype=np.int64)  # compact: the valid slots, in order
            self.keys = [np.ascontiguousarray(k[:, :, keep]) for k in self.keys]
            self.values = [np.ascontiguousarray(v[:, :, keep]) for v in self.values]
            self.mask, self.slot_of = [1] * n, list(range(n))
        feed = {
            "input_ids": np.array([tokens], dtype=self.index("input_ids")),
            "attention_mask": np.array([self.mask + [1] * s], dtype=self.index("attention_mask")),
        }
        if "position_ids" in self.inputs:
            feed["position_ids"] = np.arange(n, n + s, dtype=self.index("position_ids"))[None]
        for name in ("num_logits_to_keep", "logits_to_keep"):  # every new position's logits
            if name in self.inputs:
                feed[name] = np.full([1] * self.ranks[name], s, dtype=np.int64)  # [] or [1]
        names = ["logits"]
        for i, (k, v) in enumerate(zip(self.keys, self.values, strict=True)):
            feed[f"past_key_values.{i}.key"], feed[f"past_key_values.{i}.value"] = k, v
            names += [f"present.{i}.key", f"present.{i}.value"]
        out = self.session.run(names, feed)
        self.keys, self.values = out[1::2], out[2::2]
        self.slot_of += range(len(self.mask), len(self.mask) + s)
        self.mask += [1] * s
        self._n = n + s
        return out[0][0].astype(np.float32)  # an fp16 graph's logits, exactly

    def forward(
        self,
        tokens: list[int],
        inputs: dict[str, np.ndarray] | None = None,
        only_last: bool = False,
    ) -> np.ndarray:
        """Score `tokens` at positions n .. n + s - 1; returns logits [s, vocab]; n += s.
        inputs: a feature head's features, hidden and from_target ([s, width] each); only_last:
        only the last row is read ([1, vocab]: a graph with `logits_to_keep` computes no other)."""
        if self.concat:
            return self.concat_forward(tokens)
        s, n = len(tokens), self.n
        assert s >= 1 and n + s <= self.capacity
        io = self.session.io_binding()
        io.bind_cpu_input("input_ids", np.array([tokens], dtype=self.index("input_ids")))
        rows = s
        if "logits_to_keep" in self.inputs:  # the last `rows` positions' logits
            rows = 1 if only_last else s
            keep = np.full([1] * self.ranks["logits_to_keep"], rows, dtype=np.int64)  # [] or [1]
            io.bind_cpu_input("logits_to_keep", keep)
        for name, value in (inputs or {}).items():
            io.bind_cpu_input(name, np.ascontiguousarray(value)[None])
        for name, width in self.extra.items():
            self.last[name] = np.empty((1, s, width), np.float32)
            buf = self.last[name]
            io.bind_output(name, "cpu", 0, np.float32, list(buf.shape), buf.ctypes.data)
        if "position_ids" in self.inputs:
            positions = np.arange(n, n + s, dtype=self.index("position_ids"))[None]
            io.bind_cpu_input("position_ids", positions)
        if self.genai:  # its op derives lengths and positions from an all-ones mask
            io.bind_cpu_input("attention_mask", np.ones((1, n + s), self.index("attention_mask")))
        elif self.gqa:
            io.bind_cpu_input("seqlens_k", np.array([n + s - 1], dtype=np.int32))
            io.bind_cpu_input("total_sequence_length", np.array(n + s, dtype=np.int32))
        item = np.dtype(self.dtype).itemsize
        heads, dim = self.spec["kv_heads"], self.spec["head_dim"]
        for i, (k, v) in enumerate(zip(self.keys, self.values, strict=True)):
            for kind, buf in (("key", k), ("value", v)):
                base = buf.ctypes.data
                if self.genai:  # as gqa, under the builder's names
                    past = f"past_key_values.{i}.{kind}"
                    io.bind_input(past, "cpu", 0, self.dtype, buf.shape, base)
                    io.bind_output(f"present.{i}.{kind}", "cpu", 0, self.dtype, buf.shape, base)
                elif self.gqa:  # past and present: the whole buffer, both ways
                    io.bind_input(f"past_{kind}.{i}", "cpu", 0, self.dtype, buf.shape, base)
                    io.bind_output(f"present_{kind}.{i}", "cpu", 0, self.dtype, buf.shape, base)
                else:  # past: the first n positions; new: the s slots right after them
                    past = [1, n, heads, dim]
                    io.bind_input(f"past_{kind}.{i}", "cpu", 0, self.dtype, past, base)
                    at = base + n * heads * dim * item
                    io.bind_output(f"new_{kind}.{i}", "cpu", 0, self.dtype, [1, s, heads, dim], at)
        logits = np.empty((1, rows, self.vocab), np.float32)  # bound by name: order is free
        io.bind_output("logits", "cpu", 0, np.float32, list(logits.shape), logits.ctypes.data)
        self.session.run_with_iobinding(io)
        self._n = n + s
        self.last = {k: v[0] for k, v in self.last.items()}
        return logits[0]

    def feed(self, tokens: list[int], features: np.ndarray | None = None) -> np.ndarray:
        """Any number of tokens, PREFILL_CHUNK at a time; the last logits row. features: the
        target records its features output into it ([capacity, F], at the positions fed)."""
        for start in range(0, len(tokens), PREFILL_CHUNK):
            at = self.n
            last = self.forward(tokens[start : start + PREFILL_CHUNK], only_last=True)[-1]
            if features is not None:
                features[at : self.n] = self.last["features"]
        return last


def head_pass(head: Model, tokens: list[int], features: np.ndarray | None, hidden: Any) -> Any:
    """A feature head's pass: each position reads the target's features (from_target) or the
    head's own previous hidden_out. Returns (logits [s, vocab], hidden_out [s, hidden])."""
    s = len(tokens)
    width = head.spec["head"]["feature_size"]
    size = head.spec["hidden_size"]
    logits = head.forward(
        tokens,
        {
            "features": features if features is not None else np.zeros((s, width), np.float32),
            "hidden": hidden if hidden is not None else np.zeros((s, size), np.float32),
            "from_target": np.full((s, 1), features is not None),
        },
    )
    return logits, head.last["hidden_out"]


def warp(logits: np.ndarray, s: dict[str, Any]) -> np.ndarray:
    """Temperature, top-k, top-p, min-p, in that order, in float64 (rows: [..., vocab])."""
    x = np.asarray(logits, np.float64)
    with np.errstate(over="ignore"):
        x = (x - x.max(-1, keepdims=True)) / s["temperature"]
    vocab = x.shape[-1]
    if 0 < s["top_k"] < vocab:
        kth = np.partition(x, vocab - s["top_k"], axis=-1)[..., vocab - s["top_k"], None]
        x = np.where(x < kth, -np.inf, x)
    p = np.exp(x - x.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    if s["top_p"] < 1.0:
        order = np.argsort(-p, axis=-1, kind="stable")
        sorted_p = np.take_along_axis(p, order, -1)
        keep_sorted = (np.cumsum(sorted_p, -1) - sorted_p) < s["top_p"]
        keep_sorted[..., 0] = True
        keep = np.zeros_like(keep_sorted)
        np.put_along_axis(keep, order, keep_sorted, -1)
        p = np.where(keep, p, 0.0)
        p /= p.sum(-1, keepdims=True)
    if s["min_p"] > 0.0:
        p = np.where(p >= s["min_p"] * p.max(-1, keepdims=True), p, 0.0)
        p /= p.sum(-1, keepdims=True)
    return p


MASK = (1 << 64) - 1


def mix(z: int) -> int:
    """SplitMix64's finalizer, mod 2^64 (the artifact format's counter-based generator)."""
    z &= MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def exponentials(seed: int, stream: int, position: int, count: int) -> np.ndarray:
    """E_i = -log1p(-u_i), u_i the top 53 bits of mix(key + (i + 1) * golden) over 2^53, with
    key = mix(mix(mix(seed) + stream) + position)."""
    key = mix(mix(mix(seed) + stream) + position)
    z = np.uint64(key) + np.arange(1, count + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = z ^ (z >> np.uint64(31))
    return -np.log1p(-((z >> np.uint64(11)).astype(np.float64) * 2.0**-53))


class Choice:
    """How a token is chosen at a position: the argmax (greedy), or the exponential race under
    the position's keyed draws: argmax p(x) / E_x, E ~ Exp(1) from the counter-based generator
    at (seed, stream 0, position) (drafter-invariant sampling)."""

    def __init__(self, sampling: dict[str, Any] | None, vocab: int) -> None:
        self.sampling, self.vocab = sampling, vocab
        self.seed = sampling["seed"] if sampling else 0
        self._draws: dict[int, np.ndarray] = {}

    def draws(self, position: int) -> np.ndarray:
        if position not in self._draws:
            self._draws[position] = exponentials(self.seed, 0, position, self.vocab)
        return self._draws[position]

    def __call__(self, logits_row: np.ndarray, position: int) -> int:
        if self.sampling is None:
            return int(np.argmax(logits_row))
        p = warp(logits_row, self.sampling)
        return int(np.argmax(p / self.draws(position)[: p.shape[-1]]))


def ngram_continuation(context: list[int], eos: set[int]) -> list[int]:
    """What followed the latest earlier occurrence of the longest suffix (NGRAM_MAX..NGRAM_MIN
    tokens) that occurred before; at most LOOKAHEAD tokens, cut after an EOS."""
    c = np.asarray(context)
    for n in range(min(NGRAM_MAX, len(c) - 1), NGRAM_MIN - 1, -1):
        windows = np.lib.stride_tricks.sliding_window_view(c[:-1], n)
        hits = np.flatnonzero(np.all(windows == c[-n:], axis=1))
        if hits.size:
            found = c[int(hits[-1]) + n :][:LOOKAHEAD].tolist()
            stops = [i for i, t in enumerate(found) if t in eos]
            return found[: stops[0] + 1] if stops else found
    return []


SUFFIX_DEPTH, SUFFIX_OCCURRENCES, SUFFIX_MIN_P = 64, 256, 0.1


def suffix_match(context: list[int], end: int, depth: int) -> int:
    """How many tokens before and at `end` equal the context's last ones (at most depth)."""
    n, m = len(context), 0
    while m < depth and end - m >= 0 and context[end - m] == context[n - 1 - m]:
        m += 1
    return m


def suffix_continuation(context: list[int], eos: set[int]) -> list[int]:
    """Suffix drafting over the context alone (a single generation has no earlier ones): the
    longest suffix (up to SUFFIX_DEPTH) of the context ending before its last token, found by
    its last 4, else 2, else 1 tokens among their SUFFIX_OCCURRENCES most recent occurrences;
    then, over the occurrences of that longest match, the continuation seen most often (ties:
    the most recent), while the product of its shares stays >= SUFFIX_MIN_P, at most as many
    tokens as matched, cut after an EOS."""
    n = len(context)
    for anchor in (4, 2, 1):
        if n < anchor:
            continue
        tail = context[n - anchor :]
        ends = [p for p in range(anchor - 1, n - 1) if context[p - anchor + 1 : p + 1] == tail]
        ends = ends[-SUFFIX_OCCURRENCES:]
        if not ends:
            continue
        lengths = [suffix_match(context, e, min(SUFFIX_DEPTH, n)) for e in ends]
        best = max(lengths)
        if best < anchor:
            continue
        rows = [e for e, m in zip(ends, lengths, strict=True) if m == best][::-1]
        out: list[int] = []
        p = 1.0
        for d in range(min(LOOKAHEAD, best)):
            reached = len(rows)
            nxt = [(r, context[r + 1 + d]) for r in rows if r + 1 + d < n]
            if not nxt:
                break
            counts: dict[int, int] = {}
            for _, t in nxt:
                counts[t] = counts.get(t, 0) + 1
            token = max(counts, key=lambda t: (counts[t], -[x for _, x in nxt].index(t)))
            p *= counts[token] / reached
            if p < SUFFIX_MIN_P:
                break
            out.append(token)
            rows = [r for r, t in nxt if t == token]
            if token in eos:
                break
        return out
    return []


def generate(
    folder: Path,
    prompt: list[int],
    max_new: int,
    drafter: str,
    k_max: int,
    sampling: dict[str, Any] | None = None,
) -> dict[str, Any]:
    manifest = json.loads((folder / "manifest.json").read_text())
    if manifest["format_version"] > FORMAT_VERSION:
        raise SystemExit(f"format_version {manifest['format_version']} is newer than this reader")
    capacity = manifest["max_length"]
    eos = set(manifest["special_tokens"]["eos_token_ids"])
    target = Model(folder, manifest["target"], capacity)
    kind = drafter.split("+")[0] if drafter.split("+")[0] in ("ngram", "suffix") else ""
    lookup = bool(kind)
    find = suffix_continuation if kind == "suffix" else ngram_continuation
    inner = drafter.removeprefix(kind + "+") if kind else drafter
    draft_name = None if inner in ("ngram", "suffix", "none") else inner
    draft = None
    if draft_name is not None:
        spec = next(d for d in manifest["drafts"] if d.get("name", d["role"]) == draft_name)
        draft = Model(folder, spec, capacity)
    choose = Choice(sampling, target.vocab)
    shared = min(draft.vocab, target.vocab) if draft else target.vocab
    # a feature head reads pairs (target features at t, token t + 1) at its position t
    head = draft is not None and draft.spec.get("head") is not None
    features = np.zeros((capacity, target.extra.get("features", 0)), np.float32)

    context = list(prompt)
    if len(context) > 1:  # caches hold every committed token but the last
        target.feed(context[:-1], features if head else None)
        if draft is not None and not head:
            draft.feed([t if t < draft.vocab else 0 for t in context[:-1]])
    out: list[int] = []
    steps = proposed = accepted = 0
    while max_new - len(out) > 0 and capacity - target.n - 1 >= 0:
        k = min(k_max, capacity - target.n - 1, max_new - len(out) - 1)
        proposal: list[int] = []
        continuation = find(context, eos) if lookup and k > 0 else []
        use_lookup = lookup and (len(continuation) >= HYBRID_MIN_MATCH or draft is None)
        fed = 0  # drafted tokens fed to the draft model in this step
        if k > 0 and use_lookup:
            proposal = continuation[:k]
        elif k > 0 and head and draft is not None and target.n > 0:
            end = target.n  # the pairs with true features: positions 0 .. end - 1
            row = hidden = None
            while draft.n < end:  # catch up, PREFILL_CHUNK pairs at a time
                t = draft.n
                stop = min(end, t + PREFILL_CHUNK)
                rows, hiddens = head_pass(draft, context[t + 1 : stop + 1], features[t:stop], None)
                row, hidden = rows[-1].copy(), hiddens[-1:].copy()
            assert row is not None  # every verify pass adds a pair with true features
            for i in range(k):
                token = choose(row, len(context) + i)
                proposal.append(token)
                if i == k - 1 or token in eos:
                    break
                rows, hiddens = head_pass(draft, [token], None, hidden)
                row, hidden = rows[0].copy(), hiddens.copy()
            draft.n = end  # drop the pairs read with guessed features
        elif k > 0 and draft is not None and not head:
            pending = context[draft.n :]  # catch up on what was committed since
            row = draft.feed([t if t < draft.vocab else 0 for t in pending])
            for i in range(k):
                token = choose(row[:shared], len(context) + i)
                proposal.append(token)
                if i == k - 1 or token in eos:
                    break
                row = draft.forward([token if token < draft.vocab else 0])[0]
                fed += 1
        committed = target.n
        rows = target.forward([context[-1], *proposal])  # [len(proposal) + 1, vocab]
        n_ok = 0
        while n_ok < len(proposal) and proposal[n_ok] == choose(rows[n_ok], len(context) + n_ok):
            n_ok += 1
        tokens = [*proposal[:n_ok], choose(rows[n_ok], len(context) + n_ok)]
        if head:  # the features of the positions the target keeps
            features[committed : committed + 1 + n_ok] = target.last["features"][: 1 + n_ok]
        target.n = committed + 1 + n_ok  # roll back the rejected tail
        if draft is not None and k > 0 and not use_lookup and not head:
            draft.n = min(len(context) + min(n_ok, fed), draft.n)
        steps, proposed, accepted = steps + 1, proposed + len(proposal), accepted + n_ok
        tokens = tokens[: max_new - len(out)]
        stop = next((i for i, t in enumerate(tokens) if t in eos), None)
        if stop is not None:
            tokens = tokens[: stop + 1]
        out += tokens
        context += tokens
        if stop is not None:
            break
    return {"token_ids": out, "steps": steps, "proposed": proposed, "accepted": accepted}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("artifact", type=Path)
    parser.add_argument("--prompt", required=True)
    parser.add_argument("-n", "--max-new-tokens", type=int, default=64)
    parser.add_argument("--draft", default=None, help="default: the manifest's default_drafter")
    parser.add_argument("-k", type=int, default=4)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--min-p", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--op-library", action="append", default=[], help="NAME=PATH of an op library a graph needs"
    )
    args = parser.parse_args()
    OP_LIBRARIES.update(item.split("=", 1) for item in args.op_library)
    manifest = json.loads((args.artifact / "manifest.json").read_text())
    tokenizer = Tokenizer.from_file(str(args.artifact / manifest["tokenizer"]))
    prompt = tokenizer.encode(args.prompt).ids  # plain encode: the tokenizer's own post-processor
    drafter = (
        args.draft
        or manifest.get("default_drafter")
        or (manifest["drafts"][0]["name"] if manifest["drafts"] else "none")
    )
    sampling = None
    if args.temperature > 0:
        sampling = {k: getattr(args, k) for k in ("temperature", "top_k", "top_p", "min_p", "seed")}
    result = generate(
        args.artifact, prompt, args.max_new_tokens, drafter if args.k else "none", args.k, sampling
    )
    result["text"] = tokenizer.decode(result["token_ids"])
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
