"""Requests on one shared Pipeline: admission, worker threads, cancellation, time limits.

Generation is blocking numpy/ONNX Runtime work, so each admitted request runs in a worker thread
(at most `max_concurrency` at once, each on its own workspace of the shared pipeline) and hands
its text to the event loop through a queue. Past `max_concurrency` running and `max_queue`
waiting, a request is refused at once (429 with Retry-After) instead of piling up in memory.
A request's generation stops, and its workspace (caches) returns to the pool, when the client
goes away, when its time limit passes, or when the server shuts down; the worker notices after
the step it is in (one target pass).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncGenerator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from specx.runtime import GenerationResult, GenerationSettings, Pipeline, TokenLogprob


class Busy(Exception):
    """No slot and no room in the queue."""

    def __init__(self, retry_after_s: int) -> None:
        super().__init__("busy")
        self.retry_after_s = retry_after_s


class ShuttingDown(Exception):
    """The server no longer takes requests."""


@dataclass(eq=False)  # compared and hashed by identity: a job is one request
class Job:
    prompt: np.ndarray
    settings: GenerationSettings
    stops: tuple[str, ...]
    deadline: float  # time.monotonic() after which the generation stops
    cancelled: threading.Event = field(default_factory=threading.Event)
    timed_out: bool = False
    stopped_by: str | None = None  # the stop string that ended the text, if any


@dataclass(frozen=True)
class Delta:
    text: str
    logprobs: list[TokenLogprob] | None = None  # of the tokens committed since the last delta


@dataclass(frozen=True)
class Done:
    result: GenerationResult
    text: str  # the final text, cut at a stop string
    reason: str  # eos | stop | max_new_tokens | max_length | timeout | cancelled


class StopScanner:
    """Cuts streamed text at the first stop string, holding back a tail that could still turn
    into one (at most the longest stop string minus one character)."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = stops
        self.hold = max((len(s) for s in stops), default=1) - 1
        self.text = ""
        self.sent = 0

    def push(self, delta: str) -> tuple[str, str | None]:
        """(text that may be sent now, the stop string found or None)."""
        self.text += delta
        hits = [(i, s) for s in self.stops if (i := self.text.find(s)) >= 0]
        if hits:
            at, stop = min(hits)
            self.text = self.text[:at]
            out, self.sent = self.text[self.sent :], len(self.text)
            return out, stop
        safe = max(self.sent, len(self.text) - self.hold)
        out, self.sent = self.text[self.sent : safe], safe
        return out, None

    def flush(self) -> str:
        out, self.sent = self.text[self.sent :], len(self.text)
        return out


class Engine:
    def __init__(
        self,
        pipeline: Pipeline,
        max_concurrency: int,
        max_queue: int,
        on_finish: Callable[[Done, float | None], None] | None = None,
    ) -> None:
        self.pipeline = pipeline
        self.max_concurrency = max_concurrency
        self.max_queue = max_queue
        self.active = 0
        self.waiting = 0
        self.accepting = True
        self._slots = asyncio.Semaphore(max_concurrency)
        self._executor = ThreadPoolExecutor(max_concurrency, thread_name_prefix="specx-gen")
        self._jobs: set[Job] = set()
        self._recent_s: list[float] = []  # durations of recent generations, for Retry-After
        self._on_finish = on_finish

    def retry_after_s(self) -> int:
        typical = sorted(self._recent_s)[len(self._recent_s) // 2] if self._recent_s else 1.0
        queued = (self.waiting + 1) / self.max_concurrency
        return max(1, round(typical * queued))

    async def run(self, job: Job) -> AsyncGenerator[Delta | Done, None]:
        """Admit `job`, run it in a worker, yield its text deltas, then Done. Closing the
        iterator early (a client that went away) cancels the generation."""
        if not self.accepting:
            raise ShuttingDown
        if self.active >= self.max_concurrency and self.waiting >= self.max_queue:
            raise Busy(self.retry_after_s())
        self.waiting += 1
        try:
            remaining = job.deadline - time.monotonic()
            await asyncio.wait_for(self._slots.acquire(), timeout=max(remaining, 0.001))
        except TimeoutError:
            job.timed_out = True
            raise
        finally:
            self.waiting -= 1
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Delta | Done | BaseException] = asyncio.Queue()
        self.active += 1
        self._jobs.add(job)

        def put(item: Delta | Done | BaseException) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, item)

        def finished(_future: Any) -> None:
            loop.call_soon_threadsafe(self._release, job)

        future = loop.run_in_executor(self._executor, self._work, job, put)
        future.add_done_callback(finished)
        try:
            while True:
                item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if isinstance(item, Done):
                    return
        finally:
            job.cancelled.set()  # a no-op once the worker is done

    def _release(self, job: Job) -> None:
        self.active -= 1
        self._jobs.discard(job)
        self._slots.release()

    def _work(self, job: Job, put: Callable[[Delta | Done | BaseException], None]) -> None:
        """Runs in a worker thread: the blocking generation, step by step."""
        started = time.monotonic()
        first_token_s: float | None = None
        scanner = StopScanner(job.stops)
        try:
            generation = self.pipeline.stream(job.prompt, job.settings)
            reason = ""
            sent = 0  # logprob entries sent with deltas

            def new_logprobs() -> list[TokenLogprob] | None:
                nonlocal sent
                entries = generation.result.logprobs
                if entries is None:
                    return None
                fresh, sent = entries[sent:], len(entries)
                return fresh

            try:
                for piece in generation:
                    if first_token_s is None:
                        first_token_s = time.monotonic() - started
                    text, stop = scanner.push(piece)
                    if text:
                        put(Delta(text, new_logprobs()))
                    if stop is not None:
                        job.stopped_by, reason = stop, "stop"
                        break
                    if job.cancelled.is_set():
                        reason = "cancelled"
                        break
                    if time.monotonic() > job.deadline:
                        job.timed_out, reason = True, "timeout"
                        break
            finally:
                generation.close()  # returns the workspace to the pool
            tail = scanner.flush() if reason != "stop" else ""
            if tail:
                put(Delta(tail, new_logprobs()))
            result = generation.result
            done = Done(result, scanner.text, reason or result.stats.stop_reason)
        except BaseException as e:  # delivered to the request, which answers with an error
            put(e)
            return
        self._recent_s = [*self._recent_s[-31:], time.monotonic() - started]
        if self._on_finish is not None:
            self._on_finish(done, first_token_s)
        put(done)

    def shutdown(self, cancel: bool) -> None:
        """Stop taking requests; with `cancel`, also stop the running generations."""
        self.accepting = False
        if cancel:
            for job in list(self._jobs):
                job.cancelled.set()
        self._executor.shutdown(wait=True, cancel_futures=True)
