"""`specx import`: an artifact from decoder graphs exported elsewhere, with the runtime alone.

Reads a folder's ONNX graph(s), config.json and tokenizer, recognises the layout from the graph's
own inputs and outputs (layout.py), checks the graph and the pair (checks.py) and writes a
manifest that points to the graphs, linked or copied (build.py). Needs numpy, onnxruntime and
tokenizers only: no torch, no transformers, no onnx package. On request only (--rewrite gqa), an
Optimum graph's attention is rewritten as GroupQueryAttention (rewrite.py, the onnx package).
"""

from specx.apps.importer.build import ImportOptions, import_pair

__all__ = ["ImportOptions", "import_pair"]
