"""llama.cpp as a benchmark peer: its `llama-server` on the artifact's own GGUF files.

The engine CPU users pick, built from the source the llama-cpp-python sdist vendors
(scripts/setup_llamacpp.sh). The bench starts one server per mode on a free local port, sends the
same prompt token ids specx decodes (chat template applied by specx's tokenizer: the ids are
the same in both, one GGUF vocabulary), greedy, the same new-token budget, prompt cache off, and
reads the server's own timings. Modes: the target alone, and its draft-model speculation
(`--spec-type draft-simple`: with `-md` alone it loads the draft and never drafts) at each
`--spec-draft-n-max`.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

DEFAULT_SERVER = Path.home() / ".cache/specx/llama.cpp/bin/llama-server"
DRAFT_N_MAX = (3, 8)
READY_TIMEOUT_S = 300


def find_server(path: str | None) -> Path | None:
    for candidate in (path, os.environ.get("SPECX_LLAMA_SERVER"), str(DEFAULT_SERVER)):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=3600) as response:
        return dict(json.loads(response.read()))


def _wait_ready(base: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"llama-server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=5) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.5)
    raise RuntimeError("llama-server did not become ready")


def _run_mode(
    server: Path,
    args: list[str],
    prompts: list[np.ndarray],
    max_new_tokens: int,
    repeats: int,
) -> dict[str, Any]:
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    cmd = [str(server), "--host", "127.0.0.1", "--port", str(port), "-np", "1", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_ready(base, proc)
        body = {"n_predict": max_new_tokens, "temperature": 0.0, "top_k": 1, "seed": 0}
        body["cache_prompt"] = False
        _post(f"{base}/completion", body | {"prompt": prompts[0].tolist(), "n_predict": 4})
        rates, decode_rates, drafted, accepted, tokens = [], [], 0, 0, 0
        for _ in range(repeats):
            total_tokens, total_s = 0, 0.0
            for ids in prompts:
                timings = _post(f"{base}/completion", body | {"prompt": ids.tolist()})["timings"]
                n = int(timings["predicted_n"])
                total_tokens += n
                total_s += (timings["prompt_ms"] + timings["predicted_ms"]) / 1000
                decode_rates.append(float(timings["predicted_per_second"]))
                drafted += int(timings.get("draft_n", 0) or 0)
                accepted += int(timings.get("draft_n_accepted", 0) or 0)
                tokens += n
            rates.append(total_tokens / total_s)
        return {
            "tokens_per_s": statistics.median(rates),  # prefill included, like specx's pooled
            "decode_tokens_per_s": statistics.median(decode_rates),
            "draft_tokens": drafted,
            "draft_accepted": accepted,
            "acceptance": accepted / drafted if drafted else None,
            "new_tokens": tokens,
        }
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def llamacpp_peer(
    server_path: str | None,
    target_gguf: str,
    draft_gguf: str | None,
    prompts: list[np.ndarray],
    max_new_tokens: int,
    repeats: int,
    threads: int | None,
    progress: Any,
) -> dict[str, Any]:
    server = find_server(server_path)
    if server is None:
        return {"skipped": "no llama-server (scripts/setup_llamacpp.sh, or SPECX_LLAMA_SERVER)"}
    if not target_gguf.endswith(".gguf") or not Path(target_gguf).is_file():
        return {"skipped": f"the target's source {target_gguf} is no GGUF file on this machine"}
    context = str(max(len(p) for p in prompts) + max_new_tokens + 64)
    common = ["-m", target_gguf, "-c", context, "-ngl", "0"]
    if threads:
        common += ["-t", str(threads), "-tb", str(threads)]
    modes: list[tuple[str, list[str]]] = [("target", [])]
    if draft_gguf and Path(draft_gguf).is_file():
        for n_max in DRAFT_N_MAX:
            spec = ["-md", draft_gguf, "--spec-type", "draft-simple"]
            spec += ["--spec-draft-n-max", str(n_max), "--spec-draft-n-min", "0"]
            spec += ["-ngld", "0"]
            if threads:
                spec += ["-td", str(threads), "-tbd", str(threads)]
            modes.append((f"draft n-max {n_max}", spec))
    out: dict[str, Any] = {"server": str(server)}
    for name, extra in modes:
        progress(f"peer llama.cpp {name}")
        try:
            out[name] = _run_mode(server, common + extra, prompts, max_new_tokens, repeats)
        except (RuntimeError, OSError, KeyError, ValueError) as e:
            out[name] = {"error": str(e)[:200]}
    return out
