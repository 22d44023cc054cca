"""The `specx` command line: a thin click layer over library functions.

`specx run` uses only the runtime. `specx export` and `specx build` import the exporter (torch,
transformers) lazily, inside the command, so nothing else ever loads it.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Any, TypeVar

import click

from specx.runtime.drafters.registry import KINDS
from specx.runtime.errors import SpecxError
from specx.runtime.sampling import VERIFICATIONS
from specx.runtime.settings import DEFAULT_K

F = TypeVar("F", bound=Callable[..., Any])


def _fail(error: BaseException, debug: bool) -> None:
    if debug:
        traceback.print_exception(error)
    if isinstance(error, SpecxError):
        click.echo(f"error: {error.message}", err=True)
        if error.hint:
            click.echo(f"  fix: {error.hint}", err=True)
        sys.exit(error.exit_code)
    click.echo(f"error: {type(error).__name__}: {error}", err=True)
    click.echo("  (this is a bug in specx; run again with --debug for the traceback)", err=True)
    sys.exit(1)


def user_errors(func: F) -> F:
    """Turn SpecxError into a clean message and a non-zero exit (traceback only with --debug)."""

    @wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        debug = bool(kwargs.get("debug"))
        try:
            return func(*args, **kwargs)
        except BrokenPipeError:
            # the reader went away (`specx run ... | head`): stop quietly, like other tools
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            sys.exit(0)
        except SpecxError as e:
            _fail(e, debug)
        except (OSError, ValueError, RuntimeError) as e:
            _fail(e, debug)
        except KeyboardInterrupt:
            click.echo("\ninterrupted", err=True)
            sys.exit(130)

    return wrapper  # type: ignore[return-value]


debug_option = click.option("--debug", is_flag=True, help="Show tracebacks on errors.")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="specx")
def main() -> None:
    """specx: deployable speculative decoding (ONNX export + a lean ONNX Runtime engine)."""


def _thread_pool(threads: int | None) -> None:
    """The CLI's process is its own: one onnxruntime thread pool for target and draft
    (SPECX_THREAD_POOL=session keeps a pool per session)."""
    if os.environ.get("SPECX_THREAD_POOL", "global") == "global":
        from specx.runtime.backends import use_global_thread_pool

        use_global_thread_pool(threads)


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
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
@click.option(
    "--provider", "providers", multiple=True, help="Execution provider(s): cpu, cuda, tensorrt."
)
@click.option("--threads", type=int, default=None, help="Intra-op threads (default: all cores).")
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
    as_json: bool,
    providers: tuple[str, ...],
    threads: int | None,
    debug: bool,
) -> None:
    from specx.runtime import GenerationSettings, Pipeline, SamplingParams

    text = _read_prompt(prompt, prompt_file)
    settings = GenerationSettings(
        max_new_tokens=max_new_tokens,
        k=0 if no_draft else k,
        max_k=max_k,
        drafter=drafter,
        draft_p_min=draft_p_min,
        sampling=SamplingParams(temperature, top_k, top_p, min_p, seed, verification),
        chat=chat,
        system=system,
    )
    _thread_pool(threads)
    pipeline = Pipeline.load(artifact, providers=providers or None, threads=threads)
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
        if interrupted:
            click.echo("note: interrupted", err=True)
        click.echo(result.stats.summary(), err=True)
    if interrupted:
        sys.exit(130)


@main.command()
@click.argument("artifact", type=click.Path(path_type=Path))
@click.option(
    "--json", "as_json", is_flag=True, help="One JSON object for deployment tools (stable shape)."
)
@debug_option
@user_errors
def info(artifact: Path, as_json: bool, debug: bool) -> None:
    """Describe an exported ARTIFACT: models, drafters, parity, limits, ONNX Runtime needs."""
    from specx.runtime.contract import Manifest
    from specx.runtime.facts import artifact_facts

    m = Manifest.read(artifact)
    facts = artifact_facts(m)
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
        click.echo(
            f"{spec.role:<7} {spec.name:<8} {spec.graph:<12} {spec.architecture:<7} "
            f"{spec.num_layers} layers, {spec.num_parameters / 1e6:.1f}M params, "
            f"{spec.weight_bytes / 1e6:.0f} MB, {spec.variant}; {_quality(spec.parity)}"
        )
    click.echo(f"drafters {', '.join(facts['drafters'])}; default {facts['default_drafter']}")
    ort_needs = facts["onnxruntime"]
    click.echo(
        f"needs    onnxruntime >= {ort_needs['min_version']}; contrib operators: "
        f"{', '.join(ort_needs['contrib_operators']) or 'none'}"
    )


def _quality(parity: dict[str, Any]) -> str:
    """The export's recorded check of a graph, as far as the manifest says it."""

    def number(key: str) -> float | None:
        value = parity.get(key)
        return float(value) if isinstance(value, int | float) else None

    agreement, diff = number("argmax_agreement"), number("max_abs_logit_diff")
    if parity.get("kind") == "quantized" and agreement is not None:
        return f"agrees with the target's argmax on {100 * agreement:.0f}% of a text"
    return f"parity max|dlogit| {diff:.1e}" if diff is not None else "no parity recorded"


