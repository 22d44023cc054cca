"""What a grammar may cost the matcher, and the check that refuses one before generation starts.

llguidance bounds its own work per grammar and per token (`GrammarLimits` names its budgets and
sets them deliberately); past one, its matcher stops with an error. Some of those errors show at
compile time (grammar size, lexer fuel, `$ref` graphs that allow no text), others only when the
parser reaches a state: an object with thousands of properties compiles, then fails on the first
token of a key (thousands of Earley items in one row). `probe` walks a few seeded random paths
through a fresh matcher, computing each mask as generation would, and a JSON Schema's wide parts
(`wide_parts`: objects and unions with many members, wherever they nest) are probed alone as
well, since a random walk rarely reaches deep into a schema; so such a grammar is refused as bad
input (a 400, exit 2) before any target pass is spent on it. A state no probe
reached can still fail later: then the generation ends cleanly with the text so far
(`GrammarError`, decode/sequence.py), never with a crash.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from specx.runtime.errors import InputError


@dataclass(frozen=True)
class GrammarLimits:
    """The matcher's budgets (llguidance's ParserLimits; their defaults are llguidance's) and
    the probe's size. Raise them for trusted, large grammars (`specx serve --grammar-*`)."""

    max_source_bytes: int = 1 << 20  # the grammar's text (a JSON Schema, Lark, GBNF, regex)
    max_items_in_row: int = 2000  # Earley items one parser row may hold (alternatives at a point)
    step_max_items: int = 50_000  # Earley items one token's mask may create
    initial_lexer_fuel: int = 1_000_000  # work to build the lexer (regex size and nesting)
    step_lexer_fuel: int = 200_000  # lexer work per token's mask
    max_lexer_states: int = 250_000  # lexer states (memory: about 1-2 kB each)
    max_grammar_size: int = 500_000  # symbols in the grammar's productions
    probe_walks: int = 4  # seeded random paths walked before a grammar is admitted
    probe_steps: int = 24  # tokens per path

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise InputError(
                    f"grammar limit {name} must be a non-negative integer, got {value!r}",
                    "leave it at its default or raise it",
                )

    def native(self) -> Any:
        """llguidance's LLParserLimits of these budgets."""
        import llguidance

        return llguidance.LLParserLimits(
            max_items_in_row=self.max_items_in_row,
            initial_lexer_fuel=self.initial_lexer_fuel,
            step_lexer_fuel=self.step_lexer_fuel,
            step_max_items=self.step_max_items,
            max_lexer_states=self.max_lexer_states,
            max_grammar_size=self.max_grammar_size,
            verbose_errors=False,  # a refusal names the limit, not the parser's state
        )


DEFAULT_LIMITS = GrammarLimits()

# words of llguidance's errors -> (the limit hit, the `specx serve` flag that raises it)
_KNOWN = (
    ("items; max is", "max_items_in_row", "--grammar-row-items"),
    ("Too many items", "step_max_items", "--grammar-step-items"),
    ("initial lexer configuration", "initial_lexer_fuel", "--grammar-lexer-fuel"),
    ("fuel", "lexer fuel", "--grammar-lexer-fuel"),
    ("too many states", "max_lexer_states", "--grammar-lexer-fuel"),
    ("grammar size (number of symbols) too big", "max_grammar_size", "--grammar-size"),
    ("schema too large", "max_grammar_size", "--grammar-size"),
)


class GrammarError(InputError):
    """The matcher gave up on a grammar (a resource limit, a state it cannot leave)."""


class GrammarLimitError(GrammarError):
    """The matcher gave up on a grammar at one of its limits (GrammarLimits)."""


def _first_line(error: str) -> str:
    first = error.strip().splitlines()[0] if error.strip() else "unknown error"
    return first.removeprefix("Parser Error: ")


def _when(after: int | None) -> str:
    return "before generation" if after is None else f"after {after} generated tokens"


