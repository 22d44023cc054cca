"""Structured output stays exact and speculative: every output follows its grammar, greedy
constrained speculation equals constrained decoding by the target alone (the source model, one
token at a time, under llguidance's masks), for every drafter and K; sampling under a grammar
follows the target's masked distribution (chi-square, with a broken mask as negative control).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import jsonschema
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import TinyPair, needs_exporter
from specx.runtime import Grammar, InputError, Pipeline, SamplingParams
from specx.runtime.constraint import Constraint
from specx.runtime.verification.sampling import warp
from stats_tools import chi_square_p_value

pytestmark = needs_exporter

PROMPT = "def add(a, b):"
# Random-weight models pick whitespace as readily as anything else, so their JSON here is compact
# (Grammar(compact=True)) or its whitespace short: the default layout (up to 64 per gap) would
# not end within the tiny models' 128 positions.
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["x", "yz"]}, "maxItems": 3},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def pipe(llama_pair: TinyPair) -> Pipeline:
    return Pipeline.load(llama_pair.artifact)


def reference_constrained_greedy(pair: TinyPair, pipe: Pipeline, grammar: Grammar, n: int) -> list:
    """The source model alone, one token at a time, argmax under a fresh matcher's mask."""
    import llguidance
    import torch

    tokenizer = pipe.constraint(grammar).matcher  # only to reach the same LLTokenizer options
    del tokenizer
    native = pipe._grammar_tokenizer.native  # type: ignore[union-attr]
    matcher = llguidance.LLMatcher(native, grammar.compile(), log_level=0)
    ids = pipe.encode_prompt(PROMPT).tolist()
    eos = set(pipe.manifest.special_tokens.eos_token_ids)
    out: list[int] = []
    with torch.no_grad():
        for _ in range(n):
            logits = pair.target(torch.tensor([ids + out])).logits[0, -1].numpy()
            bits = np.zeros((native.vocab_size + 31) // 32, dtype=np.int32)
            matcher.unsafe_compute_mask_ptr(bits.ctypes.data, bits.nbytes)
            allowed = np.unpackbits(bits.view(np.uint8), bitorder="little").astype(bool)
            allowed = allowed[: logits.shape[0]]
            token = int(np.argmax(np.where(allowed, logits, -np.inf)))
            out.append(token)
            assert matcher.consume_token(token)
            if token in eos:
                break
    return out


@pytest.mark.parametrize("drafter", ["self", "mixed", "other", "ngram"])
def test_greedy_constrained_speculation_equals_the_constrained_target_alone(
    llama_pair: TinyPair, pipe: Pipeline, drafter: str
) -> None:
    grammar = Grammar.json_schema(PERSON, compact=True)
    expected = reference_constrained_greedy(llama_pair, pipe, grammar, 100)
    value = json.loads(pipe.codec.decode(expected))
    jsonschema.validate(value, PERSON)
    for k in (0, 1, 2, 4, "auto"):
        result = pipe.generate(PROMPT, max_new_tokens=100, k=k, drafter=drafter, grammar=grammar)
        assert result.token_ids == expected, (drafter, k)
        assert result.stats.stop_reason == "eos"
    stats = pipe.generate(PROMPT, max_new_tokens=100, k=4, drafter=drafter, grammar=grammar).stats
    assert stats.proposed > 0 or drafter == "ngram"
    if drafter == "self":  # the target drafting for itself under the grammar: all accepted
        assert stats.acceptance_rate == 1.0
    if drafter == "mixed":
        assert stats.accepted > 0


def test_under_a_grammar_a_seed_gives_the_same_text_for_every_k_and_drafter(pipe: Pipeline) -> None:
    """Drafter-invariant verification emits the masked target's own sample at every position:
    what was drafted (model drafts under the grammar, lookup drafts cut at a refused token)
    changes the speed, never the text."""
    grammar = Grammar.json_schema(PERSON, compact=True)
    by_seed = []
    for seed in (1, 2, 3):
        texts = {
            tuple(
                pipe.generate(
                    PROMPT,
                    max_new_tokens=60,
                    k=k,
                    drafter=drafter,
                    grammar=grammar,
                    temperature=1.0,
                    seed=seed,
                ).token_ids
            )
            for k in (0, 1, 3, "auto")
            for drafter in ("mixed", "other", "ngram")
        }
        assert len(texts) == 1, (seed, texts)
        by_seed.append(texts.pop())
    assert len(set(by_seed)) == 3  # and the seed matters


def test_without_the_grammar_the_tiny_models_output_is_not_json(pipe: Pipeline) -> None:
    text = pipe.generate(PROMPT, max_new_tokens=60, k=4, drafter="mixed").text
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)