def _export_draft_help() -> str:
    kinds = "; ".join(
        f"{k.keyword or 'PATH'}: {k.summary}" for k in KINDS.values() if k.name != "self"
    )
    return f"Draft (repeatable; the first is the default). {kinds}."


@main.command()
@click.argument("artifact", type=click.Path(path_type=Path))
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=int, default=8000, show_default=True)
@click.option(
    "--max-concurrency", type=int, default=2, show_default=True, help="Generations at once."
)
@click.option(
    "--max-queue", type=int, default=16, show_default=True, help="Requests waiting; past: 429."
)
@click.option(
    "--timeout",
    "request_timeout_s",
    type=float,
    default=300.0,
    show_default=True,
    help="Seconds a request may take (waiting included).",
)
@click.option("--model-name", default=None, help="The model id clients ask for (default: folder).")
@click.option(
    "--provider", "providers", multiple=True, help="Execution provider(s): cpu, cuda, tensorrt."
)
@click.option("--threads", type=int, default=None, help="Intra-op threads (default: all cores).")
@debug_option
@user_errors
def serve(
    artifact: Path,
    host: str,
    port: int,
    max_concurrency: int,
    max_queue: int,
    request_timeout_s: float,
    model_name: str | None,
    providers: tuple[str, ...],
    threads: int | None,
    debug: bool,
) -> None:
    """Serve ARTIFACT over an OpenAI-compatible HTTP API (/v1/completions, /v1/chat/completions,
    /v1/models, /health, /metrics)."""
    from specx.runtime import Pipeline
    from specx.runtime.errors import InputError

    try:
        import uvicorn

        from specx.apps.serve import ServeConfig, Server
    except ImportError as e:
        raise InputError(
            f"specx serve needs the serve extra ({e.name} is missing)", "pip install 'specx[serve]'"
        ) from e
    if not 1 <= port <= 65535:
        raise InputError(f"--port must be in 1..65535, got {port}")
    if max_concurrency < 1 or max_queue < 0 or not request_timeout_s > 0:
        raise InputError(
            "--max-concurrency must be >= 1, --max-queue >= 0 and --timeout > 0",
            f"got {max_concurrency}, {max_queue}, {request_timeout_s}",
        )
    _thread_pool(threads)
    pipeline = Pipeline.load(artifact, providers=providers or None, threads=threads)
    config = ServeConfig(
        model_name=model_name or Path(artifact).resolve().name,
        max_concurrency=max_concurrency,
        max_queue=max_queue,
        request_timeout_s=request_timeout_s,
    )
    app = Server(pipeline, config).app()
    click.echo(f"serving {config.model_name} on http://{host}:{port}/v1", err=True)
    uvicorn.run(
        app,
        host=host,
        port=port,
        log_level="warning",
        timeout_graceful_shutdown=int(config.shutdown_grace_s),
    )