def over_limit(error: str, after: int | None = None) -> GrammarLimitError | None:
    """The GrammarError for a matcher error that names one of the limits (None: another
    error), with how to stay under it. after: tokens generated (None: before generation)."""
    for words, limit, flag in _KNOWN:
        if words in error:
            return GrammarLimitError(
                f"the grammar exceeds the matcher's {limit} limit ({_when(after)}): "
                f"{_first_line(error)}",
                "simplify it (fewer properties, alternatives or enum values in one place; "
                f"nest instead of listing), or start the server with a higher {flag}",
            )
    return None


def refusal(error: str, after: int | None = None) -> GrammarError:
    """The GrammarError for any matcher error (over_limit's where it names a limit)."""
    limit = over_limit(error, after)
    if limit is not None:
        return limit
    if "NoExtensionBias" in error:
        return GrammarError(
            f"the grammar allows no text ({_when(after)})",
            "check it for a $ref that only refers to itself, or constraints that contradict",
        )
    return GrammarError(f"the grammar matcher failed ({_when(after)}): {_first_line(error)}")


def probe(matcher: Any, vocab_size: int, eos: set[int], limits: GrammarLimits) -> None:
    """Walk `limits.probe_walks` seeded random paths of up to `probe_steps` tokens through copies
    of a fresh matcher, computing every mask; raise the GrammarError of the first failure (also
    for a grammar that allows nothing at all). The matcher itself is left as it was."""
    bits = np.zeros((vocab_size + 31) // 32, dtype=np.int32)
    rng = np.random.default_rng(0)
    for walk in range(limits.probe_walks):
        walker = matcher.deep_copy()
        for step in range(limits.probe_steps):
            walker.unsafe_compute_mask_ptr(bits.ctypes.data, bits.nbytes)
            if walker.is_error():
                raise refusal(walker.get_error())
            allowed = np.flatnonzero(
                np.unpackbits(bits.view(np.uint8), bitorder="little")[:vocab_size]
            )
            text = allowed[~np.isin(allowed, list(eos))] if eos else allowed
            if not text.shape[0]:
                if walk == 0 and step == 0 and not allowed.shape[0]:
                    raise refusal("no valid token at the start: NoExtensionBias")
                break  # complete: only an end token is left
            token = int(rng.choice(text))
            if not walker.validate_tokens([token]):
                break  # the mask offers a token the matcher refuses (constraint.lark_literal)
            if not walker.consume_token(token):
                limit = over_limit(walker.get_error())
                if limit is not None:
                    raise limit
                break


WIDE = 64  # members (properties, anyOf/oneOf alternatives) that make a part of a schema wide
WIDE_PARTS_PROBED = 8  # at most this many wide parts are probed alone, the widest first
DATA_KEYWORDS = ("enum", "const", "default", "examples")  # hold values, not schemas


def wide_parts(schema: Any) -> list[tuple[str, dict[str, Any]]]:
    """(JSON pointer, sub-schema) of the parts of `schema` below its root with more than WIDE
    properties or alternatives, the widest first (at most WIDE_PARTS_PROBED); each carries the
    root's definitions, so that its references resolve alone."""
    found: list[tuple[int, str, dict[str, Any]]] = []
    stack: list[tuple[str, Any]] = [("", schema)]
    while stack:
        pointer, node = stack.pop()
        if isinstance(node, dict):
            sizes = [len(node[k]) for k in ("anyOf", "oneOf") if isinstance(node.get(k), list)]
            if isinstance(node.get("properties"), dict):
                sizes.append(len(node["properties"]))
            members = max(sizes, default=0)
            if pointer and members > WIDE:
                found.append((members, pointer, node))
            children = ((k, v) for k, v in node.items() if k not in DATA_KEYWORDS)
        elif isinstance(node, list):
            children = ((str(i), v) for i, v in enumerate(node))
        else:
            continue
        for key, child in children:
            escaped = str(key).replace("~", "~0").replace("/", "~1")
            stack.append((f"{pointer}/{escaped}", child))
    found.sort(key=lambda f: (-f[0], f[1]))
    definitions = {
        k: schema[k] for k in ("$defs", "definitions") if isinstance(schema, dict) and k in schema
    }
    return [(p, {**definitions, **node}) for _, p, node in found][:WIDE_PARTS_PROBED]
