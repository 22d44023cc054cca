"""`specx triton`: a Triton Inference Server model repository for an artifact (repository.py)
and the Python-backend model it holds (model.py, run by tritonserver, not imported here)."""

from specx.apps.triton.repository import write_repository

__all__ = ["write_repository"]
