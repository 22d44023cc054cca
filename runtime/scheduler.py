"""Batching for many threads sharing one pipeline: one thread runs every generation's steps.

``Pipeline.enable_batching(max_batch, context)`` starts a ``BatchScheduler``. From then on each
``Pipeline.stream`` whose prompt plus new tokens fit the batch rows is submitted here instead of
running on its own workspace: the scheduler thread admits it into a free row of one
``BatchDecoder`` (its prompt read a chunk per step, in one pass with the rows joining in the same
step), steps all rows together, and hands each generation its tokens through a queue. A
generation whose consumer stops early is cancelled at the next step and its row freed; nothing
else waits for it. Requests beyond the free rows wait in arrival order.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from specx.runtime.batching import BatchDecoder, BatchSequence
from specx.runtime.constraint import Constraint
from specx.runtime.drafters.base import Drafter
from specx.runtime.generate import KPolicy
from specx.runtime.logprobs import TokenLogprob
from specx.runtime.settings import GenerationSettings
from specx.runtime.stats import Stats

_DONE = object()  # the end of a submission's token stream


@dataclass(eq=False)
class Submission:
    prompt: np.ndarray
    settings: GenerationSettings
    policy: KPolicy
    drafter: Drafter | None
    stats: Stats
    release: Callable[[], None] | None = None  # called once the scheduler is done with it
    constraint: Constraint | None = None  # its grammar's matcher, if any
    logprobs: list[TokenLogprob] | None = None  # filled as tokens commit, when asked for
    out: queue.SimpleQueue[object] = field(default_factory=queue.SimpleQueue)
    cancelled: threading.Event = field(default_factory=threading.Event)

    def end(self, item: object = _DONE) -> None:
        """Called by the scheduler thread when it lets go of the generation: nothing of it (its
        drafter included) is used after this."""
        if self.release is not None:
            self.release()
            self.release = None
        self.out.put(item)

    def tokens(self) -> Iterator[np.ndarray]:
        """The committed tokens step by step; closing the iterator cancels the generation."""
        try:
            while True:
                item = self.out.get()
                if item is _DONE:
                    return
                if isinstance(item, BaseException):
                    raise item
                assert isinstance(item, np.ndarray)
                yield item
        finally:
            self.cancelled.set()


class BatchScheduler:
    def __init__(self, decoder: BatchDecoder) -> None:
        self.decoder = decoder
        self.context = decoder.capacity
        self._inbox: queue.SimpleQueue[Submission | None] = queue.SimpleQueue()
        self._running: dict[int, tuple[BatchSequence, Submission]] = {}
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name="specx-batch", daemon=True)
        self._thread.start()

    def fits(self, prompt_tokens: int, max_new_tokens: int, max_k: int) -> bool:
        """Whether a generation runs its whole course in a batch row."""
        return prompt_tokens + max_new_tokens + max_k + 1 <= self.context

    def submit(self, submission: Submission) -> Submission:
        if self._stopped:
            submission.end(RuntimeError("the pipeline stopped batching"))
        else:
            self._inbox.put(submission)
        return submission

    def stop(self) -> None:
        """Cancel what runs, end the thread (the pipeline then serves requests alone again)."""
        self._stopped = True
        self._inbox.put(None)
        self._thread.join(timeout=60)

    # -- the scheduler thread ----------------------------------------------------------------
    def _admit(self, submission: Submission) -> None:
        if submission.cancelled.is_set():
            submission.end()
            return
        try:
            seq = self.decoder.add(
                submission.prompt,
                submission.settings,
                submission.policy,
                submission.drafter,
                submission.stats,
                submission.out.put,
                submission.constraint,
                submission.logprobs,
            )
        except Exception as e:  # delivered to the waiting generation, which raises it
            submission.end(e)
            return
        self._running[id(seq)] = (seq, submission)

    def _loop(self) -> None:
        waiting: list[Submission] = []
        while True:
            block = not self._running and not waiting
            try:
                while True:
                    item = self._inbox.get(block=block)
                    block = False
                    if item is None:
                        self._finish_all(RuntimeError("the pipeline stopped batching"))
                        for w in waiting:
                            w.end(RuntimeError("the pipeline stopped batching"))
                        return
                    waiting.append(item)
            except queue.Empty:
                pass
            while waiting and self.decoder.free_rows:
                self._admit(waiting.pop(0))
            for seq, submission in list(self._running.values()):
                if submission.cancelled.is_set():
                    self.decoder.cancel(seq)
            try:
                self.decoder.step()
            except Exception as e:
                self._finish_all(e)
                continue
            for key, (seq, submission) in list(self._running.items()):
                if seq.done:
                    submission.end()
                    del self._running[key]

    def _finish_all(self, error: BaseException) -> None:
        for seq, submission in self._running.values():
            self.decoder.cancel(seq)
            submission.end(error)
        self._running.clear()
