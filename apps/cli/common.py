"""What every `specx` command shares: clean errors (exit 2, no traceback unless --debug) and
the common options."""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

import click

from specx.runtime.errors import SpecxError

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
provider_option = click.option(
    "--provider", "providers", multiple=True, help="Execution provider(s): cpu, cuda, tensorrt."
)
threads_option = click.option(
    "--threads", type=int, default=None, help="Intra-op threads (default: all cores)."
)


def thread_pool(threads: int | None) -> None:
    """The CLI's process is its own: one onnxruntime thread pool for target and draft
    (SPECX_THREAD_POOL=session keeps a pool per session)."""
    if os.environ.get("SPECX_THREAD_POOL", "global") == "global":
        from specx.runtime.backends import use_global_thread_pool

        use_global_thread_pool(threads)


def prompt_cache_options(func: F) -> F:
    """--prompt-cache-mb and --no-prefix-reuse: how prompts are kept between generations
    (runtime/prefix); the command turns them into a PrefixConfig with prefix_config."""
    from specx.runtime.prefix.cache import DEFAULT_STORE_MB

    func = click.option(
        "--no-prefix-reuse",
        is_flag=True,
        help="Read every prompt whole: no cache keeps a prompt for a later one.",
    )(func)
    return click.option(
        "--prompt-cache-mb",
        type=int,
        default=DEFAULT_STORE_MB,
        show_default=True,
        help="Host memory for prompts whose caches went to other prompts, brought back when a "
        "later prompt starts with one (0: off).",
    )(func)


def prefix_config(prompt_cache_mb: int, no_prefix_reuse: bool) -> Any:
    """The PrefixConfig of prompt_cache_options' flags (InputError for a negative size)."""
    from specx.runtime.prefix import PrefixConfig

    return PrefixConfig(reuse=not no_prefix_reuse, store_mb=prompt_cache_mb)
