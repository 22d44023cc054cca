"""Structured output that stays speculative: a grammar every emitted token must follow.

A `Grammar` says what the output must be (a JSON Schema, any JSON object, a Lark or GBNF grammar,
a regular expression); `Grammar.compile` turns it into llguidance's grammar, checked once per
request. A `Constraint` is one generation's matcher over it. Within a step:

    admit   the draft is cut after its first token the grammar refuses: that token stays (the
            masked target gives it no probability, so verification rejects it and draws the
            correction as it would for any rejected token: exact under rejection sampling too),
            whatever follows it could never be accepted
    mask    row i of the target's logits gets -inf wherever the grammar refuses the token after
            d_1 .. d_i (the matcher walks the admitted draft, then rolls back: one mask per row)
    commit  the committed tokens advance the matcher

Verification then sees exactly the distributions the target alone would sample from under the
grammar (greedy: its masked argmax), so every exactness property of unconstrained speculation
holds under the constraint: greedy output equals constrained decoding by the target alone, and
with drafter-invariant sampling a seed fixes the text for every K and drafter.

llguidance is an optional dependency (`pip install specx[grammar]`); nothing imports it until a
grammar is asked for.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from specx.runtime.errors import InputError
from specx.runtime.grammar_limits import (
    DEFAULT_LIMITS,
    GrammarError,
    GrammarLimitError,
    GrammarLimits,
    over_limit,
    probe,
    refusal,
    wide_parts,
)

# kind -> what `source` holds
GRAMMAR_KINDS = {
    "json_schema": "a JSON Schema (JSON text)",
    "json_object": "any JSON object (source unused)",
    "lark": "a Lark grammar in llguidance's dialect",
    "gbnf": "a GBNF grammar (llama.cpp's format)",
    "regex": "a regular expression the whole output must match",
}
# file suffix -> kind, for --grammar FILE
SUFFIX_KINDS = {".json": "json_schema", ".lark": "lark", ".gbnf": "gbnf", ".regex": "regex"}
INSTALL_HINT = "install the grammar engine: pip install 'specx[grammar]' (llguidance)"


def _llguidance() -> Any:
    try:
        import llguidance
    except ImportError as e:
        raise InputError("structured output needs llguidance, not installed", INSTALL_HINT) from e
    return llguidance


@dataclass(frozen=True)
class Grammar:
    """What every generated text must be."""

    kind: str  # one of GRAMMAR_KINDS
    source: str = ""
    # JSON kinds: False lets the model lay the JSON out as it would unconstrained (newlines and
    # indentation, at most WHITESPACE per gap); True allows no whitespace at all
    compact: bool = False

    def __post_init__(self) -> None:
        if self.kind not in GRAMMAR_KINDS:
            raise InputError(
                f"unknown grammar kind {self.kind!r}", f"use one of {', '.join(GRAMMAR_KINDS)}"
            )

    @classmethod
    def json_schema(cls, schema: dict[str, Any] | str, compact: bool = False) -> Grammar:
        try:
            text = schema if isinstance(schema, str) else json.dumps(schema)
            parsed = json.loads(text)
        except RecursionError as e:
            raise InputError(
                "the JSON Schema is nested too deeply to read",
                "nest it less deeply (a few dozen levels at most)",
            ) from e
        except json.JSONDecodeError as e:
            raise InputError(
                f"the JSON Schema is not valid JSON: {e}",
                'pass a JSON Schema document (an object such as {"type": "object"})',
            ) from e
        if not isinstance(parsed, dict | bool):
            raise InputError(
                "a JSON Schema must be a JSON object (or true/false)",
                'pass a JSON Schema document (an object such as {"type": "object"})',
            )
        return cls("json_schema", text, compact)

    @classmethod
    def json_object(cls, compact: bool = False) -> Grammar:
        return cls("json_object", compact=compact)

    @classmethod
    def from_file(cls, path: str | Path, kind: str | None = None) -> Grammar:
        """A grammar file: its kind from `kind` or the suffix (.json: JSON Schema, .lark, .gbnf,
        .regex)."""
        file = Path(path)
        kind = kind or SUFFIX_KINDS.get(file.suffix.lower())
        if kind is None:
            raise InputError(
                f"cannot tell the grammar format of {file.name}",
                f"name it with one of {', '.join(SUFFIX_KINDS)}",
            )
        try:
            text = file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise InputError(f"cannot read the grammar file {file}: {e}") from e
        return cls.json_schema(text) if kind == "json_schema" else cls(kind, text)

    @property
    def json_options(self) -> dict[str, Any]:
        """llguidance's JSON options for this grammar (`x-guidance` in a schema overrides them)."""
        return dict(JSON_COMPACT if self.compact else JSON_LAYOUT)

    def compile(self, limits: GrammarLimits = DEFAULT_LIMITS) -> str:
        """llguidance's grammar for this one, checked against `limits` without a tokenizer (a
        GrammarTokenizer's `check` also walks it); an InputError names what is wrong with it."""
        grammar = self.unchecked(limits)
        matcher = _llguidance().LLMatcher
        is_error, messages = matcher.validate_grammar_with_warnings(grammar, limits=limits.native())
        if is_error:
            raise self.invalid(messages[0] if messages else "unknown error")
        return grammar

    def invalid(self, error: str) -> InputError:
        """The InputError for llguidance's verdict on this grammar."""
        if "recursion limit exceeded" in error:  # its JSON reader's depth limit
            return InputError(
                f"the {self.kind} grammar is nested too deeply for the grammar compiler ({error})",
                "nest it less deeply: about a hundred levels of objects and arrays at most",
            )
        return over_limit(error) or InputError(
            f"invalid {self.kind} grammar: {error}", "check it against " + GRAMMAR_KINDS[self.kind]
        )

    def unchecked(self, limits: GrammarLimits = DEFAULT_LIMITS) -> str:
        """llguidance's grammar for this one, not yet validated (its size checked)."""
        llg = _llguidance()
        matcher = llg.LLMatcher
        size = len(self.source.encode("utf-8", "surrogatepass"))
        if size > limits.max_source_bytes:
            raise InputError(
                f"the {self.kind} grammar is {size} bytes, above the limit of "
                f"{limits.max_source_bytes}",
                "send a smaller grammar, or start the server with a higher --grammar-size",
            )
        try:
            if self.kind == "json_schema":
                grammar = matcher.grammar_from_json_schema(self.source, defaults=self.json_options)
            elif self.kind == "json_object":
                grammar = matcher.grammar_from_json_schema(
                    {"type": "object"}, defaults=self.json_options
                )
            elif self.kind == "regex":
                grammar = matcher.grammar_from_regex(self.source)
            elif self.kind == "gbnf":
                grammar = matcher.grammar_from_lark(_gbnf_to_lark(self.source))
            else:
                grammar = matcher.grammar_from_lark(self.source)
        except (ValueError, TypeError) as e:  # gbnf_to_lark and the JSON reader raise these
            raise self.invalid(str(e)) from e
        return str(grammar)