def test_the_draft_is_cut_after_its_first_token_the_grammar_refuses(pipe: Pipeline) -> None:
    constraint = pipe.constraint(Grammar("regex", "ab+"))
    vocab = pipe.codec.tokenizer
    a, b, c = (vocab.token_to_id(x) for x in "abc")
    assert constraint.admit(np.array([a, b, b, c, b])) == 4  # a b b are fine, c is refused
    assert constraint.admit(np.array([c, a])) == 1
    assert constraint.admit(np.array([], dtype=np.int64)) == 0
    logits = np.zeros((4, pipe.manifest.target.vocab_size), dtype=np.float32)
    masked = constraint.mask(np.array([a, b, c]), logits)  # [4, vocab]
    assert np.isfinite(masked[0, a]) and not np.isfinite(masked[0, b])
    assert np.isfinite(masked[1, b]) and not np.isfinite(masked[1, a])
    assert (masked[3] == masked[2]).all()  # past the refused c: a copy, never read
    eos = pipe.manifest.special_tokens.eos_token_ids[0]
    assert np.isfinite(masked[2, eos])  # "ab" is complete: it may end
    constraint.commit(np.array([a, b]))
    assert constraint.admit(np.array([a])) == 1 and not constraint.finished


@st.composite
def schemas(draw: Any, depth: int = 0) -> dict[str, Any]:
    leaves = st.one_of(
        st.builds(
            lambda lo, n: {"type": "integer", "minimum": lo, "maximum": lo + n},
            st.integers(-50, 50),
            st.integers(0, 500),
        ),
        st.builds(lambda n: {"type": "string", "maxLength": n}, st.integers(0, 5)),
        st.just({"type": "boolean"}),
        st.just({"type": "null"}),
        st.builds(
            lambda v: {"enum": v},
            st.lists(
                st.sampled_from(["a", "bc", 1, True, None]), min_size=1, max_size=3, unique=True
            ),
        ),
        st.builds(
            lambda p: {"type": "string", "pattern": p}, st.sampled_from(["^[a-c]{1,3}$", "^x?y$"])
        ),
    )
    kinds = ["leaf", "array", "object"] if depth < 2 else ["leaf"]
    kind = draw(st.sampled_from(kinds))
    if kind == "leaf":
        return draw(leaves)
    if kind == "array":
        return {"type": "array", "items": draw(leaves), "maxItems": draw(st.integers(0, 3))}
    names = draw(
        st.lists(st.sampled_from(["a", "b", "id", "ok", "xy"]), min_size=1, max_size=3, unique=True)
    )
    properties = {name: draw(schemas(depth + 1)) for name in names}
    required = [n for n in names if draw(st.booleans())]
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


def longest_text(schema: dict[str, Any]) -> int:
    """An upper bound of the characters of any value of these schemas (they all have one)."""
    if "enum" in schema:
        return max(len(json.dumps(v)) for v in schema["enum"])
    kind = schema.get("type")
    if kind == "integer":
        return max(len(str(schema["minimum"])), len(str(schema["maximum"])))
    if kind == "string":
        return 2 + 6 * schema.get("maxLength", 3)  # a character may be an escape
    if kind == "array":
        return 2 + schema["maxItems"] * (2 + longest_text(schema["items"]))
    if kind == "object":
        return 2 + sum(8 + longest_text(s) for s in schema["properties"].values())
    return 5  # true, false, null


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(schema=schemas())
def test_every_output_parses_and_validates_against_its_schema(pipe: Pipeline, schema: Any) -> None:
    budget = pipe.manifest.max_length - 8  # the prompt's tokens and room
    if longest_text(schema) > budget:
        schema = {  # may omit "a"
            "type": "object",
            "properties": {"a": schema},
            "required": [],
            "additionalProperties": False,
        }
    grammar = Grammar.json_schema(schema, compact=True)
    for seed in range(8):
        k = [0, 1, 3, "auto"][seed % 4]
        temperature = 0.0 if seed < 2 else 1.0
        result = pipe.generate(
            "{",
            max_new_tokens=budget,
            k=k,
            drafter="mixed",
            grammar=grammar,
            temperature=temperature,
            seed=seed,
        )
        assert result.stats.stop_reason == "eos", (schema, seed, result.text)
        jsonschema.validate(json.loads(result.text), schema)


