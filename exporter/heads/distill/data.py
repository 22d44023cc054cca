"""Training data for `specx distill`: the target's own answers (self-distillation) and what the
target computes on them.

Prompts: a set specx ships (templated chat questions over many topics, code stubs to complete,
and grounded tasks over passages the target wrote itself in the first round), requests the
target writes itself (distill/self_prompts.py), or the user's own
(``--prompts`` files, one prompt per line or a JSON list; ``--text`` files, read as they are).
None of the shipped prompts is one of `specx bench`'s (a test checks it).

For every sequence (prompt + the target's greedy answer) one forward pass of the target records
the hidden states the head will read (its taps, float16) and the target's top-8 next-token
distribution at every position (the soft labels).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from specx.exporter.weights.load import Log, SourceModel
from specx.runtime.errors import ExportError

TOP = 8  # the target's top-k next tokens kept as soft labels

TOPICS = (
    "photosynthesis", "the water cycle", "black holes", "the French Revolution",
    "compound interest", "volcanoes", "the immune system", "recycling", "honeybees",
    "climate change", "the Roman Empire", "electric cars", "sleep", "coffee", "chess",
    "the moon landing", "earthquakes", "vaccines", "solar panels", "the stock market", "DNA",
    "rainbows", "plate tectonics", "the printing press", "antibiotics", "jazz music",
    "the Olympic Games", "deserts", "coral reefs", "nuclear energy", "the human heart",
    "inflation", "bicycles", "wind turbines", "penguins", "the Great Wall of China",
    "democracy", "gravity", "the periodic table", "meditation", "video games", "tea",
    "glaciers", "rain forests", "submarines", "airplanes", "batteries", "bread baking",
    "public libraries", "the metric system", "satellites", "dinosaurs", "friendship",
    "time zones", "gardening", "volunteering", "the ocean tides", "recursion in programming",
    "databases", "the binary number system",
    "volcanic islands", "the Renaissance", "origami", "the human brain", "wolves", "bridges",
    "the Silk Road", "thunderstorms", "the Internet", "mushrooms", "marathon running",
    "ancient Egypt", "quantum computing", "composting", "lighthouses", "the Amazon river",
    "photography", "the Industrial Revolution", "octopuses", "elections", "yoga",
    "the speed of light", "chocolate", "trains", "the Arctic", "vaccination campaigns",
    "board games", "typography", "clouds", "the violin", "museums", "the Moon's phases",
    "renewable energy", "ants", "the Pyramids", "public transport", "fermentation",
    "the alphabet", "hurricanes", "open source software", "minimalism", "bees and flowers",
    "the Eiffel Tower", "tigers", "telescopes", "first aid", "rice farming", "the piano",
    "magnets", "supply and demand", "handwriting", "cybersecurity", "sharks",
    "the Milky Way", "pottery", "spreadsheets", "mountains", "the immune response to colds",
)  # fmt: skip
CHAT_TEMPLATES = (
    "Explain {t} in simple terms.",
    "What are three interesting facts about {t}?",
    "Write a short paragraph about {t}.",
    "How would you teach a child about {t}?",
    "What are the pros and cons of {t}?",
    "Give me a brief history of {t}.",
    "Write a haiku about {t}.",
    "Why does {t} matter?",
    "Describe {t} in two sentences.",
    "What do people often get wrong about {t}?",
    "Write a short poem about {t}.",
    "List five words related to {t} and explain each one.",
)
CODE_TASKS = (
    ("is_prime", "n", "Return True if n is a prime number."),
    ("reverse_words", "sentence", "Return the sentence with its words in reverse order."),
    ("count_vowels", "text", "Return the number of vowels in text."),
    ("factorial", "n", "Return n! computed iteratively."),
    ("gcd", "a, b", "Return the greatest common divisor of a and b."),
    ("flatten", "nested", "Flatten a list of lists into one list."),
    ("word_count", "text", "Return a dict mapping each word to how often it occurs."),
    ("is_palindrome", "s", "Return True if s reads the same forwards and backwards."),
    ("celsius_to_fahrenheit", "c", "Convert a temperature from Celsius to Fahrenheit."),
    ("merge_sorted", "a, b", "Merge two sorted lists into one sorted list."),
    ("binary_search", "items, target", "Return the index of target in sorted items, or -1."),
    ("chunk", "items, size", "Split items into lists of at most size elements."),
    ("unique", "items", "Return the items without duplicates, keeping their order."),
    ("read_lines", "path", "Return the lines of a text file without trailing newlines."),
    ("mean", "values", "Return the arithmetic mean of a list of numbers."),
    ("median", "values", "Return the median of a list of numbers."),
    ("transpose", "matrix", "Return the transpose of a matrix given as a list of rows."),
    ("capitalize_words", "text", "Capitalize the first letter of every word."),
    ("fizzbuzz", "n", "Return the FizzBuzz strings for 1..n."),
    ("to_binary", "n", "Return the binary representation of n as a string."),
    ("parse_csv_line", "line", "Split one CSV line into its fields."),
    ("max_subarray", "values", "Return the largest sum of a contiguous subarray."),
    ("rotate", "items, k", "Rotate a list to the right by k positions."),
    ("dedent_lines", "lines", "Remove the common leading whitespace from lines."),
    ("primes_below", "n", "Return all prime numbers below n."),
    ("char_histogram", "text", "Return a dict of character counts."),
    ("safe_divide", "a, b", "Divide a by b, returning None when b is zero."),
    ("clamp", "x, low, high", "Limit x to the range [low, high]."),
    ("running_total", "values", "Return the running totals of a list."),
    ("load_json", "path", "Read a JSON file and return its content."),
)
CODE_STUBS = (
    'def {name}({args}):\n    """{doc}"""\n',
    'from typing import Any\n\n\ndef {name}({args}) -> Any:\n    """{doc}"""\n',
    "# {doc}\ndef {name}({args}):\n",
)
GROUNDED_TEMPLATES = (
    "Summarize the following passage in one sentence.\n\n{p}",
    "List the key facts in this text as bullet points.\n\n{p}",
    "Rewrite the following text in a more casual tone.\n\n{p}",
    "Write a title for this text.\n\n{p}",
    "Which words in this text would a child not know? Explain them.\n\n{p}",
    "Correct any errors in this text and return it.\n\n{p}",
)


@dataclass(frozen=True)
class Prompt:
    text: str
    chat: bool  # goes through the target's chat template
    kind: str = "user"  # where it comes from: templated, self-written, code, grounded, user


def shipped_prompts() -> tuple[list[Prompt], list[Prompt]]:
    """(first-round prompts: chat and code; grounded templates come after, over answers)."""
    chat = [
        Prompt(t.format(t=topic), True, "templated") for topic in TOPICS for t in CHAT_TEMPLATES
    ]
    code = [
        Prompt(stub.format(name=name, args=args, doc=doc), False, "code")
        for name, args, doc in CODE_TASKS
        for stub in CODE_STUBS
    ]
    return chat, code


def grounded_prompts(passages: list[str], seed: int = 0) -> list[Prompt]:
    """Tasks over passages (the target's own first-round answers), one template each."""
    rng = np.random.default_rng(seed)
    return [
        Prompt(
            GROUNDED_TEMPLATES[int(rng.integers(len(GROUNDED_TEMPLATES)))].format(p=p),
            True,
            "grounded",
        )
        for p in passages
    ]


def read_user_prompts(paths: list[Path]) -> list[Prompt]:
    """--prompts files: a JSON list of strings, JSON lines with a "prompt" field, or plain text
    with one prompt per line. Chat prompts."""
    prompts: list[Prompt] = []
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ExportError(f"cannot read {path}: {e}", "pass UTF-8 text or JSON files") from e
        stripped = text.strip()
        if stripped.startswith("["):
            try:
                items = json.loads(stripped)
            except json.JSONDecodeError as e:
                raise ExportError(f"{path} is not a JSON list: {e}") from e
            prompts += [Prompt(str(i), True) for i in items if str(i).strip()]
            continue
        for line in stripped.splitlines():
            line = line.strip()
            if not line:
                continue
            if line.startswith("{"):
                try:
                    line = str(json.loads(line)["prompt"])
                except (json.JSONDecodeError, KeyError, TypeError) as e:
                    raise ExportError(f"{path}: a JSON line without a prompt field: {e}") from e
            prompts.append(Prompt(line, True))
    if not prompts:
        raise ExportError("the --prompts files hold no prompt", "one prompt per line")
    return prompts


@dataclass
class Sequence:
    ids: np.ndarray  # [T] int64: prompt + answer (or a text window)
    first_label: int  # positions before this are context only (the prompt)
    features: np.ndarray | None = None  # [T, F] float16: the taps, concatenated
    top_ids: np.ndarray | None = None  # [T, 8] int32: the target's likeliest next tokens
    top_probs: np.ndarray | None = None  # [T, 8] float16: their probabilities
    kind: str = ""  # its prompt's kind (Prompt.kind), "text" for a window of a text file


def encode_prompt(src: SourceModel, prompt: Prompt) -> list[int]:
    tok = src.tokenizer
    if prompt.chat and getattr(tok, "chat_template", None):
        ids = tok.apply_chat_template(
            [{"role": "user", "content": prompt.text}], add_generation_prompt=True, tokenize=True
        )
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return [int(i) for i in ids]
    return [int(i) for i in tok(prompt.text)["input_ids"]]


def generate_answers(
    src: SourceModel,
    prompts: list[Prompt],
    max_new_tokens: int,
    batch_size: int,
    eos: tuple[int, ...],
    log: Log,
    progress: Any,
) -> list[Sequence]:
    """The target's greedy answers, batched (left padding), shortest prompts together."""
    import torch

    device = next(src.model.parameters()).device
    encoded = [encode_prompt(src, p) for p in prompts]
    order = sorted(range(len(prompts)), key=lambda i: len(encoded[i]))
    pad = src.tokenizer.pad_token_id
    pad = int(pad if pad is not None else (eos[0] if eos else 0))
    out: dict[int, Sequence] = {}
    bar = progress(total=len(prompts), desc="answers", unit="prompt")
    for start in range(0, len(order), batch_size):
        batch = order[start : start + batch_size]
        width = max(len(encoded[i]) for i in batch)
        ids = torch.full((len(batch), width), pad, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, i in enumerate(batch):
            n = len(encoded[i])
            ids[row, width - n :] = torch.tensor(encoded[i])
            mask[row, width - n :] = 1
        with torch.no_grad():
            generated = src.model.generate(
                input_ids=ids.to(device),
                attention_mask=mask.to(device),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=pad,
                eos_token_id=list(eos) or None,
            )
        for row, i in enumerate(batch):
            answer = generated[row, width:].tolist()
            for j, t in enumerate(answer):
                if t in eos:
                    answer = answer[: j + 1]
                    break
            prompt_ids = encoded[i]
            out[i] = Sequence(np.asarray(prompt_ids + answer, np.int64), len(prompt_ids))
        bar.update(len(batch))
    bar.close()
    return [out[i] for i in range(len(prompts))]


def text_windows(src: SourceModel, paths: list[Path], window: int) -> list[Sequence]:
    """--text files as windows of `window` tokens: every position is a label (the target's own
    distributions there are what the head learns)."""
    sequences = []
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ExportError(f"cannot read {path}: {e}", "pass UTF-8 text files") from e
        ids = src.tokenizer(text)["input_ids"]
        for start in range(0, max(1, len(ids) - 8), window):
            part = ids[start : start + window]
            if len(part) >= 8:
                sequences.append(Sequence(np.asarray(part, np.int64), 1, kind="text"))
    return sequences


def record_target(
    src: SourceModel,
    sequences: list[Sequence],
    taps: tuple[int, ...],
    batch_size: int,
    progress: Any,
) -> None:
    """One target pass per sequence: its taps (float16) and top-8 next-token distributions
    (sequences that have them from their generation are left as they are)."""
    import torch

    sequences = [s for s in sequences if s.features is None]
    if not sequences:
        return
    device = next(src.model.parameters()).device
    bar = progress(total=len(sequences), desc="target features", unit="seq")
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i].ids))
    for start in range(0, len(order), batch_size):
        batch = [sequences[i] for i in order[start : start + batch_size]]
        width = max(len(s.ids) for s in batch)
        ids = torch.zeros((len(batch), width), dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, s in enumerate(batch):
            ids[row, : len(s.ids)] = torch.from_numpy(s.ids)
            mask[row, : len(s.ids)] = 1
        with torch.no_grad():
            out = src.model(
                input_ids=ids.to(device), attention_mask=mask.to(device), output_hidden_states=True
            )
            feats = torch.cat([out.hidden_states[t] for t in taps], dim=-1).half().cpu()
            logits = out.logits.float()  # [B, T, vocab]: no softmax over all of it
            top = torch.topk(logits, TOP, dim=-1)
            top_probs = torch.exp(top.values - torch.logsumexp(logits, dim=-1, keepdim=True))
        for row, s in enumerate(batch):
            n = len(s.ids)
            s.features = feats[row, :n].numpy()
            s.top_ids = top.indices[row, :n].int().cpu().numpy()
            s.top_probs = top_probs[row, :n].half().cpu().numpy()
        bar.update(len(batch))
    bar.close()


def save_sequences(sequences: list[Sequence], path: Path) -> None:
    """One .npz of everything (the cache that --resume reads instead of generating again)."""
    lengths = np.array([len(s.ids) for s in sequences], np.int64)
    tmp = path.with_suffix(".tmp.npz")
    np.savez(
        tmp,
        lengths=lengths,
        first_label=np.array([s.first_label for s in sequences], np.int64),
        ids=np.concatenate([s.ids for s in sequences]),
        features=np.concatenate([s.features for s in sequences if s.features is not None]),
        top_ids=np.concatenate([s.top_ids for s in sequences if s.top_ids is not None]),
        top_probs=np.concatenate([s.top_probs for s in sequences if s.top_probs is not None]),
        kinds=np.array([s.kind for s in sequences], dtype=str),
    )
    tmp.replace(path)


def load_sequences(path: Path) -> list[Sequence]:
    with np.load(path) as npz:  # each access to an npz field reads it anew: read each once
        data = {name: npz[name] for name in npz.files}
    out = []
    offset = 0
    kinds = data.get("kinds", np.full(len(data["lengths"]), ""))  # older data has none
    for n, first, kind in zip(data["lengths"], data["first_label"], kinds, strict=True):
        part = slice(offset, offset + int(n))
        out.append(
            Sequence(
                data["ids"][part],
                int(first),
                data["features"][part],
                data["top_ids"][part],
                data["top_probs"][part],
                str(kind),
            )
        )
        offset += int(n)
    return out


def elapsed(t0: float) -> str:
    return f"{time.perf_counter() - t0:.0f} s"