def _gbnf_to_lark(source: str) -> str:
    from llguidance.gbnf_to_lark import gbnf_to_lark

    try:
        return str(gbnf_to_lark(source))
    except Exception as e:  # the converter raises bare Exceptions for undefined rules
        raise ValueError(str(e)) from e


# Whitespace a JSON grammar allows between tokens: a model keeps the layout it writes when free
# (forcing compact JSON on a model that indents measurably lowers both its answers' quality and
# the draft's acceptance: docs/structured-output.md), bounded so that it cannot pad forever.
WHITESPACE = r"[\n\t ]{0,64}"
JSON_LAYOUT: dict[str, Any] = {"whitespace_flexible": False, "whitespace_pattern": WHITESPACE}
JSON_COMPACT: dict[str, Any] = {"whitespace_flexible": False}


CHECKED_KEPT = 64  # checked grammars a tokenizer remembers


class GrammarTokenizer:
    """llguidance's view of an artifact's tokenizer (built once per pipeline: it indexes every
    token's bytes, which takes about a second on a 150k vocabulary)."""

    def __init__(self, tokenizer_json: str, vocab_size: int, eos_token_ids: tuple[int, ...]):
        llg = _llguidance()
        self.vocab_size = vocab_size  # the target's logits width (may exceed the tokenizer's)
        self.eos_token_ids = eos_token_ids
        try:
            self.native = llg.LLTokenizer(
                tokenizer_json, n_vocab=vocab_size, eos_token=list(eos_token_ids) or None
            )
        except ValueError as e:  # e.g. a word-level tokenizer: no bytes to match
            raise InputError(f"this artifact's tokenizer cannot take a grammar: {e}") from e
        # grammars checked: (grammar, limits) -> a fresh matcher, copied for each generation, or
        # the InputError that refused it
        self._checked: dict[tuple[Grammar, GrammarLimits], Any | InputError] = {}
        self._lock = threading.Lock()

    def lark_literal(self, text: str) -> str:
        """`text` as a Lark terminal: `<[id]>` when it is one token llguidance treats as special
        (an added token such as Qwen's <tool_call>), else a quoted string. llguidance forces a
        quoted literal through the tokenizer, which yields the special token, and then refuses
        that token as text: such markup must be written as the token."""
        ids = self.native.tokenize_str(text)
        if len(ids) == 1 and self.native.is_special_token(ids[0]):
            return f"<[{ids[0]}]>"
        return json.dumps(text)

    def check(self, grammar: Grammar, limits: GrammarLimits = DEFAULT_LIMITS) -> Any:
        """A fresh matcher of `grammar`, compiled and probed within `limits` (what fails here
        fails before generation, as an InputError, not during it); the verdict is kept, so that
        a server that sees the same schema again neither compiles nor probes it again."""
        key = (grammar, limits)
        with self._lock:
            found = self._checked.get(key)
        if found is None:
            try:
                found = self._matcher(grammar, limits)  # outside the lock: it may take seconds
            except InputError as e:
                found = e  # refused again at once when sent again
            with self._lock:
                if len(self._checked) >= CHECKED_KEPT:
                    self._checked.pop(next(iter(self._checked)))  # the oldest
                self._checked[key] = found
        if isinstance(found, InputError):
            raise found
        with self._lock:
            return found.deep_copy()

    def _matcher(self, grammar: Grammar, limits: GrammarLimits, parts: bool = True) -> Any:
        """A fresh matcher of `grammar`, probed; with `parts`, a JSON Schema's wide parts are
        probed alone too (grammar_limits.wide_parts)."""
        llg = _llguidance()
        compiled = grammar.unchecked(limits)
        matcher = llg.LLMatcher(self.native, compiled, log_level=0, limits=limits.native())
        if matcher.is_error():
            raise grammar.invalid(matcher.get_error())
        probe(matcher, self.vocab_size, set(self.eos_token_ids), limits)
        if parts and grammar.kind == "json_schema" and limits.probe_walks:
            for pointer, part in wide_parts(json.loads(grammar.source)):
                try:
                    self._matcher(Grammar.json_schema(part, grammar.compact), limits, False)
                except GrammarLimitError as e:
                    message = f"{e.message} at {pointer} of the schema"
                    raise GrammarLimitError(message, e.hint) from e
                except InputError:
                    continue  # a part that means nothing alone (a reference to its root)
        return matcher

    def constraint(
        self, grammar: Grammar | str, limits: GrammarLimits = DEFAULT_LIMITS
    ) -> Constraint:
        """One generation's matcher of `grammar` (a Grammar, checked: `check`; or llguidance's
        grammar text as it is)."""
        if isinstance(grammar, Grammar):
            return Constraint(self, self.check(grammar, limits))
        llg = _llguidance()
        return Constraint(
            self, llg.LLMatcher(self.native, grammar, log_level=0, limits=limits.native())
        )