@pytest.fixture
def short_whitespace(monkeypatch: pytest.MonkeyPatch) -> None:
    from specx.runtime import constraint

    monkeypatch.setitem(constraint.JSON_LAYOUT, "whitespace_pattern", r"[\n ]{0,2}")


def test_json_object_mode_and_a_lark_grammar_and_gbnf_all_constrain(
    pipe: Pipeline, short_whitespace: None
) -> None:
    finished = 0
    for seed in range(6):  # a random model's strings run long: keep those that end in budget
        result = pipe.generate(
            "{", max_new_tokens=110, k=3, grammar=Grammar.json_object(), temperature=1, seed=seed
        )
        assert result.text.startswith("{")
        if result.stats.stop_reason == "eos":
            finished += 1
            assert isinstance(json.loads(result.text), dict)
    assert finished
    lark = Grammar("lark", 'start: "def " NAME "(" ")"\nNAME: /[a-z]{1,6}/\n')
    assert pipe.generate(
        PROMPT, max_new_tokens=40, k=3, grammar=lark, temperature=1.0, seed=1
    ).text.startswith("def ")
    gbnf = Grammar("gbnf", 'root ::= "yes" | "no"\n')
    assert pipe.generate(PROMPT, max_new_tokens=10, k=2, grammar=gbnf).text in ("yes", "no")


@pytest.mark.parametrize(
    ("grammar", "message"),
    [
        (Grammar("lark", "start: undefined_rule\n"), "invalid lark grammar"),
        (Grammar("regex", "a(b"), "invalid regex grammar"),
        (Grammar("gbnf", "root ::= missing\n"), "invalid gbnf grammar"),
    ],
)
def test_an_invalid_grammar_is_refused_before_anything_runs(
    pipe: Pipeline, grammar: Grammar, message: str
) -> None:
    with pytest.raises(InputError, match=message):
        pipe.generate(PROMPT, max_new_tokens=5, grammar=grammar)


def test_the_default_json_layout_allows_a_models_own_indentation_but_bounds_it(
    pipe: Pipeline,
) -> None:
    encode = pipe.codec.encode
    pretty = encode('{\n  "name": "a",\n  "age": 1,\n  "tags": []\n}', add_special_tokens=False)
    padded = encode("{" + " " * 65 + '"name"', add_special_tokens=False)
    layout = pipe.constraint(Grammar.json_schema(PERSON))
    assert layout.admit(pretty) == len(pretty)
    assert layout.admit(padded) < len(padded)  # 64 whitespace characters at most per gap
    compact = pipe.constraint(Grammar.json_schema(PERSON, compact=True))
    assert compact.admit(pretty) < len(pretty)


def test_a_schema_that_is_not_json_is_refused() -> None:
    with pytest.raises(InputError, match="not valid JSON"):
        Grammar.json_schema("{nope")


# -- sampling under a grammar -----------------------------------------------------------------
SAMPLES = 2500
ALPHA = 1e-3
CHOICE = Grammar("regex", "[0-9][0-9]")  # digits: no merged tokens


