"""The runtime never loads torch, transformers or the exporter (checked in fresh processes)."""

from __future__ import annotations

import subprocess
import sys

from conftest import TinyPair, needs_exporter

FORBIDDEN = ("torch", "transformers", "optimum", "onnx", "specx.exporter")

REPORT = (
    "import sys\n"
    f"bad = [m for m in {FORBIDDEN!r} if m in sys.modules]\n"
    "print('LOADED:', ','.join(bad))\n"
)


def run_python(code: str) -> str:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_importing_the_runtime_api_loads_neither_torch_nor_transformers() -> None:
    out = run_python("import specx.runtime\nfrom specx.runtime import Pipeline\n" + REPORT)
    assert "LOADED: \n" in out


@needs_exporter
def test_specx_run_loads_neither_torch_nor_transformers(llama_pair: TinyPair) -> None:
    code = (
        "from specx.apps.cli.main import main\n"
        "try:\n"
        f"    main(['run', {str(llama_pair.artifact)!r}, '-p', 'The cat', '-n', '5',"
        " '--draft', 'mixed', '--chat', '--json-object'])\n"
        "except SystemExit as e:\n"
        "    assert not e.code, e.code\n" + REPORT
    )
    out = run_python(code)
    assert out.strip().endswith("LOADED:"), out
