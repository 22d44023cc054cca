"""Write a random-weight Qwen2 model of a real model's dimensions as a GGUF file, with the
tensor types of llama.cpp's Q4_K_M or Q4_0, to measure what exporting and running a model of
that size takes without downloading one. The weights are random blocks: its text is noise.

    .venv/bin/python scripts/random_gguf.py /tmp/qwen7b.gguf                  # Qwen2.5-7B, Q4_K_M
    .venv/bin/python scripts/random_gguf.py /tmp/qwen7b-q4_0.gguf --types q4_0
    .venv/bin/python scripts/random_gguf.py /tmp/small.gguf --shape tiny

The 7B files take several GB (docs/bench/measurements.md; never commit them); writing one holds
it in memory once.
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
# (matrix types, embedding, head) as llama.cpp's quantizer picks them
TYPES = {
    "q4_k_m": (Q4_K_M_TYPES, "Q4_K", "Q6_K"),
    "q4_0": (dict.fromkeys(Q4_K_M_TYPES, "Q4_0"), "Q4_0", "Q6_K"),
}


@click.command()
@click.argument("output", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--shape", type=click.Choice(sorted(SHAPES)), default="qwen2.5-7b", show_default=True)
@click.option("--types", type=click.Choice(sorted(TYPES)), default="q4_k_m", show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
def main(output: Path, shape: str, types: str, seed: int) -> None:
    t0 = time.perf_counter()
    matrices, embedding, head = TYPES[types]
    write_gguf(output, "qwen2", seed, matrices, head=head, embedding=embedding, shape=SHAPES[shape])
    size = output.stat().st_size / 1e9
    click.echo(f"wrote {output}: {size:.2f} GB in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
