"""Write a random-weight Qwen2 model of a real model's dimensions as a GGUF file (Q4_K_M's
tensor types), to measure what exporting and running a model of that size takes without
downloading one. The weights are random blocks: the text it writes is noise.

    .venv/bin/python scripts/random_gguf.py /tmp/qwen7b-random.gguf            # Qwen2.5-7B
    .venv/bin/python scripts/random_gguf.py /tmp/small.gguf --shape tiny

The 7B file is about 4.6 GB (never commit it); writing it holds it in memory once.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the test tooling writes the file

from tests.gguf_models import Q4_K_M_TYPES, QWEN25_7B, Shape, write_gguf  # noqa: E402

SHAPES = {"qwen2.5-7b": QWEN25_7B, "tiny": Shape()}


@click.command()
@click.argument("output", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--shape", type=click.Choice(sorted(SHAPES)), default="qwen2.5-7b", show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
def main(output: Path, shape: str, seed: int) -> None:
    t0 = time.perf_counter()
    write_gguf(
        output, "qwen2", seed, Q4_K_M_TYPES, head="Q6_K", embedding="Q4_K", shape=SHAPES[shape]
    )
    size = output.stat().st_size / 1e9
    click.echo(f"wrote {output}: {size:.2f} GB in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
