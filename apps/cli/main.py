"""The `specx` command line: a thin click layer over library functions.

`specx run` uses only the runtime. `specx export` and `specx build` import the exporter (torch,
transformers) lazily, inside the command, so nothing else ever loads it. Commands live beside
this module: export.py, bench.py, serve.py; what they share is in common.py.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import click

from specx.apps.cli.bench import bench
from specx.apps.cli.common import (
    debug_option,
    prefix_config,
    prompt_cache_options,
    provider_option,
    thread_pool,
    threads_option,
    user_errors,
)
from specx.apps.cli.distill import distill
from specx.apps.cli.export import build, export_cmd
from specx.apps.cli.importing import import_cmd
from specx.apps.cli.serve import serve, triton
from specx.runtime.settings import DEFAULT_K
from specx.runtime.verification.sampling import VERIFICATIONS


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="specx")
def main() -> None:
    """specx: deployable speculative decoding (ONNX export + a lean ONNX Runtime engine)."""


def _decode_prompt(data: bytes, where: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        from specx.runtime.errors import InputError

        raise InputError(
            f"{where} is not valid UTF-8 (byte {e.start}: {data[e.start : e.start + 1]!r})",
            "pass the prompt as UTF-8 text",
        ) from e


def _read_prompt(prompt: str | None, prompt_file: Path | None) -> str:
    from specx.runtime.errors import InputError

    if prompt is not None and prompt_file is not None:
        raise InputError("pass either --prompt or --prompt-file, not both")
    if prompt_file is not None:
        try:
            data = prompt_file.read_bytes()
        except OSError as e:
            raise InputError(f"cannot read the prompt file {prompt_file}: {e.strerror}") from e
        return _decode_prompt(data, f"the prompt file {prompt_file}")
    if prompt is None:
        if sys.stdin.isatty():
            raise InputError("no prompt given", "pass --prompt TEXT or --prompt-file PATH")
        return _decode_prompt(sys.stdin.buffer.read(), "standard input")
    return prompt


RUN_HELP = """Generate text from an exported ARTIFACT folder with speculative decoding.

\b
What stays equal to the target alone:
- greedy (temperature 0): every token is the target's argmax over the logits of the pass that
  verified it. A pass over K + 1 tokens may round differently from a one-token pass (other
  matrix shapes, ~1e-6 of a logit), so where the target's two best logits lie closer than that
  (a float near-tie) a token can flip and the texts part from there; different K (and -k auto,
  whose K follows measured timings) can part at such ties, nowhere else.
- sampling: the output follows the target's distribution exactly, and with --seed the text
  depends on the seed alone (invariant verification): the same seed gives the same text for
  every -k, -k auto and every drafter, in any process (float near-ties aside, as above).
  --verification rejection accepts more draft tokens but repeats a seed's text only for the
  same fixed K and drafter.
