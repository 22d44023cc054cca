"""libspecx from Python through ctypes: load an artifact, run a generation, read its statistics
and its errors. Only the C ABI of include/specx.h is used, as a binding in any other language
would (the tests and scripts/bench_libspecx.py use it). Standard library only.

    lib = Library()                      # $SPECX_LIBSPECX, else native/libspecx/build
    model = lib.load("build/smollm2", threads=2)
    result = model.generate(prompt_ids, max_new_tokens=64, k=4, drafter="int8")
    result.tokens, result.stats["decode_tokens_per_s"]
    chat = model.context()               # caches kept between its generations
    chat.generate(turn_ids).stats["reused_prompt_tokens"]
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BUILD = Path(__file__).resolve().parents[2] / "build"
ABI_VERSION = 2  # include/specx.h's SPECX_ABI_VERSION this binding speaks
MAX_K = 16
MAX_STEP_TOKENS = MAX_K + 1
K_DEFAULT = -1
K_AUTO = -2


def library_path() -> Path:
    """$SPECX_LIBSPECX, else the build of scripts/build_libspecx.sh."""
    named = os.environ.get("SPECX_LIBSPECX")
    return Path(named) if named else BUILD / "libspecx.so"


def binary(name: str) -> Path:
    """A program built beside the library (the C++ tests, the example worker)."""
    return library_path().parent / name


class Stats(ctypes.Structure):
    _fields_ = [
        ("prompt_tokens", ctypes.c_int64),
        ("new_tokens", ctypes.c_int64),
        ("target_passes", ctypes.c_int64),
        ("draft_passes", ctypes.c_int64),
        ("proposed", ctypes.c_int64),
        ("accepted", ctypes.c_int64),
        ("rejections", ctypes.c_int64),
        ("proposed_at", ctypes.c_int64 * MAX_K),
        ("accepted_at", ctypes.c_int64 * MAX_K),
        ("prefill_s", ctypes.c_double),
        ("draft_s", ctypes.c_double),
        ("verify_s", ctypes.c_double),
        ("decode_s", ctypes.c_double),
        ("tokens_per_s", ctypes.c_double),
        ("decode_tokens_per_s", ctypes.c_double),
        ("k", ctypes.c_int),
        ("adaptive", ctypes.c_int),
        ("drafter", ctypes.c_char_p),
        ("stop_reason", ctypes.c_char_p),
        ("reused_prompt_tokens", ctypes.c_int64),
    ]


class SpecxError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"[{code}] {message}")
        self.code = code
        self.message = message


@dataclass
class Result:
    tokens: list[int]
    steps: list[list[int]]
    stats: dict[str, Any]


def _declare(lib: Any) -> None:
    vp, i64, sz = ctypes.c_void_p, ctypes.c_int64, ctypes.c_size_t
    pp = ctypes.POINTER(ctypes.c_void_p)
    signatures: dict[str, tuple[Any, list[Any]]] = {
        "specx_abi_version": (ctypes.c_int, []),
        "specx_version": (ctypes.c_char_p, []),
        "specx_status_code": (ctypes.c_int, [vp]),
        "specx_status_message": (ctypes.c_char_p, [vp]),
        "specx_status_destroy": (None, [vp]),
        "specx_model_options_create": (vp, [pp]),
        "specx_model_options_destroy": (None, [vp]),
        "specx_model_options_set_threads": (vp, [vp, ctypes.c_int]),
        "specx_model_options_set_kernels_library": (vp, [vp, ctypes.c_char_p]),
        "specx_model_options_set_provider": (vp, [vp, ctypes.c_char_p]),
        "specx_model_options_set_device_id": (vp, [vp, ctypes.c_int]),
        "specx_model_load": (vp, [ctypes.c_char_p, vp, pp]),
        "specx_model_destroy": (None, [vp]),
        "specx_model_vocab_size": (i64, [vp]),
        "specx_model_max_length": (i64, [vp]),
        "specx_model_drafter_count": (sz, [vp]),
        "specx_model_drafter_name": (ctypes.c_char_p, [vp, sz]),
        "specx_model_default_drafter": (ctypes.c_char_p, [vp]),
        "specx_detokenizer_create": (vp, [vp, pp]),
        "specx_detokenizer_destroy": (None, [vp]),
        "specx_detokenizer_push": (
            vp,
            [vp, ctypes.POINTER(i64), sz, ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(sz)],
        ),
        "specx_detokenizer_finish": (
            vp,
            [vp, ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(sz)],
        ),
        "specx_params_create": (vp, [pp]),
        "specx_params_destroy": (None, [vp]),
        "specx_params_set_max_new_tokens": (vp, [vp, i64]),
        "specx_params_set_k": (vp, [vp, ctypes.c_int]),
        "specx_params_set_drafter": (vp, [vp, ctypes.c_char_p]),
        "specx_params_set_max_k": (vp, [vp, ctypes.c_int]),
        "specx_params_set_sampling": (
            vp,
            [vp, ctypes.c_double, ctypes.c_int, ctypes.c_double, ctypes.c_double],
        ),
        "specx_params_set_seed": (vp, [vp, ctypes.c_uint64]),
        "specx_params_set_verification": (vp, [vp, ctypes.c_char_p]),
        "specx_params_set_cache_scope": (vp, [vp, ctypes.c_char_p]),
        "specx_context_create": (vp, [vp, pp]),
        "specx_context_destroy": (None, [vp]),
        "specx_generation_create_in": (vp, [vp, ctypes.POINTER(i64), sz, vp, pp]),
        "specx_counter_uniform": (
            ctypes.c_double,
            [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint64],
        ),
        "specx_generation_create": (vp, [vp, ctypes.POINTER(i64), sz, vp, pp]),
        "specx_generation_destroy": (None, [vp]),
        "specx_generation_next": (
            vp,
            [vp, ctypes.POINTER(i64), sz, ctypes.POINTER(sz), ctypes.POINTER(ctypes.c_int)],
        ),
        "specx_generation_cancel": (None, [vp]),
        "specx_generation_stats": (vp, [vp, ctypes.POINTER(Stats)]),
    }
    for name, (restype, argtypes) in signatures.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes


class Library:
    def __init__(self, path: Path | None = None) -> None:
        self.lib = ctypes.CDLL(str(path or library_path()))
        _declare(self.lib)
        abi = int(self.lib.specx_abi_version())
        if abi != ABI_VERSION:
            raise SpecxError(0, f"libspecx speaks ABI {abi}; this binding speaks {ABI_VERSION}")

    def check(self, status: int | None) -> None:
        if status:
            code = int(self.lib.specx_status_code(status))
            message = self.lib.specx_status_message(status).decode()
            self.lib.specx_status_destroy(status)
            raise SpecxError(code, message)

    def load(
        self, folder: Path | str, threads: int = 0, provider: str = "cpu", device_id: int = 0
    ) -> Model:
        options = ctypes.c_void_p()
        self.check(self.lib.specx_model_options_create(ctypes.byref(options)))
        try:
            self.check(self.lib.specx_model_options_set_threads(options, threads))
            self.check(self.lib.specx_model_options_set_provider(options, provider.encode()))
            self.check(self.lib.specx_model_options_set_device_id(options, device_id))
            model = ctypes.c_void_p()
            self.check(
                self.lib.specx_model_load(str(folder).encode(), options, ctypes.byref(model))
            )
        finally:
            self.lib.specx_model_options_destroy(options)
        return Model(self, model)


class _Handle:
    """An opaque specx handle, released once by its `specx_*_destroy`."""

    destroy = ""  # the name of the destroy function

    def __init__(self, owner: Library, handle: ctypes.c_void_p) -> None:
        self.owner = owner
        self.lib = owner.lib
        self.handle = handle

    def close(self) -> None:
        if self.handle:
            getattr(self.lib, self.destroy)(self.handle)
            self.handle = ctypes.c_void_p()


class Model(_Handle):
    destroy = "specx_model_destroy"

    @property
    def vocab_size(self) -> int:
        return int(self.lib.specx_model_vocab_size(self.handle))

    @property
    def drafters(self) -> list[str]:
        n = self.lib.specx_model_drafter_count(self.handle)
        return [self.lib.specx_model_drafter_name(self.handle, i).decode() for i in range(n)]

    def detokenizer(self) -> Detokenizer:
        handle = ctypes.c_void_p()
        self.owner.check(self.lib.specx_detokenizer_create(self.handle, ctypes.byref(handle)))
        return Detokenizer(self.owner, handle)

    def context(self) -> Context:
        """Caches kept between the generations run in it (specx_context)."""
        handle = ctypes.c_void_p()
        self.owner.check(self.lib.specx_context_create(self.handle, ctypes.byref(handle)))
        return Context(self.owner, handle)

    def generate(self, prompt: list[int], *args: Any, **options: Any) -> Result:
        """A generation in a context of its own (nothing kept); options as _generate's."""
        return _generate(self, "specx_generation_create", prompt, *args, **options)


