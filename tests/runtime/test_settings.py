"""GenerationSettings: one frozen object per generation; the API's keywords map onto it."""

from __future__ import annotations

import dataclasses

import pytest

from specx.runtime import GenerationSettings, SamplingParams
from specx.runtime.errors import InputError


def test_keyword_options_and_sampling_shortcuts_map_onto_the_fields() -> None:
    settings = GenerationSettings.of(k="3", max_new_tokens=9, temperature=0.7, seed=4)
    assert settings.k == 3 and settings.max_new_tokens == 9
    assert settings.sampling == SamplingParams(temperature=0.7, seed=4)
    on_top = GenerationSettings.of(settings, top_p=0.5)
    assert on_top.sampling.top_p == 0.5 and on_top.sampling.seed == 4 and on_top.k == 3
    assert GenerationSettings.of(k="auto").k == "auto"


def test_settings_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        GenerationSettings().k = 2  # type: ignore[misc]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"k": 17}, r"K must be in 0\.\.16"),
        ({"k": "lots"}, "K must be a number or 'auto'"),
        ({"max_k": 0}, r"max K must be in 1\.\.16"),
        ({"max_new_tokens": 0}, "max-new-tokens must be >= 1"),
        ({"draft_p_min": 1.0}, r"draft-p-min must be in \[0, 1\)"),
        ({"tempreature": 0.5}, "unknown generation option"),
        ({"temperature": 0.5, "sampling": SamplingParams()}, "either sampling="),
    ],
)
def test_bad_options_name_the_problem(options: dict[str, object], message: str) -> None:
    with pytest.raises(InputError, match=message):
        GenerationSettings.of(**options)  # type: ignore[arg-type]
