"""Which ONNX Runtime releases run the batched graph, measured.

    python scripts/diagnostics/ort_batched.py [VERSION ...]    (default: 1.20.1 .. 1.32.0)

Exports a tiny Llama with `--batched` into a temporary folder, then in each release's venv
($TMPDIR/specx-ort-VERSION, as ort_versions.py in this folder makes them) runs the batched graph
with plain numpy inputs: two rows prefilled together (9 tokens), then a joint 4-token pass at
lengths 9 and 5. Prints per release "ok" and the largest logit difference from this
environment's onnxruntime, or the first line of the error.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
VERSIONS = ("1.20.1", "1.21.1", "1.22.1", "1.23.2", "1.24.4", "1.26.0", "1.28.0", "1.30.0")

RUN = r"""
import sys
import numpy as np
import onnxruntime as ort
graph, out = sys.argv[1], sys.argv[2]
try:
    s = ort.InferenceSession(graph, providers=["CPUExecutionProvider"])
    names = [i.name for i in s.get_inputs()]
    shape = [i.shape for i in s.get_inputs() if i.name == "past_key.0"][0]
    layers = sum(n.startswith("past_key.") for n in names)
    cache = {
        f"past_{t}.{i}": np.zeros((2, shape[1], 32, shape[3]), np.float32)
        for i in range(layers)
        for t in ("key", "value")
    }
    rng = np.random.default_rng(0)
    feeds = {
        "input_ids": rng.integers(0, 200, (2, 9)),
        "position_ids": np.tile(np.arange(9), (2, 1)),
        "write_indices": np.array([0, 0]),
        **cache,
    }
    for output, value in zip([o.name for o in s.get_outputs()], s.run(None, feeds)):
        if output.startswith("present_"):
            cache[output.replace("present_", "past_")] = value
    lengths = np.array([9, 5])
    feeds = {
        "input_ids": rng.integers(0, 200, (2, 4)),
        "position_ids": lengths[:, None] + np.arange(4)[None],
        "write_indices": lengths,
        **cache,
    }
    np.save(out, s.run(["logits"], feeds)[0])
    print("ok")
except Exception as e:
    print("fails: " + str(e).splitlines()[0][:160])
"""


def main() -> int:
    import tiny_models
    from specx.exporter import ExportOptions, export_pair

    versions = sys.argv[1:] or VERSIONS
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        tok = tiny_models.build_tokenizer()
        model = tiny_models.build_model("llama", tok.get_vocab_size(), 1)
        src = tiny_models.save(model, tok, root / "src")
        options = ExportOptions(max_length=64, batched=True)
        export_pair(str(src), [], root / "art", options, log=lambda _m: None)
        graph = str(root / "art" / "target.batched.onnx")
        script = root / "run.py"
        script.write_text(RUN)
        subprocess.run([sys.executable, str(script), graph, str(root / "ref.npy")], check=True)
        reference = np.load(root / "ref.npy")
        for version in versions:
            python = Path(tempfile.gettempdir()) / f"specx-ort-{version}" / "bin" / "python"
            if not python.is_file():
                print(f"{version}: no venv at {python.parent.parent} (ort_versions.py)")
                continue
            out = root / f"{version}.npy"
            proc = subprocess.run(
                [str(python), str(script), graph, str(out)], capture_output=True, text=True
            )
            verdict = proc.stdout.strip() or proc.stderr.strip().splitlines()[-1]
            if verdict == "ok":
                verdict += f", max |logit difference| {np.abs(np.load(out) - reference).max():.1e}"
            print(f"{version}: {verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
