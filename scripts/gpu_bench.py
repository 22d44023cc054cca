"""A short GPU benchmark (run by scripts/gpu_check.sh): pass costs and speculation on the GPU.

No download: a random-weight Llama of ~250M parameters (hidden 1024, 16 layers, vocab 32000) is
exported twice, fp32 (CPU profile shapes) and fp16 (gpu-datacenter shapes), with itself and
n-gram lookup as drafters. For each backend that is usable here (ONNX Runtime CUDA provider fp32
and fp16; TensorRT engines fp16 when TensorRT is installed; the CPU for reference) it measures the
one-token step, the verify cost ratio (a pass over K + 1 tokens / a one-token pass) and the tokens/s
of the target alone and of K = 4 speculation with the target drafting for itself (acceptance 100%:
the runtime's overhead and the verify cost, not a draft's quality), and checks that speculative
greedy output equals target-alone output. Prints one table.
"""

from __future__ import annotations

import importlib.util
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))


def build(folder: Path, precision: str) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    import tiny_models
    from specx.exporter import ExportOptions, export_pair

    src = folder / "src"
    if not src.exists():
        config = LlamaConfig(
            vocab_size=32000,
            hidden_size=1024,
            intermediate_size=2816,
            num_hidden_layers=16,
            num_attention_heads=16,
            num_key_value_heads=4,
            max_position_embeddings=4096,
            tie_word_embeddings=True,
        )
        tok = tiny_models.build_tokenizer()
        tiny_models.save(LlamaForCausalLM(config).eval(), tok, src)
    out = folder / f"artifact-{precision}"
    profile = "cpu" if precision == "fp32" else "gpu-datacenter"
    engines = precision == "fp16" and importlib.util.find_spec("tensorrt") is not None
    export_pair(
        str(src),
        ["ngram", f"self={src}"],
        out,
        ExportOptions(profile=profile, engines=engines, force=True),
        log=print,
    )
    return out


def step_times(pipe: object, widths: list[int], past: int = 512) -> dict[int, float]:
    from specx.apps.bench import pass_time

    target = pipe.target  # type: ignore[attr-defined]
    return {w: pass_time(target, w, past, 20) for w in widths}


def run(artifact: Path, providers: list[str]) -> dict[str, object]:
    from specx.runtime import Pipeline

    pipe = Pipeline.load(artifact, providers=providers)
    times = step_times(pipe, [1, 5, 9])
    prompt = np.arange(100, 164, dtype=np.int64)
    rows = {}
    for label, k in (("alone", 0), ("K=4", 4)):
        rates = []
        for _ in range(3):
            result = pipe.generate(prompt, max_new_tokens=128, k=k, drafter="self" if k else None)
            rates.append(result.stats.decode_tokens_per_s)
        rows[label] = (statistics.median(rates), result.token_ids)
    same = rows["alone"][1] == rows["K=4"][1]
    return {
        "step_ms": 1e3 * times[1],
        "verify5": times[5] / times[1],
        "verify9": times[9] / times[1],
        "alone": rows["alone"][0],
        "spec": rows["K=4"][0],
        "same": same,
    }


def main() -> int:
    import onnxruntime as ort

    from specx.runtime.backends import use_global_thread_pool

    use_global_thread_pool()
    has_cuda = "CUDAExecutionProvider" in ort.get_available_providers()
    has_trt = importlib.util.find_spec("tensorrt") is not None
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        t0 = time.perf_counter()
        fp32 = build(folder, "fp32")
        fp16 = build(folder, "fp16") if has_cuda or has_trt else None
        print(f"exports took {time.perf_counter() - t0:.0f} s")
        results.append(("cpu fp32", run(fp32, ["cpu"])))
        if has_cuda:
            results.append(("cuda fp32", run(fp32, ["cuda"])))
            if fp16 is not None:
                results.append(("cuda fp16", run(fp16, ["cuda"])))
        if has_trt and fp16 is not None:
            results.append(("tensorrt fp16", run(fp16, ["tensorrt"])))
    print()
    print(
        f"{'backend':<15}{'step ms':>9}{'r(K=4)':>8}{'r(K=8)':>8}{'alone tok/s':>13}"
        f"{'K=4 self tok/s':>16}{'same output':>13}"
    )
    for name, r in results:
        print(
            f"{name:<15}{r['step_ms']:>9.2f}{r['verify5']:>8.2f}{r['verify9']:>8.2f}"
            f"{r['alone']:>13.1f}{r['spec']:>16.1f}{r['same']!s:>13}"
        )
    if not has_cuda:
        print("(no CUDA provider: install onnxruntime-gpu to measure the GPU)")
    return 0 if all(r["same"] for _, r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
