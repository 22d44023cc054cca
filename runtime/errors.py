"""Errors a user can act on. Each carries what went wrong and what to do about it.

The CLI prints ``error: <message>`` and ``  fix: <hint>`` and exits non-zero, without a traceback
(``--debug`` shows it). Library users catch :class:`SpecxError`.
"""

from __future__ import annotations


class SpecxError(Exception):
    """Base class: a problem with the user's input, artifact or environment."""

    exit_code = 2

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message} ({self.hint})"


class ArtifactError(SpecxError):
    """The exported artifact is missing, corrupt, or does not match its manifest."""


class ExportError(SpecxError):
    """The source models cannot be exported as asked."""


class InputError(SpecxError):
    """A prompt, option or sampling value is out of range."""


class ProviderError(SpecxError):
    """An execution provider (CUDA, TensorRT) was asked for but is not usable here."""
