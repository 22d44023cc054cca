"""Errors a user can act on. Each carries what went wrong and what to do about it.

The CLI prints ``error: <message>`` and ``  fix: <hint>`` and exits non-zero, without a traceback
(``--debug`` shows it). Library users catch :class:`SpecxError`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


class SpecxError(Exception):
    """Base class: a problem with the user's input, artifact or environment."""

    exit_code = 2

    def __init__(self, message: str, hint: str | None = None, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        # the input it concerns: a GenerationSettings or SamplingParams field ("k", "drafter",
        # "grammar", "temperature", ...) or "prompt"; None: no one input (a server maps it to
        # its own request field: apps/serve/protocol.py)
        self.field = field

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message} ({self.hint})"


@contextmanager
def concerning(field: str) -> Iterator[None]:
    """Errors raised inside concern the input `field` (unless they name one already)."""
    try:
        yield
    except SpecxError as e:
        if e.field is None:
            e.field = field
        raise


class ArtifactError(SpecxError):
    """The exported artifact is missing, corrupt, or does not match its manifest."""


class ExportError(SpecxError):
    """The source models cannot be exported as asked."""


class InputError(SpecxError):
    """A prompt, option or sampling value is out of range."""


class ProviderError(SpecxError):
    """An execution provider (CUDA, TensorRT) was asked for but is not usable here."""
