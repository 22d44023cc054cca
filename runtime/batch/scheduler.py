"""Batching for many threads sharing one pipeline: one thread runs every generation's steps.

``Pipeline.enable_batching(max_batch, context)`` starts a ``BatchScheduler``. From then on each
``Pipeline.stream`` whose prompt plus new tokens fit the batch rows is submitted here instead of
running on its own workspace: the scheduler thread admits it into a free row of one
``BatchDecoder`` (its prompt read a chunk per step, in one pass with the rows joining in the same
step), steps all rows together (rows.RowQueue), and hands each generation its tokens through a
queue. A generation whose consumer stops early is cancelled at the next step and its row freed;
nothing else waits for it. Requests beyond the free rows wait in arrival order.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from specx.runtime.batch.decoder import BatchDecoder
from specx.runtime.batch.rows import RowQueue
from specx.runtime.decode.sequence import Sequence

_DONE = object()  # the end of a submission's token stream
STOPPED = "the pipeline stopped batching"


@dataclass(eq=False)
class Submission:
    """A generation handed to the scheduler thread (rows.Job): its tokens come back through a
    queue as each step commits them."""

    seq: Sequence
    release: Callable[[], None] | None = None  # called once the scheduler is done with it
    out: queue.SimpleQueue[object] = field(default_factory=queue.SimpleQueue)
    stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.seq.emit = self.out.put

    def admitted(self) -> None:
        """Its drafter was taken when it was submitted."""

    def cancelled(self) -> bool:
        return self.stop.is_set()

    def end(self, error: BaseException | None = None) -> None:
        """Called by the scheduler thread when it lets go of the generation: nothing of it (its
        drafter included) is used after this."""
        if self.release is not None:
            self.release()
            self.release = None
        self.out.put(_DONE if error is None else error)

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
            self.stop.set()


class BatchScheduler:
    def __init__(self, decoder: BatchDecoder) -> None:
        self.decoder = decoder
        self.context = decoder.capacity
        self._rows = RowQueue(decoder)
        self._inbox: queue.SimpleQueue[Submission | None] = queue.SimpleQueue()
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name="specx-batch", daemon=True)
        self._thread.start()

    def fits(self, prompt_tokens: int, max_new_tokens: int, max_k: int) -> bool:
        """Whether a generation runs its whole course in a batch row."""
        return prompt_tokens + max_new_tokens + max_k + 1 <= self.context

    def submit(self, submission: Submission) -> Submission:
        if self._stopped:
            submission.end(RuntimeError(STOPPED))
        else:
            self._inbox.put(submission)
        return submission

    def stop(self) -> None:
        """Cancel what runs, end the thread (the pipeline then serves requests alone again)."""
        self._stopped = True
        self._inbox.put(None)
        self._thread.join(timeout=60)

    def _loop(self) -> None:
        """The scheduler thread: take what was submitted (waiting for it when idle), run a cycle
        of the rows; a step's error ends the generations it ran, the others go on."""
        while True:
            block = not self._rows.busy
            try:
                while True:
                    item = self._inbox.get(block=block)
                    block = False
                    if item is None:
                        self._rows.fail_running(RuntimeError(STOPPED))
                        self._rows.fail_waiting(RuntimeError(STOPPED))
                        return
                    self._rows.put(item)
            except queue.Empty:
                pass
            try:
                self._rows.cycle()
            except Exception as e:  # delivered to the generations of that step, which raise it
                self._rows.fail_running(e)