class Context(_Handle):
    destroy = "specx_context_destroy"

    def generate(self, prompt: list[int], *args: Any, **options: Any) -> Result:
        """A generation in this context: it keeps the prefix of its prompt the context holds."""
        return _generate(self, "specx_generation_create_in", prompt, *args, **options)


def _generate(
    where: _Handle,
    create: str,
    prompt: list[int],
    max_new_tokens: int = 32,
    k: int = K_DEFAULT,
    drafter: str | None = None,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
    seed: int | None = None,
    verification: str = "invariant",
    cache_scope: str | None = "",
) -> Result:
    lib, check = where.lib, where.owner.check
    params = ctypes.c_void_p()
    check(lib.specx_params_create(ctypes.byref(params)))
    generation = ctypes.c_void_p()
    try:
        check(lib.specx_params_set_max_new_tokens(params, max_new_tokens))
        check(lib.specx_params_set_k(params, k))
        check(lib.specx_params_set_drafter(params, drafter.encode() if drafter else None))
        check(lib.specx_params_set_sampling(params, temperature, top_k, top_p, min_p))
        check(lib.specx_params_set_verification(params, verification.encode()))
        scope = cache_scope.encode() if cache_scope is not None else None
        check(lib.specx_params_set_cache_scope(params, scope))
        if seed is not None:
            check(lib.specx_params_set_seed(params, seed))
        ids = (ctypes.c_int64 * len(prompt))(*prompt)
        create_fn = getattr(lib, create)
        check(create_fn(where.handle, ids, len(prompt), params, ctypes.byref(generation)))
        steps: list[list[int]] = []
        buf = (ctypes.c_int64 * MAX_STEP_TOKENS)()
        n, done = ctypes.c_size_t(), ctypes.c_int()
        while not done.value:
            check(
                lib.specx_generation_next(
                    generation, buf, MAX_STEP_TOKENS, ctypes.byref(n), ctypes.byref(done)
                )
            )
            if n.value:
                steps.append(list(buf[: n.value]))
        stats = Stats()
        check(lib.specx_generation_stats(generation, ctypes.byref(stats)))
        return Result([t for s in steps for t in s], steps, _stats_dict(stats))
    finally:
        lib.specx_generation_destroy(generation)
        lib.specx_params_destroy(params)


class Detokenizer(_Handle):
    """Streaming ids -> UTF-8 text (specx_detokenizer_*); push/finish return bytes."""

    destroy = "specx_detokenizer_destroy"

    def push(self, ids: list[int]) -> bytes:
        buf = (ctypes.c_int64 * len(ids))(*ids)
        return self._text(self.lib.specx_detokenizer_push, buf, len(ids))

    def finish(self) -> bytes:
        return self._text(self.lib.specx_detokenizer_finish)

    def _text(self, call: Any, *args: Any) -> bytes:
        text, length = ctypes.c_char_p(), ctypes.c_size_t()
        self.owner.check(call(self.handle, *args, ctypes.byref(text), ctypes.byref(length)))
        return ctypes.string_at(text, length.value)


def _stats_dict(s: Stats) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, _ in Stats._fields_:
        value = getattr(s, name)
        if isinstance(value, bytes):
            value = value.decode()
        elif not isinstance(value, int | float):
            value = list(value)
        out[name] = value
    return out
