"""README.md's quick start, run as written, and every `specx` command in the README and docs/
parsed by the CLI, so that a renamed flag or subcommand fails here rather than for a reader.

The quick start's fenced bash blocks go through bash with `set -euo pipefail`, in a scratch
folder, with the real `specx` on PATH. Only what needs the network or minutes is stood in for:
scripts/fetch_smollm2.sh and scripts/fetch_qwen_coder.sh print tiny GGUF files' paths (a Llama
for SmolLM2, a Qwen2 pair for the Qwen pair: the same architectures), `.venv/bin/activate` puts
the test's `specx` on PATH (scripts/test.sh has just run scripts/setup.sh), and the server's port
is a free one. Its Python blocks run in the same folder afterwards.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import socket
import stat
import subprocess
import sys
from pathlib import Path

import click
import pytest

from conftest import needs_exporter
from specx.apps.cli.main import main

pytestmark = needs_exporter

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def section(text: str, heading: str) -> str:
    """The text under `## heading`, up to the next heading of that level."""
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else len(text)]


def blocks(text: str, language: str) -> list[str]:
    return [body for lang, body in FENCE.findall(text) if lang == language]


OPERATORS = {"&", "&&", "|", "||", ";", ">", ">>", "2>", "<"}


def specx_commands(script: str) -> list[list[str]]:
    """Each `specx ...` command of a bash block as argv after `specx`: continuation lines
    joined, comments and `...` placeholders dropped, cut at the first shell operator (written
    apart, as in the docs), $VARIABLES left as words."""
    commands = []
    for line in script.replace("\\\n", " ").splitlines():
        if line.split()[:1] != ["specx"]:
            continue
        words = shlex.split(line, comments=True)
        ends = [i for i, w in enumerate(words) if w in OPERATORS]
        commands.append([w for w in words[1 : min(ends, default=len(words))] if w != "..."])
    return commands


def parse(argv: list[str]) -> None:
    """Parse argv as the CLI would, running nothing: click.UsageError on an unknown command,
    option or choice, or a missing argument."""
    parent = click.Context(main, info_name="specx")
    command = main.get_command(parent, argv[0])
    if command is None:
        raise click.UsageError(f"no such command {argv[0]!r}")
    with command.make_context(argv[0], argv[1:], parent=parent):
        pass


def test_every_specx_command_in_the_readme_and_docs_parses() -> None:
    checked = 0
    for path in [README, *DOCS]:
        for script in blocks(path.read_text(encoding="utf-8"), "bash"):
            for argv in specx_commands(script):
                try:
                    parse(argv)
                except click.ClickException as e:
                    pytest.fail(f"{path.name}: specx {shlex.join(argv)}: {e.format_message()}")
                checked += 1
    assert checked >= 40  # the README's quick start and results, and the docs' examples


def test_a_misspelled_flag_or_subcommand_fails_the_parse() -> None:
    """Negative control for the test above: the checker does reject what the CLI rejects."""
    quick = section(README.read_text(encoding="utf-8"), "Quick start")
    argv = next(a for a in specx_commands(blocks(quick, "bash")[0]) if a[0] == "export")
    parse(argv)
    for broken in (
        [argv[0], *(w.replace("--batched", "--batchd") for w in argv[1:])],
        ["exprot", *argv[1:]],
        [*argv, "--precision", "int3"],
    ):
        with pytest.raises(click.UsageError):
            parse(broken)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _executable(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def _scratch(folder: Path) -> None:
    """The stand-ins: tiny GGUF files behind the fetch scripts, `specx` on PATH."""
    from gguf_models import write_gguf

    models = folder / "models"
    models.mkdir()
    llama = write_gguf(models / "llama.gguf", "llama", seed=1, head=None)
    target = write_gguf(models / "target.gguf", "qwen2", seed=0)
    draft = write_gguf(models / "draft.gguf", "qwen2", seed=0, redraw=("blk.1.ffn_down.weight",))
    _executable(folder / "scripts" / "fetch_smollm2.sh", f"#!/bin/sh\necho {llama}\n")
    _executable(
        folder / "scripts" / "fetch_qwen_coder.sh", f"#!/bin/sh\necho {draft}\necho {target}\n"
    )
    _executable(
        folder / "bin" / "specx", f'#!/bin/sh\nexec {sys.executable} -m specx.apps.cli.main "$@"\n'
    )
    activate = folder / ".venv" / "bin" / "activate"
    activate.parent.mkdir(parents=True)
    activate.write_text(f'export PATH="{folder / "bin"}:$PATH"\n')


def test_the_readme_quick_start_runs_as_written_on_tiny_models(tmp_path: Path) -> None:
    pytest.importorskip("gguf")
    pytest.importorskip("uvicorn")
    assert shutil.which("curl"), "the README's serve example needs curl"
    quick = section(README.read_text(encoding="utf-8"), "Quick start")
    for script in re.findall(r"scripts/[\w./-]+\.sh", quick):  # what the stand-ins replace
        assert os.access(ROOT / script, os.X_OK), f"the README names {script}, which is missing"
    _scratch(tmp_path)
    port = _free_port()
    bash = "\n".join(blocks(quick, "bash")).replace("8000", str(port))
    assert "specx serve" in bash and "specx export" in bash and "specx run" in bash
    env = {k: v for k, v in os.environ.items() if k != "SPECX_THREAD_POOL"}  # the CLI default
    env["HF_HUB_OFFLINE"] = "1"
    # a server left by a failed step is stopped with the shell
    prelude = "set -euo pipefail\ntrap 'kill $(jobs -p) 2> /dev/null || true' EXIT\n"
    proc = subprocess.run(
        ["bash", "-c", prelude + bash],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert '"choices"' in proc.stdout  # the server answered the curl request
    assert (tmp_path / "build" / "smollm2" / "target.batched.onnx").exists()
    for code in blocks(quick, "python"):
        ran = subprocess.run(
            [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300
        )
        assert ran.returncode == 0, ran.stderr[-3000:]


LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(markdown: str) -> set[str]:
    """GitHub's anchors for a page's headings: lower case, punctuation dropped, spaces to '-'."""
    headings = re.findall(r"^#+ (.+)$", markdown, re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_every_relative_link_in_the_readme_and_docs_points_to_a_file_and_heading() -> None:
    pages = [README, *DOCS, *sorted((ROOT / "docs" / "bench").glob("*.md"))]
    pages.append(ROOT / "scripts" / "diagnostics" / "README.md")
    broken = []
    for page in pages:
        for target in LINK.findall(page.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+:", target):
                continue  # http(s), mailto
            path, _, anchor = target.partition("#")
            resolved = (page.parent / path).resolve() if path else page
            if not resolved.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
            elif (
                anchor
                and resolved.suffix == ".md"
                and anchor not in anchors(resolved.read_text(encoding="utf-8"))
            ):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)
