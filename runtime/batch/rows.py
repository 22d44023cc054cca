"""Sequences waiting for a batch row and those holding one: the admit, step, reap cycle that
`Pipeline.generate_batch` (run.py) and the batching scheduler (scheduler.py) both run.

A job is a sequence plus what its owner wants done when the batch lets go of it. Each cycle
admits waiting jobs into free rows in arrival order, cancels what its owner gave up on, runs one
batched step and hands every finished job back.
"""

from __future__ import annotations

from collections import deque
from typing import Protocol

from specx.runtime.batch.decoder import BatchDecoder
from specx.runtime.decode.sequence import Sequence


class Job(Protocol):
    seq: Sequence

    def admitted(self) -> None:
        """It takes a row now: claim what it needs only while it runs (a drafter from a pool)."""
        ...

    def cancelled(self) -> bool:
        """Whether its owner gave it up (checked before every step)."""
        ...

    def end(self, error: BaseException | None = None) -> None:
        """The batch lets go of it: done, cancelled, or failed with `error`. Nothing of it (its
        drafter included) is used after this."""
        ...


class RowQueue:
    def __init__(self, decoder: BatchDecoder, caller_waits_for_all: bool = False) -> None:
        """caller_waits_for_all: the owner takes every result at once (generate_batch), so once
        nothing waits for a row -k auto plans for the batch's last row (BatchDecoder's
        finish_together)."""
        self.decoder = decoder
        self.caller_waits_for_all = caller_waits_for_all
        self.waiting: deque[Job] = deque()
        self.running: list[Job] = []

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.running)

    def put(self, job: Job) -> None:
        self.waiting.append(job)

    def cycle(self) -> None:
        """Admit, cancel, step once, hand back what finished. An error of the step propagates
        (the caller decides what becomes of the running jobs: fail_running)."""
        while self.waiting and self.decoder.free_rows:
            self._admit(self.waiting.popleft())
        for job in self.running:
            if job.cancelled():
                self.decoder.cancel(job.seq)
        self.decoder.finish_together = self.caller_waits_for_all and not self.waiting
        self.decoder.step()
        for job in [j for j in self.running if j.seq.done]:
            self.running.remove(job)
            job.end()

    def fail_running(self, error: BaseException) -> None:
        """End every running job with `error` (their rows are freed); the waiting ones wait on."""
        for job in self.running:
            self.decoder.cancel(job.seq)
            job.end(error)
        self.running.clear()

    def fail_waiting(self, error: BaseException) -> None:
        while self.waiting:
            self.waiting.popleft().end(error)

    def _admit(self, job: Job) -> None:
        if job.cancelled():
            job.end()
            return
        try:
            job.admitted()
            self.decoder.add(job.seq)
        except Exception as e:  # delivered to its owner (a bad prompt for a row, say)
            job.end(e)
            return
        self.running.append(job)