@main.command()
@click.argument("artifact", type=click.Path(path_type=Path))
@click.option("-o", "--output", required=True, type=click.Path(path_type=Path))
@click.option("--name", default="specx", show_default=True, help="The model's name in Triton.")
@click.option("--instances", type=int, default=1, show_default=True, help="Model instances.")
@click.option("--threads", type=int, default=None, help="Intra-op threads per instance.")
@click.option(
    "--python",
    default=None,
    help="The Python whose environment Triton's Python backend runs specx in (default: this "
    "one; its version must match the backend stub's).",
)
@click.option("--force", is_flag=True, help="Replace an existing repository.")
@debug_option
@user_errors
def triton(
    artifact: Path,
    output: Path,
    name: str,
    instances: int,
    threads: int | None,
    python: str | None,
    force: bool,
    debug: bool,
) -> None:
    """Write a Triton Inference Server model repository that serves ARTIFACT (Python backend,
    decoupled: /v2/models/NAME/generate and generate_stream, gRPC streaming)."""
    from specx.apps.triton.repository import python_environment, write_repository

    model = write_repository(artifact, output, name, instances, threads, force, python)
    env = python_environment(python)
    click.echo(f"wrote {model}", err=True)
    click.echo(
        "start it with:\n"
        f"  PATH={env.prefix}/bin:$PATH PYTHONPATH={':'.join(env.site_packages)} \\\n"
        f"  tritonserver --model-repository {output.resolve()}",
        err=True,
    )


@main.command(name="export")
@click.option("--target", required=True, help="Target: HF folder, .gguf file, or hub id.")
@click.option(
    "--draft",
    "drafts",
    multiple=True,
    help=_export_draft_help(),
)
@click.option("-o", "--output", required=True, type=click.Path(path_type=Path))
@click.option("--max-length", type=int, default=2048, show_default=True, help="Cache capacity.")
@click.option("--check-k", type=int, default=4, show_default=True, help="K of the parity check.")
@click.option("--force", is_flag=True, help="Replace an existing output folder (atomically).")
@click.option("--opset", type=int, default=17, show_default=True)
@click.option(
    "--profile", default=None, help="Deployment profile: a name (specx profiles) or a TOML."
)
@click.option("--engines", is_flag=True, help="Also build TensorRT engines (GPU + TensorRT).")
@click.option(
    "--attention",
    type=click.Choice(["auto", "gqa", "plain"]),
    default="auto",
    show_default=True,
    help="gqa: ONNX Runtime's in-place attention; plain: standard ONNX (TensorRT).",
)
@debug_option
@user_errors
def export_cmd(
    target: str,
    drafts: tuple[str, ...],
    output: Path,
    max_length: int,
    check_k: int,
    force: bool,
    opset: int,
    profile: str | None,
    engines: bool,
    attention: str,
    debug: bool,
) -> None:
    """Export a TARGET (and drafts) to an ONNX artifact folder, checked against the source."""
    from specx.runtime.errors import ExportError

    try:
        from specx.exporter import ExportOptions, export_pair
    except ImportError as e:
        raise ExportError(
            f"the exporter's dependencies are missing ({e.name})",
            "pip install 'specx[export]' (install torch first: pip install torch==2.13.0)",
        ) from e
    options = ExportOptions(
        max_length=max_length,
        check_k=check_k,
        opset=opset,
        force=force,
        profile=profile,
        engines=engines,
        attention=attention,
    )
    manifest = export_pair(
        target, list(drafts), output, options, log=lambda m: click.echo(m, err=True)
    )
    click.echo(f"wrote {output} (export {manifest.pair_id})", err=True)


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


@main.command()
@click.argument("artifact", type=click.Path(path_type=Path))
@click.option(
    "--profile", default=None, help="Profile (default: the one the artifact was exported with)."
)
@debug_option
@user_errors
def build(artifact: Path, profile: str | None, debug: bool) -> None:
    """Build TensorRT engines for an exported ARTIFACT (on the GPU they will run on)."""
    from specx.runtime.errors import ExportError

    try:
        from specx.exporter.engines import rebuild_engines
    except ImportError as e:
        raise ExportError(
            f"building engines needs specx[export] ({e.name})", "pip install 'specx[export]'"
        ) from e
    rebuild_engines(artifact, profile, log=lambda m: click.echo(m, err=True))


