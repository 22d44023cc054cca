"""Convert a GGUF causal LM into a plain Hugging Face folder (float32 safetensors + tokenizer).

    .venv/bin/python scripts/gguf_to_hf.py GGUF_FILE OUT_FOLDER

Readers that cannot load GGUF (e.g. onnxruntime-genai's model builder) need this folder.
Traps handled here:
- `save_pretrained` on a GGUF-loaded model fails ("quantized with gguf and is not
  serializable"): we rebuild the model class from the config without the quantization
  config, load the dequantized state dict into it, and save that.
- transformers 5 keeps rope_theta inside `rope_parameters`; older transformers ignore that and
  silently use 10000. The saved config.json also gets a top-level `rope_theta` (SmolLM2: 1e5).
Finally the saved folder is reloaded and its logits compared with the GGUF-loaded model's.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    gguf, out = Path(sys.argv[1]).expanduser().resolve(), Path(sys.argv[2]).expanduser()
    t0 = time.perf_counter()
    src = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    src.eval()
    print(f"loaded {gguf.name} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)

    config = src.config.__class__.from_dict(src.config.to_dict())
    for attr in ("quantization_config", "_pre_quantization_dtype"):
        if hasattr(config, attr):
            delattr(config, attr)
    plain = type(src)(config).to(torch.float32).eval()
    missing, unexpected = plain.load_state_dict(src.state_dict(), strict=False)
    # A tied head is not in the state dict under its own name; anything else is an error.
    missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise SystemExit(f"state dict mismatch: missing {missing}, unexpected {unexpected}")
    plain.tie_weights()

    out.mkdir(parents=True, exist_ok=True)
    plain.save_pretrained(out)
    tok.save_pretrained(out)
    if src.generation_config is not None:
        src.generation_config.save_pretrained(out)

    # Top-level rope_theta for readers that predate `rope_parameters`.
    cfg_path = out / "config.json"
    cfg = json.loads(cfg_path.read_text())
    rope = cfg.get("rope_parameters") or {}
    theta = rope.get("rope_theta", cfg.get("rope_theta"))
    if theta is None:
        raise SystemExit("no rope_theta in the config")
    cfg["rope_theta"] = theta
    cfg.pop("quantization_config", None)
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")

    # Parity: the saved folder, reloaded, must give the GGUF model's logits.
    back = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "Name three colors."}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )["input_ids"]
    with torch.no_grad():
        a, b = src(ids).logits, back(ids).logits
    diff = (a - b).abs().max().item()
    same_argmax = bool((a.argmax(-1) == b.argmax(-1)).all())
    print(
        f"wrote {out} (rope_theta {theta}); reload parity on {ids.shape[1]} tokens: "
        f"max |diff| {diff:.2e}, argmax identical {same_argmax}",
        file=sys.stderr,
    )
    if diff > 1e-4 or not same_argmax:
        raise SystemExit("reloaded model does not match the GGUF model")
    return 0


if __name__ == "__main__":
    sys.exit(main())