def exact_first_two(pair: TinyPair, pipe: Pipeline, params: SamplingParams) -> dict:
    """P(first two tokens) of the source model sampled under CHOICE's masks (llguidance's, one
    matcher walked by hand)."""
    import llguidance
    import torch

    pipe.constraint(CHOICE)  # builds the pipeline's tokenizer for llguidance
    native = pipe._grammar_tokenizer.native  # type: ignore[union-attr]
    matcher = llguidance.LLMatcher(native, CHOICE.compile(), log_level=0)
    prompt = pipe.encode_prompt(PROMPT).tolist()
    vocab = pipe.manifest.target.vocab_size

    def allowed() -> np.ndarray:
        bits = np.zeros((native.vocab_size + 31) // 32, dtype=np.int32)
        matcher.unsafe_compute_mask_ptr(bits.ctypes.data, bits.nbytes)
        return np.unpackbits(bits.view(np.uint8), bitorder="little").astype(bool)[:vocab]

    def masked_row(ids: list[int], mask: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            logits = pair.target(torch.tensor([ids])).logits[0, -1].numpy()
        return warp(np.where(mask, logits, -np.inf), params)

    p1 = masked_row(prompt, allowed())
    joint = {}
    for a in np.flatnonzero(p1):
        assert matcher.consume_token(int(a))
        p2 = masked_row([*prompt, int(a)], allowed())
        matcher.rollback(1)
        for b in np.flatnonzero(p2):
            joint[(int(a), int(b))] = float(p1[a] * p2[b])
    return joint


def sampled_first_two(pipe: Pipeline, params: SamplingParams, k: int | str) -> list:
    pairs = []
    for seed in range(SAMPLES):
        ids = pipe.generate(
            PROMPT,
            max_new_tokens=4,
            k=k,
            drafter="mixed",
            grammar=CHOICE,
            sampling=dataclasses.replace(params, seed=seed),
        ).token_ids
        pairs.append((ids[0], ids[1]))
    return pairs


@pytest.mark.parametrize(
    ("k", "verification"),
    [(0, "invariant"), (4, "invariant"), (4, "rejection"), ("auto", "rejection")],
)
def test_sampling_under_a_grammar_follows_the_targets_masked_distribution(
    llama_pair: TinyPair, pipe: Pipeline, k: int | str, verification: str
) -> None:
    params = SamplingParams(temperature=1.5, verification=verification)
    expected = exact_first_two(llama_pair, pipe, params)
    assert sum(1 for p in expected.values() if p * SAMPLES >= 5) >= 8  # a meaningful test
    assert chi_square_p_value(sampled_first_two(pipe, params, k), expected) > ALPHA


def test_the_same_test_catches_draft_rows_left_unmasked(
    llama_pair: TinyPair, pipe: Pipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = Constraint.mask

    def first_row_only(self: Constraint, draft: np.ndarray, logits: np.ndarray) -> np.ndarray:
        masked = original(self, draft, logits)
        # the drafted rows keep the unmasked distribution (renormalised over what the grammar
        # allows differently): a plausible bug
        masked[1:] = np.where(np.isfinite(masked[1:]), logits[1:] * 0.0, -np.inf)
        return masked

    monkeypatch.setattr(Constraint, "mask", first_row_only)
    params = SamplingParams(temperature=1.5, verification="rejection")
    expected = exact_first_two(llama_pair, pipe, params)
    assert chi_square_p_value(sampled_first_two(pipe, params, 4), expected) < 1e-6


def test_markup_that_is_an_added_token_is_written_as_that_token(pipe: Pipeline) -> None:
    """Qwen's <tool_call> is an added token: llguidance forces a quoted "<tool_call>" through
    the tokenizer (which yields the token) and then refuses the token as text. lark_literal
    writes it as the token; the quoted form is the negative control: its draft stops and its
    commit is a clear InputError, not a crash."""
    from tokenizers import Tokenizer

    from specx.runtime.constraint import GrammarTokenizer

    text = (pipe.folder / pipe.manifest.tokenizer).read_text(encoding="utf-8")
    tag_id = Tokenizer.from_str(text).get_vocab_size(with_added_tokens=True)
    spec = json.loads(text)
    spec["added_tokens"].append(
        {
            "id": tag_id,
            "content": "<tool_call>",
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": False,
        }
    )
    eos = pipe.manifest.special_tokens.eos_token_ids
    vocab = max(pipe.manifest.target.vocab_size, tag_id + 1)
    tokenizer = GrammarTokenizer(json.dumps(spec), vocab, eos)
    assert tokenizer.lark_literal("<tool_call>") == f"<[{tag_id}]>"
    assert tokenizer.lark_literal('say "hi"') == '"say \\"hi\\""'

    tagged = tokenizer.constraint(Grammar("lark", f'start: <[{tag_id}]> "ab"\n'))
    assert np.flatnonzero(tagged.draft_allowed()).tolist() == [tag_id]
    assert tagged.draft_push(tag_id)
    tagged.draft_end()
    tagged.commit(np.array([tag_id]))
    assert not tagged.draft_allowed()[tag_id]

    quoted = tokenizer.constraint(Grammar("lark", 'start: "<tool_call>" "ab"\n'))
    assert quoted.draft_allowed()[tag_id]  # the mask offers the token ...
    assert not quoted.draft_push(tag_id)  # ... the matcher refuses it
    quoted.draft_end()
    with pytest.raises(InputError, match=f"<\\[{tag_id}\\]>"):
        quoted.commit(np.array([tag_id]))
