"""specx exporter: Hugging Face models -> ONNX graphs + manifest.json + tokenizer.json.

Heavy dependencies (torch, transformers, onnx) live here only. The exporter depends on the
runtime (for the graph contract, and to run its own parity checks) and on the profiles; never
the reverse.
"""

from specx.exporter.export import ExportOptions, export_pair

__all__ = ["ExportOptions", "export_pair"]