class Constraint:
    """One generation's grammar state (module docstring: admit, mask, commit), and the walk a
    model drafter takes through it while proposing (draft_allowed, draft_push, draft_end)."""

    def __init__(self, tokenizer: GrammarTokenizer, matcher: Any) -> None:
        """matcher: a fresh llguidance LLMatcher of the grammar (GrammarTokenizer.constraint)."""
        self.vocab_size = tokenizer.vocab_size
        self.eos = set(tokenizer.eos_token_ids)
        self.matcher = matcher
        if self.matcher.is_error():
            raise refusal(self.matcher.get_error())
        self.consumed = 0  # tokens committed
        self._bits = np.zeros((self.vocab_size + 31) // 32, dtype=np.int32)
        # masks computed since the last commit, by the tokens after it: the draft's walk and
        # the verify pass ask for the same positions
        self._masks: dict[tuple[int, ...], np.ndarray] = {}
        self._walked: list[int] = []  # tokens a drafter pushed in this proposal

    @property
    def finished(self) -> bool:
        """The grammar is complete and allows nothing more (only an end-of-sequence token)."""
        return bool(self.matcher.is_stopped())

    def _allowed_now(self, after: tuple[int, ...]) -> np.ndarray:
        """[vocab] bool: what the grammar allows in the matcher's state, which is `after` the
        last committed token."""
        found = self._masks.get(after)
        if found is None:
            v = self._bits
            self.matcher.unsafe_compute_mask_ptr(v.ctypes.data, v.size * v.itemsize)
            if self.matcher.is_error():  # a limit no check foresaw: the generation ends here
                raise refusal(self.matcher.get_error(), self.consumed)
            # little-endian bits within each int32 word
            found = np.unpackbits(v.view(np.uint8), bitorder="little")[: self.vocab_size]
            found = found.astype(bool)
            self._masks[after] = found
        return found

    # -- a model drafter's walk (DraftChain): propose only what the grammar allows ---------
    def draft_allowed(self) -> np.ndarray:
        """[vocab] bool: what may follow the committed tokens and the pushed draft tokens
        (nothing once the matcher failed: the draft proposes no further, and verification
        meets the failure)."""
        try:
            return self._allowed_now(tuple(self._walked))
        except GrammarError:
            return np.zeros(self.vocab_size, dtype=bool)

    def draft_push(self, token: int) -> bool:
        """Walk past a drafted token; False (nothing walked) when the matcher refuses it."""
        if token in self.eos:
            return True  # the proposal ends with it; an end token is never walked past
        if not self.matcher.consume_token(token):
            return False  # a mask the matcher disagrees with (lark_literal): propose no further
        self._walked.append(token)
        return True

    def draft_end(self) -> None:
        """The proposal is done: back to the committed state."""
        if self._walked:
            self.matcher.rollback(len(self._walked))
            self._walked = []

    # -- the step ---------------------------------------------------------------------------
    def admit(self, draft: np.ndarray) -> int:
        """How many draft tokens to verify: the prefix the grammar allows, plus its first
        refused token if any (module docstring)."""
        valid = int(self.matcher.validate_tokens(draft.tolist()))
        return min(valid + 1, int(draft.shape[0]))

    def allowed(self, draft: np.ndarray) -> np.ndarray:
        """[n + 1, vocab] bool: row i is what the grammar allows after the admitted draft's
        first i tokens. A row past a refused token or an end token (never read by
        verification) repeats the last row the grammar could compute."""
        tokens = draft.tolist()
        n = len(tokens)
        # rows computed: up to the first refused or end token (the row deciding it included)
        walk = int(self.matcher.validate_tokens(tokens))
        walk = min([walk, *(i for i, t in enumerate(tokens) if t in self.eos)])
        rows = [self._allowed_now(())]
        for i in range(walk):
            self.matcher.consume_token(tokens[i])
            rows.append(self._allowed_now(tuple(tokens[: i + 1])))
        if walk:
            self.matcher.rollback(walk)
        rows += [rows[-1]] * (n + 1 - len(rows))  # rows past it: never read by verification
        return np.stack(rows)

    def mask(self, draft: np.ndarray, logits: np.ndarray) -> np.ndarray:
        """The target's logits [n + 1, vocab] with what the grammar refuses at -inf (a copy)."""
        allowed = self.allowed(draft)  # [n + 1, vocab]
        width = logits.shape[-1]
        if width > allowed.shape[-1]:
            allowed = np.pad(allowed, ((0, 0), (0, width - allowed.shape[-1])))
        return np.where(allowed[:, :width], logits, np.float32(-np.inf))

    def commit(self, tokens: np.ndarray) -> None:
        """Advance past the tokens a step committed (each one the masked target allowed)."""
        self._masks.clear()
        for token in tokens.tolist():
            if token in self.eos and self.matcher.is_accepting():
                return  # the end: the generation stops here, the matcher takes no more
            if not self.matcher.consume_token(token):
                error = self.matcher.get_error()
                limit = over_limit(error, self.consumed)
                if limit is not None:  # a limit met while walking past the token
                    raise limit
                # else only when llguidance's mask and matcher disagree (lark_literal's case)
                raise GrammarError(
                    f"the grammar allowed token {token} and then refused it: "
                    f"{error.splitlines()[0]}",
                    f"write markup that is a special token of this tokenizer as <[{token}]>",
                )
            self.consumed += 1
