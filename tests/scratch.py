"""Disk for the suite's big fixtures: a folder a session or module fixture exports into (a real
model's artifact is 0.3-2 GB) is deleted as soon as no test still to run uses that fixture, not
when the session ends. The whole suite otherwise holds every real-model export at once, more than
a CI machine's free disk can be (tests' own tmp_path folders go once the test passed:
pyproject's tmp_path_retention_policy). A plugin (conftest's pytest_plugins)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

# fixture name -> the folders it made that go once its last user has run
_HELD: dict[str, list[Path]] = {}
# fixture name -> index in the session's run order of the last test that uses it
_LAST_USE: dict[str, int] = {}
_ORDER: dict[str, int] = {}


def fixture_dir(request: Any, tmp_path_factory: Any, name: str) -> Path:
    """A new folder for the fixture asking (`request`), deleted when the fixture is torn down
    (a module's fixture: at the module's end, or when its parameter changes) or when no test
    still to run needs it (a session's fixture), whichever comes first. Only for fixtures that
    tests name as arguments: one reached by request.getfixturevalue alone is kept to its end."""
    folder = Path(tmp_path_factory.mktemp(name))
    _HELD.setdefault(request.fixturename, []).append(folder)
    request.addfinalizer(lambda: shutil.rmtree(folder, ignore_errors=True))
    return folder


def _index(session: Any) -> None:
    for i, item in enumerate(session.items):
        _ORDER[item.nodeid] = i
        for name in getattr(item, "fixturenames", ()):
            _LAST_USE[name] = i


def pytest_runtest_teardown(item: Any, nextitem: Any) -> None:
    if not _ORDER:
        _index(item.session)
    here = _ORDER.get(item.nodeid, -1)
    for name in [n for n in _HELD if n in _LAST_USE and _LAST_USE[n] <= here]:
        for folder in _HELD.pop(name):
            shutil.rmtree(folder, ignore_errors=True)
