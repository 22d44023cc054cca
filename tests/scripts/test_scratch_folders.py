"""tests/scratch.py, the suite's disk keeper: a big fixture's folder is gone once the last test
that names the fixture has run, and not before."""

from __future__ import annotations

from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]

CONFTEST = f"""
import sys
sys.path.insert(0, {str(TESTS)!r})
pytest_plugins = ["scratch"]
"""

SUITE = """
from pathlib import Path
import pytest
from scratch import fixture_dir

SEEN = {}

@pytest.fixture(scope="session")
def big(request, tmp_path_factory):
    folder = fixture_dir(request, tmp_path_factory, "big")
    (folder / "weights").write_bytes(b"x" * 1000)
    SEEN["big"] = folder
    return folder

@pytest.fixture(scope="module")
def per_module(request, tmp_path_factory):
    folder = fixture_dir(request, tmp_path_factory, "mod")
    SEEN["mod"] = folder
    return folder

def test_a_first_user(big):
    assert (big / "weights").is_file()

def test_b_no_user_in_between():
    assert SEEN["big"].is_dir(), "deleted while a later test still names the fixture"

def test_c_module_user(per_module, big):
    assert (big / "weights").is_file() and per_module.is_dir()

def test_d_after_the_last_user():
    assert not SEEN["big"].exists(), "kept after its last user"
"""


def test_a_fixture_folder_lives_exactly_until_its_last_user_has_run(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(passed=4)


def test_the_check_fails_where_the_folder_outlives_its_last_user(
    pytester: pytest.Pytester,
) -> None:
    """Negative control: the same suite with the folder made by plain mktemp (kept to the
    session's end) fails its last test."""
    pytester.makeconftest(CONFTEST)
    plain = SUITE.replace(
        'fixture_dir(request, tmp_path_factory, "big")', 'tmp_path_factory.mktemp("big")'
    )
    pytester.makepyfile(test_suite=plain)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(passed=3, failed=1)
    result.stdout.fnmatch_lines(["*kept after its last user*"])
