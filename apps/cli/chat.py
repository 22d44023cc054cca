"""`specx run --interactive`: a conversation on the terminal (or a pipe), one user turn per line.

Each turn sends the whole conversation through the model's chat template, as a chat client does,
and the pipeline keeps what its cache holds of the last turn (runtime/prefix): a turn reads only
the new message, and the stats line says how many prompt tokens were kept.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from typing import Any

import click

from specx.runtime import GenerationSettings, InputError, Pipeline


def converse(
    pipeline: Pipeline,
    settings: GenerationSettings,
    turns: Iterable[str],
    system: str | None,
    as_json: bool,
) -> None:
    """Answer each user turn in `turns` (blank ones skipped) in one conversation."""
    if not pipeline.codec.chat_template:
        raise InputError(
            "--interactive needs the model's chat template, and this artifact has none",
            "export an instruct model, or run single prompts without --interactive",
        )
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    settings = GenerationSettings.of(settings, chat=False, system=None)  # rendered here
    for turn in turns:
        text = turn.strip()
        if not text:
            continue
        messages.append({"role": "user", "content": text})
        prompt = pipeline.codec.encode_messages(messages)
        generation = pipeline.stream(prompt, settings)
        for delta in generation:
            if not as_json:
                click.echo(delta, nl=False)
                sys.stdout.flush()
        result = generation.result
        messages.append({"role": "assistant", "content": result.text})
        if as_json:
            click.echo(json.dumps(result.to_json(), ensure_ascii=False))
            continue
        stats = result.stats
        click.echo("")
        click.echo(
            f"[turn {len(messages) // 2}: {stats.prompt_tokens} prompt tokens, "
            f"{stats.reused_prompt_tokens} kept from before] {stats.summary()}",
            err=True,
        )


def user_turns(first: str | None) -> Iterable[str]:
    """The first turn (--prompt, if given), then one turn per line of standard input."""
    if first:
        yield first
    if sys.stdin.isatty():
        click.echo("(one message per line; Ctrl-D ends the conversation)", err=True)
    yield from sys.stdin