def _csv(text: str, kind: type = str, option: str = "") -> tuple[Any, ...]:
    """A comma-separated option's values, each of `kind`."""
    from specx.runtime.errors import InputError

    try:
        return tuple(kind(x) for x in text.split(",") if x.strip())
    except ValueError as e:
        raise InputError(
            f"{option} takes comma-separated {kind.__name__} values, got {text!r}",
            "e.g. --k 1,2,4 or --temperatures 0.7,1.0",
        ) from e


@main.command()
@click.argument("artifact", type=click.Path(path_type=Path))
@click.option("--workloads", default="chat,code,grounded", show_default=True)
@click.option("--drafters", default=None, help="Comma list (default: every draft + ngram).")
@click.option("--k", "ks", default="1,2,3,4,5,6,7,8", show_default=True, help="Fixed K values.")
@click.option("--no-auto", is_flag=True, help="Skip -k auto.")
@click.option("-n", "--max-new-tokens", type=int, default=64, show_default=True)
@click.option("--prompts", "prompts_per_workload", type=int, default=3, show_default=True)
@click.option("--repeats", type=int, default=3, show_default=True)
@click.option("--temperatures", default="0.7,1.0", show_default=True, help="'' skips sampling.")
@click.option("--peers", default="hf,genai", show_default=True, help="'' skips peers.")
@click.option("--hf-source", default=None, help="Model for the transformers peer.")
@click.option("--genai-python", default=None, help="Python of an onnxruntime-genai venv.")
@click.option("--genai-models", default=None, help="Folder from scripts/setup_genai.sh.")
@click.option("--threads", type=int, default=None)
@click.option("--quick", is_flag=True, help="1 prompt per workload, K 1-4, 2 repeats, no peers.")
@click.option("-o", "--out", type=click.Path(path_type=Path), default=None)
@click.option(
    "--from-json",
    "from_json",
    type=click.Path(path_type=Path),
    default=None,
    help="Re-render the table and plot of an earlier results.json (runs nothing).",
)
@debug_option
@user_errors
def bench(
    artifact: Path,
    workloads: str,
    drafters: str | None,
    ks: str,
    no_auto: bool,
    max_new_tokens: int,
    prompts_per_workload: int,
    repeats: int,
    temperatures: str,
    peers: str,
    hf_source: str | None,
    genai_python: str | None,
    genai_models: str | None,
    threads: int | None,
    quick: bool,
    out: Path | None,
    from_json: Path | None,
    debug: bool,
) -> None:
    """Benchmark ARTIFACT: target alone vs every drafter and K, costs, peers; table+JSON+PNG."""
    import time

    from specx.apps.bench import (
        BenchConfig,
        add_predictions,
        format_report,
        plot,
        run_bench,
        stderr_progress,
    )

    if from_json is not None:
        results = json.loads(from_json.read_text())
        add_predictions(results)
        folder = out or from_json.parent
        report = format_report(results)
        (folder / "report.txt").write_text(report + "\n")
        (folder / "results.json").write_text(json.dumps(results, indent=1))
        click.echo(report)
        plot(results, folder / "speedup.png")
        return

    config = BenchConfig(
        artifact=artifact,
        workloads=_csv(workloads),
        drafters=_csv(drafters) if drafters else None,
        ks=(1, 2, 3, 4) if quick else _csv(ks, int, "--k"),
        auto=not no_auto,
        max_new_tokens=max_new_tokens,
        prompts_per_workload=1 if quick else prompts_per_workload,
        repeats=2 if quick else repeats,
        temperatures=() if quick else _csv(temperatures, float, "--temperatures"),
        peers=() if quick else _csv(peers),
        hf_source=hf_source,
        genai_python=genai_python,
        genai_models=genai_models,
        threads=threads,
    )
    _thread_pool(threads)
    results = run_bench(config, stderr_progress)
    click.echo("", err=True)
    folder = out or Path("bench-results") / time.strftime("%Y%m%d-%H%M%S")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.json").write_text(json.dumps(results, indent=1))
    report = format_report(results)
    (folder / "report.txt").write_text(report + "\n")
    click.echo(report)
    png = plot(results, folder / "speedup.png")
    click.echo(
        f"\nwrote {folder / 'results.json'}, {folder / 'report.txt'}"
        + (f", {png}" if png else " (no matplotlib: no plot)"),
        err=True,
    )


if __name__ == "__main__":  # pragma: no cover
    main()
