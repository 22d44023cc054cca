"""`specx serve` (an OpenAI-compatible server) and `specx triton` (a Triton model repository)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from specx.apps.cli.common import (
    debug_option,
    prefix_config,
    prompt_cache_options,
    provider_option,
    thread_pool,
    threads_option,
    user_errors,
)

# `specx serve --grammar-*` -> (GrammarLimits field, what it bounds); defaults: GrammarLimits'
GRAMMAR_FLAGS = {
    "--grammar-row-items": ("max_items_in_row", "Earley items in one parser row (alternatives)"),
    "--grammar-step-items": ("step_max_items", "Earley items one token's mask may create"),
    "--grammar-lexer-fuel": (
        "initial_lexer_fuel",
        "lexer work to build a grammar (per token: 1/5)",
    ),
    "--grammar-size": ("max_grammar_size", "symbols in a grammar's productions"),
    "--grammar-bytes": ("max_source_bytes", "bytes of a schema's or grammar's text"),
}


def grammar_options(func: Any) -> Any:
    """The flags that bound what a request's grammar may cost (docs/structured-output.md)."""
    from specx.runtime.grammar_limits import DEFAULT_LIMITS

    for flag, (field, what) in reversed(GRAMMAR_FLAGS.items()):
        default = getattr(DEFAULT_LIMITS, field)
        func = click.option(flag, type=int, default=default, show_default=True, help=what)(func)
    return click.option(
        "--grammar-timeout",
        type=float,
        default=10.0,
        show_default=True,
        help="Seconds a request's grammar may take to compile and check; past: 400.",
    )(func)


def grammar_config(options: dict[str, Any]) -> dict[str, Any]:
    """ServeConfig's grammar fields from the --grammar-* flags."""
    import dataclasses

    from specx.runtime.errors import InputError
    from specx.runtime.grammar_limits import DEFAULT_LIMITS

    values = {f: options[flag[2:].replace("-", "_")] for flag, (f, _) in GRAMMAR_FLAGS.items()}
    fuel = values["initial_lexer_fuel"]
    values.update(step_lexer_fuel=max(1, fuel // 5), max_lexer_states=max(1, fuel // 4))
    timeout = options["grammar_timeout"]
    if not timeout > 0:
        raise InputError(f"--grammar-timeout must be > 0, got {timeout}")
    limits = dataclasses.replace(DEFAULT_LIMITS, **values)
    return {"grammar_limits": limits, "grammar_timeout_s": timeout}


@click.command()
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
    "--batch",
    type=int,
    default=0,
    show_default=True,
    help="Sequences sharing each target pass (0: each generation alone). Needs export --batched.",
)
@click.option(
    "--batch-context",
    type=int,
    default=None,
    help="Positions of a batch row (default: the context, at most 1024); longer requests run "
    "alone.",
)
@click.option(
    "--api-key",
    "api_keys",
    multiple=True,
    envvar="SPECX_API_KEY",
    help="Require 'Authorization: Bearer KEY' on /v1/* (repeatable; env SPECX_API_KEY). "
    "/health and /metrics stay open.",
)
@click.option(
    "--api-key-file",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Read API keys from a file, one a line (keeps them out of the process list).",
)
@grammar_options
@prompt_cache_options
@provider_option
@threads_option
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
    batch: int,
    batch_context: int | None,
    api_keys: tuple[str, ...],
    api_key_file: Path | None,
    providers: tuple[str, ...],
    threads: int | None,
    debug: bool,
    prompt_cache_mb: int,
    no_prefix_reuse: bool,
    **grammar: Any,
) -> None:
    """Serve ARTIFACT over an OpenAI-compatible HTTP API (/v1/completions, /v1/chat/completions,
    /v1/models, /health, /metrics)."""
    from specx.runtime import Pipeline
    from specx.runtime.errors import InputError

    try:
        import uvicorn

        from specx.apps.serve import ServeConfig, Server
        from specx.apps.serve.auth import read_keys
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
    if batch < 0 or (batch and max_concurrency < batch):
        raise InputError(
            f"--batch must be >= 0 and at most --max-concurrency, got {batch} and "
            f"{max_concurrency}",
            f"pass --max-concurrency {max(batch, 1)} or more (requests beyond --batch wait for "
            "a row)",
        )
    keys = read_keys(api_keys, api_key_file)  # before loading: a bad key file fails fast
    prefix = prefix_config(prompt_cache_mb, no_prefix_reuse)
    grammars = grammar_config(grammar)
    thread_pool(threads)
    pipeline = Pipeline.load(artifact, providers=providers or None, threads=threads, prefix=prefix)
    if batch:
        pipeline.enable_batching(batch, batch_context)
    config = ServeConfig(
        model_name=model_name or Path(artifact).resolve().name,
        max_concurrency=max_concurrency,
        max_queue=max_queue,
        request_timeout_s=request_timeout_s,
        api_keys=keys,
        **grammars,
    )
    app = Server(pipeline, config).app()
    guarded = f" ({len(keys)} API key{'s' if len(keys) > 1 else ''} required)" if keys else ""
    click.echo(f"serving {config.model_name} on http://{host}:{port}/v1{guarded}", err=True)
    uvicorn.run(
        app,
        host=host,
        port=port,
        log_level="warning",
        timeout_graceful_shutdown=int(config.shutdown_grace_s),
    )


@click.command()
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
@click.option(
    "--batch",
    type=int,
    default=0,
    show_default=True,
    help="Sequences sharing each target pass (0: requests one at a time). Needs export --batched.",
)
@click.option("--batch-context", type=int, default=None, help="Positions of a batch row.")
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
    batch: int,
    batch_context: int | None,
    debug: bool,
) -> None:
    """Write a Triton Inference Server model repository that serves ARTIFACT (Python backend,
    decoupled: /v2/models/NAME/generate and generate_stream, gRPC streaming)."""
    from specx.apps.triton.repository import python_environment, write_repository

    model = write_repository(
        artifact, output, name, instances, threads, force, python, batch, batch_context
    )
    env = python_environment(python)
    click.echo(f"wrote {model}", err=True)
    click.echo(
        "start it with:\n"
        f"  PATH={env.prefix}/bin:$PATH PYTHONPATH={':'.join(env.site_packages)} \\\n"
        f"  tritonserver --model-repository {output.resolve()}",
        err=True,
    )