"""


@main.command(help=RUN_HELP)
@click.argument("artifact", type=click.Path(path_type=Path))
@click.option("-p", "--prompt", help="Prompt text (or use --prompt-file, or stdin).")
@click.option("--prompt-file", type=click.Path(path_type=Path), help="Read the prompt from a file.")
@click.option("--chat", is_flag=True, help="Wrap the prompt in the model's chat template.")
@click.option("--system", help="System message for --chat.")
@click.option(
    "-k",
    "k",
    default=None,
    help="Draft tokens per step: a number (0: target alone) or 'auto'. "
    f"[default: the artifact's profile k_default, else {DEFAULT_K}]",
)
@click.option("--max-k", type=int, default=8, show_default=True, help="Upper bound for -k auto.")
@click.option(
    "--draft-p-min",
    type=float,
    default=0.0,
    show_default=True,
    help="A model draft stops proposing below this top probability (0: never).",
)
@click.option("--no-draft", is_flag=True, help="Run the target alone (same as -k 0).")
@click.option(
    "--draft", "drafter", help="Which drafter to use (see `specx info`). [default: the artifact's]"
)
@click.option("-n", "--max-new-tokens", type=int, default=128, show_default=True)
@click.option("--temperature", type=float, default=0.0, show_default=True, help="0 = greedy.")
@click.option("--top-k", type=int, default=0, show_default=True, help="0 disables.")
@click.option("--top-p", type=float, default=1.0, show_default=True, help="1 disables.")
@click.option("--min-p", type=float, default=0.0, show_default=True, help="0 disables.")
@click.option(
    "--seed", type=int, default=None, help="Seed for sampling: the same seed, the same text."
)
@click.option(
    "--verification",
    type=click.Choice(VERIFICATIONS),
    default=VERIFICATIONS[0],
    show_default=True,
    help="How sampled drafts are checked (see above).",
)
@click.option(
    "--json-schema",
    type=click.Path(path_type=Path),
    help="Structured output: the text is JSON valid against this JSON Schema file.",
)
@click.option(
    "--grammar",
    "grammar_file",
    type=click.Path(path_type=Path),
    help="Structured output: the text follows this grammar (.lark: Lark, llguidance's dialect; "
    ".gbnf: llama.cpp's GBNF; .regex: a regular expression; .json: a JSON Schema).",
)
@click.option("--json-object", is_flag=True, help="Structured output: the text is one JSON object.")
@click.option(
    "--logprobs",
    type=int,
    default=None,
    help="With --json: each token's log-probability and this many alternatives (0..20).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
@click.option(
    "-i",
    "--interactive",
    is_flag=True,
    help="A conversation: one user message per line of standard input (after --prompt, if "
    "given), through the chat template; each turn reuses what the cache holds of the last.",
)
@prompt_cache_options
@provider_option
@threads_option
@debug_option
@user_errors
def run(
    artifact: Path,
    prompt: str | None,
    prompt_file: Path | None,
    chat: bool,
    system: str | None,
    k: str | None,
    max_k: int,
    draft_p_min: float,
    no_draft: bool,
    drafter: str | None,
    max_new_tokens: int,
    temperature: float,
    top_k: int,
    top_p: float,
    min_p: float,
    seed: int | None,
    verification: str,
    json_schema: Path | None,
    grammar_file: Path | None,
    json_object: bool,
    logprobs: int | None,
    as_json: bool,
    interactive: bool,
    prompt_cache_mb: int,
    no_prefix_reuse: bool,
    providers: tuple[str, ...],
    threads: int | None,
    debug: bool,
) -> None:
    from specx.runtime import GenerationSettings, Grammar, InputError, Pipeline, SamplingParams

    given = [
        name
        for name, v in (
            ("--json-schema", json_schema),
            ("--grammar", grammar_file),
            ("--json-object", json_object),
        )
        if v
    ]
    if len(given) > 1:
        raise InputError(f"{' and '.join(given)} both constrain the output", "pass one of them")
    if logprobs is not None and not as_json:
        raise InputError(
            "--logprobs needs --json: logprobs are printed in the JSON result",
            "add --json",
        )
    grammar = None
    if json_schema is not None:
        grammar = Grammar.from_file(json_schema, "json_schema")
    elif grammar_file is not None:
        grammar = Grammar.from_file(grammar_file)
    elif json_object:
        grammar = Grammar.json_object()
    prefix = prefix_config(prompt_cache_mb, no_prefix_reuse)
    text: str | None = prompt if interactive else _read_prompt(prompt, prompt_file)
    settings = GenerationSettings(
        max_new_tokens=max_new_tokens,
        k=0 if no_draft else k,
        max_k=max_k,
        drafter=drafter,
        draft_p_min=draft_p_min,
        sampling=SamplingParams(temperature, top_k, top_p, min_p, seed, verification),
        chat=chat,
        system=system,
        grammar=grammar,
        logprobs=logprobs,
    )
    thread_pool(threads)
    pipeline = Pipeline.load(artifact, providers=providers or None, threads=threads, prefix=prefix)
    if interactive:
        from specx.apps.cli.chat import converse, user_turns

        converse(pipeline, settings, user_turns(text), system, as_json)
        return
    assert text is not None
    generation = pipeline.stream(text, settings)
    interrupted = False
    try:
        for delta in generation:
            if not as_json:
                click.echo(delta, nl=False)
                sys.stdout.flush()  # stream to pipes too, not only to terminals
    except KeyboardInterrupt:
        interrupted = True
        generation.close()
    result = generation.result
    if as_json:
        click.echo(json.dumps(result.to_json(), ensure_ascii=False))
    else:
        click.echo("")
        if result.stats.stop_reason == "max_length":
            click.echo(
                f"note: stopped at the maximum context ({pipeline.manifest.max_length} tokens)",
                err=True,
            )
        if grammar is not None and result.stats.stop_reason in ("max_new_tokens", "max_length"):
            click.echo(
                "note: the token limit came before the grammar was complete: the text may not "
                "parse (raise --max-new-tokens)",
                err=True,
            )
        if interrupted:
            click.echo("note: interrupted", err=True)
        click.echo(result.stats.summary(), err=True)
    if interrupted:
        sys.exit(130)
    if result.stats.stop_reason == "grammar":  # the matcher gave up midway: not the asked text
        raise InputError(result.stats.stop_detail)


@main.command()
@click.argument("artifact", type=click.Path(path_type=Path))
@click.option(
    "--json", "as_json", is_flag=True, help="One JSON object for deployment tools (stable shape)."
)
@debug_option
@user_errors
def info(artifact: Path, as_json: bool, debug: bool) -> None:
    """Describe an exported ARTIFACT: models, drafters, parity, limits, ONNX Runtime needs."""
    from specx.runtime.artifact.contract import Manifest
    from specx.runtime.artifact.facts import artifact_facts

    m = Manifest.read(artifact)
    facts = artifact_facts(m)
    facts["kernels"] = _kernels_here(m)
    if as_json:
        click.echo(json.dumps(facts, indent=2))
        return
    click.echo(f"artifact  {artifact}  (format {m.format_version}, export {m.pair_id})")
    click.echo(
        f"context   {m.max_length} tokens (KV caches of one generation at full context: "
        f"{facts['kv_cache_bytes']['full_context'] / 2**20:.0f} MB); tokenizer "
        f"{m.tokenizer_vocab_size} tokens"
    )
    for spec in (m.target, *m.drafts):
        params = (
            f"imported ({spec.attention} layout)"
            if spec.attention in ("concat", "genai")
            else f"{spec.num_parameters / 1e6:.1f}M params"
        )
        click.echo(
            f"{spec.role:<7} {spec.name:<8} {spec.graph:<12} {spec.architecture:<7} "
            f"{spec.num_layers} layers, {params}, "
            f"{spec.weight_bytes / 1e6:.0f} MB, {spec.variant}; {_quality(spec.parity)}"
        )
        if spec.feature_layers:
            click.echo(f"        returns its hidden states {list(spec.feature_layers)} (features)")
        if spec.head is not None:
            click.echo(
                f"        a feature draft ({spec.head.kind}, {spec.head.layout} layout): reads "
                f"the target's features, scores {spec.head.draft_vocab_size} ids"
            )
    click.echo(f"drafters {', '.join(facts['drafters'])}; default {facts['default_drafter']}")
    ort_needs = facts["onnxruntime"]
    click.echo(
        f"needs    onnxruntime >= {ort_needs['min_version']}; contrib operators: "
        f"{', '.join(ort_needs['contrib_operators']) or 'none'}"
    )
    click.echo(_kernels_line(facts["kernels"]))
    batched = facts["batched"]
    if batched is not None:
        diff = m.batched.parity.get("batch_max_abs_logit_diff") if m.batched else None
        click.echo(
            f"batched  {batched['graph']}: several sequences per pass (specx serve --batch); "
            f"needs onnxruntime >= {batched['min_onnxruntime']}"
            + (f"; two-row parity max|dlogit| {diff:.1e}" if isinstance(diff, float) else "")
        )


def _kernels_here(m: Any) -> dict[str, Any]:
    """Which graphs need the specx kernels library, and whether this machine has it built
    (where it is, its version and the instruction set it dispatches to)."""
    from specx.runtime.errors import ArtifactError
    from specx.runtime.kernels import library

    models = [m.target, *m.drafts, *([m.batched] if m.batched is not None else [])]
    needed = {s.graph: library.uses_kernels(s.operators) for s in models}
    try:
        info, problem = library.describe(), None
    except ArtifactError as e:
        info, problem = None, str(e)
    return {
        "needed_by": sorted(g for g, ops in needed.items() if ops),
        "ops": sorted({op for ops in needed.values() for op in ops}),
        "library": dataclasses.asdict(info) if info is not None else None,
        "problem": problem,
    }


def _kernels_line(k: dict[str, Any]) -> str:
    lib = k["library"]
    here = (
        f"specx kernels {lib['version']} at {lib['path']}, dispatching to {lib['isa']}"
        if lib
        else (k["problem"] or "no specx kernels library built here (scripts/build_kernels.sh)")
    )
    if not k["needed_by"]:
        return f"kernels  ONNX Runtime's own; {here}"
    ops = ", ".join(op.split(":")[1] for op in k["ops"])
    state = "loaded from" if lib else "NOT AVAILABLE:"
    return f"kernels  {', '.join(k['needed_by'])} need specx kernels ({ops}); {state} {here}"


def _quality(parity: dict[str, Any]) -> str:
    """The export's recorded check of a graph, as far as the manifest says it."""

    def number(key: str) -> float | None:
        value = parity.get(key)
        return float(value) if isinstance(value, int | float) else None

    agreement, diff = number("argmax_agreement"), number("max_abs_logit_diff")
    if parity.get("kind") == "import" and agreement is not None and diff is not None:
        return (
            f"a {int(parity.get('check_k', 0)) + 1}-token pass against one-token passes: "
            f"max|dlogit| {diff:.1e}, argmax agrees {100 * agreement:.0f}%"
        )
    if parity.get("kind") == "quantized" and agreement is not None:
        return f"agrees with the target's argmax on {100 * agreement:.0f}% of a text"
    calibration = parity.get("calibration")
    if isinstance(calibration, dict) and "argmax_agreement" in calibration:
        weights = parity.get("weights") or {}
        carried, requantized = weights.get("carried") or {}, weights.get("requantized") or {}
        wide = sum("(wide blocks: requantize" in why for why in requantized.values())
        return (
            f"argmax agrees with its fp32 source on {100 * calibration['argmax_agreement']:.0f}% "
            f"of a text, max|dlogit| {calibration['max_abs_logit_diff']:.2f}"
            + (f"; GGUF blocks carried: {sum(carried.values())}" if carried else "")
            + (f"; wide GGUF blocks requantized: {wide}" if wide else "")
        )
    return f"parity max|dlogit| {diff:.1e}" if diff is not None else "no parity recorded"


@main.command()
@click.argument("name", required=False)
@debug_option
@user_errors
def profiles(name: str | None, debug: bool) -> None:
    """List the deployment profiles, or print one (NAME or a .toml path) after validating it."""
    from specx.profiles import builtin_names, load_profile

    if name:
        p = load_profile(name)
        click.echo(json.dumps(p.to_json(), indent=2))
        return
    click.echo(
        f"{'name':<22}{'precision':<10}{'providers':<24}{'context':>8}{'K':>7}"
        f"{'budget MB':>11}  description"
    )
    for builtin in builtin_names():
        p = load_profile(builtin)
        click.echo(
            f"{p.name:<22}{p.precision:<10}{','.join(p.providers):<24}{p.max_context:>8}"
            f"{f'{p.k_min}-{p.k_max}':>7}{p.budget_mb:>11}  {p.description}"
        )


for command in (export_cmd, import_cmd, build, distill, bench, serve, triton):
    main.add_command(command)


if __name__ == "__main__":  # pragma: no cover
    main()
