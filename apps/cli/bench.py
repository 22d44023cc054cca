"""`specx bench`: the benchmark's command line (the work is in apps/bench/)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from specx.apps.cli.common import debug_option, thread_pool, user_errors


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


@click.command()
@click.argument("artifact", type=click.Path(path_type=Path))
@click.option("--workloads", default="chat,code,grounded", show_default=True)
@click.option("--drafters", default=None, help="Comma list (default: every draft + ngram).")
@click.option("--k", "ks", default="1,2,3,4,5,6,7,8", show_default=True, help="Fixed K values.")
@click.option("--no-auto", is_flag=True, help="Skip -k auto.")
@click.option("-n", "--max-new-tokens", type=int, default=64, show_default=True)
@click.option("--prompts", "prompts_per_workload", type=int, default=3, show_default=True)
@click.option("--repeats", type=int, default=3, show_default=True)
@click.option("--temperatures", default="0.7,1.0", show_default=True, help="'' skips sampling.")
@click.option("--peers", default="hf,genai,llama.cpp", show_default=True, help="'' skips peers.")
@click.option("--hf-source", default=None, help="Model for the transformers peer.")
@click.option("--genai-python", default=None, help="Python of an onnxruntime-genai venv.")
@click.option(
    "--genai-models",
    default=None,
    help="A pair from scripts/setup_genai.sh (default: built from the artifact's target).",
)
@click.option(
    "--llama-server", default=None, help="llama.cpp's llama-server (scripts/setup_llamacpp.sh)."
)
@click.option("--threads", type=int, default=None)
@click.option("--quick", is_flag=True, help="1 prompt per workload, K 1-4, 2 repeats, no peers.")
@click.option(
    "--concurrency",
    default=None,
    help="Request counts, e.g. 1,2,4,8: the batched benchmark instead (needs export --batched).",
)
@click.option(
    "--sessions",
    default=None,
    help="Conversation workloads, e.g. code-edit,chat,grounded: the multi-turn benchmark "
    "instead (each turn sends the whole conversation; --drafters picks the -k auto modes, "
    "--peers llama.cpp adds llama-server with its prompt cache).",
)
@click.option(
    "--max-k", type=int, default=16, show_default=True, help="-k auto's most K (sessions)."
)
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
    llama_server: str | None,
    threads: int | None,
    quick: bool,
    concurrency: str | None,
    sessions: str | None,
    max_k: int,
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
        llama_server=llama_server,
        threads=threads,
    )
    thread_pool(threads)
    if concurrency:
        _concurrency(config, _csv(concurrency, int, "--concurrency"), out)
        return
    if sessions:
        _sessions(config, _csv(sessions), max_k, out)
        return
    results = run_bench(config, stderr_progress)
    folder = out or Path("bench-results") / time.strftime("%Y%m%d-%H%M%S")
    _write(folder, results, format_report(results), "results.json", "report.txt")
    png = plot(results, folder / "speedup.png")
    click.echo(f"wrote {folder}" + ("" if png else " (no matplotlib: no plot)"), err=True)


def _write(folder: Path, results: dict[str, Any], report: str, data: str, text: str) -> None:
    """Results as JSON and the report as text into `folder`; the report on stdout."""
    click.echo("", err=True)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / data).write_text(json.dumps(results, indent=1))
    (folder / text).write_text(report + "\n")
    click.echo(report)


def _sessions(config: Any, names: tuple[str, ...], max_k: int, out: Path | None) -> None:
    import time

    from specx.apps.bench import stderr_progress
    from specx.apps.bench.sessions import format_sessions, run_session_bench
    from specx.runtime.errors import InputError
    from specx.runtime.settings import MAX_K

    if not 1 <= max_k <= MAX_K:
        raise InputError(f"--max-k must be in 1..{MAX_K}, got {max_k}")
    results = run_session_bench(
        config.artifact,
        names,
        config.drafters,
        config.peers,
        config.llama_server,
        config.threads,
        max_k,
        stderr_progress,
    )
    folder = out or Path("bench-results") / time.strftime("sessions-%Y%m%d-%H%M%S")
    _write(folder, results, format_sessions(results), "sessions.json", "sessions.txt")
    click.echo(f"wrote {folder}", err=True)


def _concurrency(config: Any, levels: tuple[int, ...], out: Path | None) -> None:
    import time

    from specx.apps.bench import stderr_progress
    from specx.apps.bench.concurrency import (
        format_concurrency,
        plot_concurrency,
        run_concurrency_bench,
    )

    results = run_concurrency_bench(config, levels, stderr_progress)
    folder = out or Path("bench-results") / time.strftime("concurrency-%Y%m%d-%H%M%S")
    report = format_concurrency(results)
    _write(folder, results, report, "concurrency.json", "concurrency.txt")
    png = plot_concurrency(results, folder / "concurrency.png")
    click.echo(f"wrote {folder}" + ("" if png else " (no matplotlib: no plot)"), err=True)
