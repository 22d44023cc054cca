"""specx as a Triton Inference Server model (Python backend, decoupled): written into a model
repository by `specx triton`, run by any tritonserver (NGC containers, JetPack, pip's
nvidia-pytriton) that has the Python backend.

Inputs follow the names of the vLLM and TensorRT-LLM Triton backends, so Triton's generate
endpoints (/v2/models/NAME/generate, /generate_stream) and existing clients work unchanged:

    text_input (string), stream (bool), max_tokens (int32), temperature, top_p, min_p (fp32),
    top_k (int32), seed (uint64), sampling_parameters (a JSON string, vLLM style: any of the
    above), and specx's own: k ("auto" or "0".."16"), drafter, chat (bool), exclude_input_in_output
    (accepted; the output never repeats the input)

Outputs: text_output (the text, or with stream=true one delta per response) and specx_stats
(the generation's statistics as JSON, on the final response).
"""

from __future__ import annotations

import json
import site
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

SCALARS = {
    "max_tokens": int,
    "temperature": float,
    "top_p": float,
    "min_p": float,
    "top_k": int,
    "seed": int,
    "k": str,
    "drafter": str,
    "stream": bool,
    "chat": bool,
}


def _scalar(request: Any, name: str) -> Any:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return None
    value = tensor.as_numpy().reshape(-1)[0]
    if isinstance(value, bytes | np.bytes_):
        return value.decode("utf-8")
    return value.item() if hasattr(value, "item") else value


def _strings(name: str, *values: str) -> Any:
    return pb_utils.Tensor(name, np.array([v.encode("utf-8") for v in values], dtype=np.object_))


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        version = f"{sys.version_info[0]}.{sys.version_info[1]}"
        if params.get("python_version") and params["python_version"] != version:
            raise pb_utils.TritonModelException(
                f"the repository was written for Python {params['python_version']}, this stub "
                f"runs {version}: use the stub of that version (python_backend_stubs)"
            )
        for path in filter(None, params.get("site_packages", "").split(":")):
            site.addsitedir(path)  # the environment specx was installed in (.pth files too)
        from specx.runtime import GenerationSettings, InputError, Pipeline, SamplingParams

        self._settings, self._sampling, self._input_error = (
            GenerationSettings,
            SamplingParams,
            InputError,
        )
        threads = int(params.get("threads") or 0) or None
        self.pipeline = Pipeline.load(params["artifact"], threads=threads)
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        # max_batch > 0: requests run in worker threads and share target passes (the pipeline's
        # batch scheduler); execute returns at once, each worker answers its own request.
        self.max_batch = int(params.get("max_batch") or 0)
        self._workers: ThreadPoolExecutor | None = None
        if self.max_batch:
            context = int(params.get("batch_context") or 0) or None
            self.pipeline.enable_batching(self.max_batch, context)
            self._workers = ThreadPoolExecutor(
                4 * self.max_batch, thread_name_prefix="specx-triton"
            )

    def _request(self, request: Any) -> tuple[Any, Any, bool, bool]:
        """(prompt ids, GenerationSettings, stream, chat) of one request."""
        text = _scalar(request, "text_input")
        if not isinstance(text, str):
            raise self._input_error("text_input (a string) is required")
        given = {name: _scalar(request, name) for name in SCALARS}
        raw = _scalar(request, "sampling_parameters")
        if raw:
            try:
                extra = json.loads(raw)
            except json.JSONDecodeError as e:
                raise self._input_error(f"sampling_parameters is not JSON: {e}") from e
            if not isinstance(extra, dict):
                raise self._input_error("sampling_parameters must be a JSON object")
            given.update({k: v for k, v in extra.items() if k in SCALARS and v is not None})
        temperature = float(given["temperature"] if given["temperature"] is not None else 0.0)
        sampling = self._sampling(
            temperature=temperature,
            top_p=float(given["top_p"] if given["top_p"] is not None else 1.0),
            min_p=float(given["min_p"] or 0.0),
            top_k=int(given["top_k"] or 0),
            seed=None if given["seed"] is None else int(given["seed"]),
        )
        settings = self._settings(
            max_new_tokens=int(given["max_tokens"] or 64),
            k=given["k"],
            drafter=given["drafter"],
            sampling=sampling,
        )
        chat = bool(given["chat"])
        prompt = self.pipeline.encode_prompt(text, chat=chat)
        self.pipeline.validate(settings)
        return prompt, settings, bool(given["stream"]), chat

    def execute(self, requests: list[Any]) -> None:
        for request in requests:
            if self._workers is not None:
                self._workers.submit(self._serve, request)
            else:
                self._serve(request)
        return None

    def _serve(self, request: Any) -> None:
        """Generate for one request and send its responses (in a worker when batching)."""
        sender = request.get_response_sender()
        try:
            prompt, settings, stream, _chat = self._request(request)
            generation = self.pipeline.stream(prompt, settings)
            text = ""
            for delta in generation:
                if sender.is_cancelled():
                    break
                text += delta
                if stream:
                    sender.send(pb_utils.InferenceResponse([_strings("text_output", delta)]))
            generation.close()
            stats = json.dumps(generation.result.stats.to_json())
            final = [_strings("text_output", "" if stream else text)]
            final.append(_strings("specx_stats", stats))
            sender.send(
                pb_utils.InferenceResponse(final),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
            )
        except (self._input_error, ValueError, TypeError, RuntimeError) as e:
            error = pb_utils.TritonError(str(e))
            sender.send(
                pb_utils.InferenceResponse(error=error),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
            )

    def finalize(self) -> None:
        if self._workers is not None:
            self._workers.shutdown(wait=True, cancel_futures=True)
            self.pipeline.disable_batching()
        del self.pipeline  # the graphs and caches go with it
