"""libspecx keeps what the Python runtime keeps between generations, and decides as it does.

A C context (specx_context) runs a conversation as a Python pipeline does: every turn the same
ids, the same prompt tokens kept from the turn before, and with a fixed K the same passes; the
suffix drafter proposes from the same history in both; -k auto's policy (src/adaptive.cc) answers
a scripted run decision for decision as runtime/decode/adaptive.py does."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from libspecx_tools import K_AUTO, Library, binary, library_path

from conftest import TinyPair, needs_exporter
from specx.runtime import Pipeline
from specx.runtime.decode.adaptive import AdaptiveK
from specx.runtime.decode.policy import StepResult

pytestmark = needs_exporter


@pytest.fixture(scope="module")
def lib() -> Library:
    if not library_path().is_file():
        pytest.skip("libspecx is not built (scripts/build_libspecx.sh)")
    return Library()


def turns(seed: int, generate: Any, n: int = 3) -> list[Any]:
    """n turns of a conversation of ids: each prompt = the last prompt, its answer, 5 new ids."""
    rng = np.random.default_rng(seed)
    prompt = rng.integers(3, 300, size=9).tolist()
    out = []
    for _ in range(n):
        result = generate(prompt)
        out.append(result)
        answer = result.tokens if hasattr(result, "tokens") else result.token_ids
        prompt = prompt + list(answer) + rng.integers(3, 300, size=5).tolist()
    return out


@pytest.mark.parametrize(
    ("drafter", "k", "sampling"),
    [
        ("none", 0, {}),
        ("ngram", 3, {}),
        ("suffix", 4, {}),
        ("mixed", 3, {}),
        ("suffix+mixed", 2, {}),
        ("suffix", 3, {"temperature": 0.9, "seed": 7}),
        ("mixed", K_AUTO, {}),
        ("suffix", K_AUTO, {}),
    ],
)
def test_a_conversation_in_a_c_context_is_the_pythons_turn_for_turn(
    lib: Library, llama_pair: TinyPair, drafter: str, k: int, sampling: dict[str, Any]
) -> None:
    model = lib.load(llama_pair.artifact)
    context = model.context()
    pipe = Pipeline.load(llama_pair.artifact)
    py_k = "auto" if k == K_AUTO else k
    try:
        got = turns(1, lambda p: context.generate(p, 14, k, drafter, **sampling))
        want = turns(
            1, lambda p: pipe.generate(p, max_new_tokens=14, k=py_k, drafter=drafter, **sampling)
        )
    finally:
        context.close()
        model.close()
    for turn, (c, py) in enumerate(zip(got, want, strict=True)):
        where = f"{drafter}, K={py_k}, turn {turn}"
        assert c.tokens == py.token_ids, where
        assert c.stats["reused_prompt_tokens"] == py.stats.reused_prompt_tokens, where
        assert c.stats["prompt_tokens"] == py.stats.prompt_tokens, where
        if k != K_AUTO:  # passes follow the same proposals (-k auto's follow measured times)
            assert c.stats["target_passes"] == py.stats.target_passes, where
            assert c.stats["proposed"] == py.stats.proposed, where
    assert got[2].stats["reused_prompt_tokens"] > 0


def test_suffix_drafting_reads_the_same_history_in_c_and_python(
    lib: Library, llama_pair: TinyPair
) -> None:
    """A request repeated: both runtimes draft it from the first one's output, pass for pass;
    another scope has no history in either."""
    model = lib.load(llama_pair.artifact)
    pipe = Pipeline.load(llama_pair.artifact)
    prompt = np.random.default_rng(2).integers(3, 300, size=15).tolist()
    try:
        for scope in ("", "", "b"):
            c = model.generate(prompt, 48, 16, "suffix", cache_scope=scope)
            py = pipe.generate(prompt, max_new_tokens=48, k=16, drafter="suffix", cache_scope=scope)
            assert c.tokens == py.token_ids
            assert c.stats["target_passes"] == py.stats.target_passes, scope
            assert c.stats["accepted"] == py.stats.accepted, scope
        assert c.stats["target_passes"] == 48  # scope b: nothing to draft from
    finally:
        model.close()


def script(seed: int, steps: int = 400) -> list[str]:
    """A scripted -k auto run: sources, drafts, acceptance and times drawn at random, generations
    inheriting from the one before, prompts read, drafting plans asked."""
    rng = np.random.default_rng(seed)
    lines = ["new 8", "ratio 0.2", "lazy 1", f"prefill 40 {0.005 * 40 * rng.uniform(0.8, 1.2)!r}"]
    for _ in range(3):  # a dear draft model's first proposals all rejected (MIN_JUDGED's case)
        lines += ["decide model 1 150", f"observe model|{[0.5] * 8!r}|0.0|1.0|5.0"]
    for step in range(steps):
        if step and step % 90 == 0:
            lines += ["inherit", "ratio 0.2", "lazy 1", f"prefill 25 {rng.uniform(0.1, 0.2)!r}"]
        source = str(rng.choice(["model", "lookup3", "lookup16", "none"], p=[0.4, 0.3, 0.2, 0.1]))
        behind = int(rng.choice([1, 2, 6, 300])) if source == "model" else 0
        lines.append(f"decide {source} {behind} {int(rng.integers(5, 200))}")
        tops = rng.uniform(0.05, 1.0, size=8).tolist()
        lines += [f"plan {i} {top!r}" for i, top in enumerate(tops[:3])]
        # the step's draw: its proposal is the K decided, the rest follows from these
        u, noise = rng.uniform(0, 1), rng.uniform(0.7, 1.3)
        lines.append(f"observe {source}|{tops!r}|{u!r}|{noise!r}|1.0|{behind}")
    return lines


def run_python(lines: list[str]) -> list[str]:
    """runtime/decode/adaptive.py fed the script; what it answers, and the commands as run."""
    out: list[str] = []
    policy: AdaptiveK | None = None
    plan: Any = None
    k = 0
    for line in lines:
        word, *args = line.split(" ", 1)
        rest = args[0] if args else ""
        if word == "new":
            policy = AdaptiveK(max_k=int(rest))
        elif word == "inherit":
            assert policy is not None
            fresh = AdaptiveK(max_k=policy.max_k)
            fresh.inherit(policy)
            policy = fresh
        elif word == "ratio":
            assert policy is not None
            policy.draft_ratio = float(rest)
        elif word == "lazy":
            assert policy is not None
            policy.lazy_draft = rest == "1"
        elif word == "prefill":
            assert policy is not None
            tokens, seconds = rest.split()
            policy.observe_prefill(int(tokens), float(seconds))
        elif word == "decide":
            assert policy is not None
            source, behind, left = rest.split()
            decision = policy.decide(source, True, int(behind), int(left))
            k, plan = decision.k, decision.plan
            out.append(f"{k}")
        elif word == "plan":
            position, top = rest.split()
            take, more = plan(int(position), float(top)) if plan is not None else (True, True)
            out.append(f"{int(take)} {int(more)}")
        elif word == "observe":
            assert policy is not None
            policy.observe(observed(rest, k))
    return out


def observed(rest: str, k: int) -> StepResult:
    # dear: the draft's cost, times; behind: the committed tokens a model draft reads first
    head, tops_text, u, noise, *extra = rest.split("|")
    dear = float(extra[0]) if extra else 1.0
    behind = int(extra[1]) if len(extra) > 1 else 1
    source = head.split()[0]
    tops = [float(t) for t in tops_text.strip("[]").split(",")]
    proposed = k
    accepted = int(float(u) * (proposed + 1)) if proposed else 0
    model = source == "model"
    per_token = 0.004 * float(noise) * dear
    catchup = max(1, behind) if model and proposed else 0
    draft = (per_token * proposed + 0.0015 * catchup * float(noise)) if proposed else 0.0
    verify = 0.03 * float(noise) + 0.003 * proposed
    hit = None
    if not proposed and source.startswith("lookup"):
        hit = float(u) > 0.5
    confidence = np.asarray(tops[:proposed]) if proposed and source != "lookup3" else None
    return StepResult(
        np.zeros(accepted + 1, np.int64),
        source,
        proposed,
        accepted,
        draft,
        verify,
        proposed if model else 0,
        catchup,
        confidence,
        hit,
        k,
    )


def as_command(rest: str, k: int) -> str:
    """The observe line the C program reads for the step Python observed."""
    step = observed(rest, k)
    hit = -1 if step.lookup_first_hit is None else int(step.lookup_first_hit)
    tops = "" if step.confidence is None else " ".join(repr(float(t)) for t in step.confidence)
    return (
        f"observe {step.source} {step.proposed} {step.accepted} {step.draft_s!r} "
        f"{step.verify_s!r} {step.catchup} {hit} {tops}"
    ).rstrip()


def run_c(lines: list[str], program: Path) -> list[str]:
    """The C policy fed the same script, one command at a time (an observe needs the K it
    decided)."""
    proc = subprocess.Popen(
        [str(program)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1
    )
    assert proc.stdin is not None and proc.stdout is not None
    out: list[str] = []
    k = 0
    try:
        for line in lines:
            word, _, rest = line.partition(" ")
            command = as_command(rest, k) if word == "observe" else line
            proc.stdin.write(command + "\n")
            proc.stdin.flush()
            if word in ("decide", "plan"):
                answer = proc.stdout.readline().strip()
                out.append(answer)
                if word == "decide":
                    k = int(answer)
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
    assert proc.returncode == 0
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_k_auto_in_c_decides_as_python_decision_for_decision(seed: int) -> None:
    program = binary("adaptive_trace")
    if not program.is_file():
        pytest.skip("adaptive_trace is not built (scripts/build_libspecx.sh)")
    lines = script(seed)
    want = run_python(lines)
    got = run_c(lines, program)
    assert len(got) == len(want)
    first = next((i for i, (a, b) in enumerate(zip(got, want, strict=True)) if a != b), None)
    assert first is None, f"answer {first}: C {got[first]}, Python {want[first]}"
    ks = [
        int(a)
        for a, line in zip(
            want, [ln for ln in lines if ln.split()[0] in ("decide", "plan")], strict=True
        )
        if line.startswith("decide")
    ]
    assert 0 in ks and max(ks) > 2  # the script reaches both plain and long steps
