"""A request's grammar checked before it is admitted: off the event loop, bounded in time.

Compiling a JSON Schema or a grammar and probing it within the matcher's limits
(runtime/grammar_limits.py) can take seconds for a large one. It runs in a small pool of its own
threads, so that the event loop and requests without a grammar never wait for it; a check that
takes longer than `timeout_s` is answered with a 400 (the check goes on in its thread and its
verdict is kept, so the same schema sent again is answered at once). Whatever fails is a 400
whose `param` names the field it came in: `response_format`, or `tools[i].function.parameters`
for the tool whose parameters the matcher cannot serve.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from specx.apps.serve.errors import RequestError, param_of
from specx.apps.serve.structured import Tools
from specx.runtime import GenerationSettings, Grammar, InputError, Pipeline


class GrammarGate:
    """Checks each request's settings (its grammar above all) before admission."""

    def __init__(self, pipeline: Pipeline, timeout_s: float, workers: int) -> None:
        self.pipeline = pipeline
        self.timeout_s = timeout_s
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="specx-grammar")

    async def check(self, settings: GenerationSettings, chat: bool, tools: Tools | None) -> None:
        """Raise the RequestError for settings this pipeline refuses (pipeline.validate)."""
        if settings.grammar is None:
            self._validate(settings, chat, tools)  # no grammar: nothing slow to check
            return
        loop = asyncio.get_running_loop()
        work = loop.run_in_executor(self._pool, self._validate, settings, chat, tools)
        try:
            await asyncio.wait_for(work, self.timeout_s)
        except TimeoutError as e:
            raise RequestError(
                f"the grammar took longer than {self.timeout_s:g} s to compile and check "
                "(send a smaller schema or grammar, or start the server with a higher "
                "--grammar-timeout)",
                "tools" if tools is not None and tools.forced else "response_format",
            ) from e

    def _validate(self, settings: GenerationSettings, chat: bool, tools: Tools | None) -> None:
        if tools is not None and tools.forced:
            self._check_tools(tools)
        try:
            self.pipeline.validate(settings)
        except InputError as e:
            message = e.message + (f" ({e.hint})" if e.hint else "")
            raise RequestError(message, param_of(e, chat, tools is not None)) from e

    def _check_tools(self, tools: Tools) -> None:
        """Each tool the model may be made to call, its parameters checked alone (as the
        call's grammar will hold them), so that a refusal names `tools[i].function.parameters`."""
        for i, spec in enumerate(tools.specs):
            function = spec["function"]
            if tools.choice not in ("required", function["name"]):
                continue
            try:
                self.pipeline.constraint(Grammar.json_schema(function.get("parameters") or {}))
            except InputError as e:
                message = e.message + (f" ({e.hint})" if e.hint else "")
                raise RequestError(message, f"tools[{i}].function.parameters") from e

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
