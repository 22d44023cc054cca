"""Where an export writes before it is done: a hidden folder beside the output, locked while an
export writes it, published by one rename, and cleaned up by the next export if it was left.

    .NAME.partial-XXXX/   the folder being written; holds LOCK_FILE, flock()ed by its export
    .NAME.old-XXXX/       the previous artifact for the instant of an atomic replacement

A process killed by any signal releases its lock (the kernel drops it with the process), so the
next export to the same place can tell a leftover (lock free: removed) from a folder that a
running export still writes (lock held: left alone).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from types import TracebackType

from specx.exporter.weights.load import Log

LOCK_FILE = ".specx-export.lock"
# A partial folder without a lock (older specx) is a leftover once nothing in it changed for this.
UNLOCKED_GRACE_S = 600.0
BACKUP_GRACE_S = 60.0  # a backup younger than this may belong to a replacement in progress


def _newest_change(folder: Path) -> float:
    times = [folder.stat().st_mtime]
    times += [p.stat().st_mtime for p in folder.rglob("*") if p.exists()]
    return max(times)


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def in_use(folder: Path) -> bool:
    """Does a running export still write `folder`?"""
    lock = folder / LOCK_FILE
    if not lock.exists():
        return time.time() - _newest_change(folder) < UNLOCKED_GRACE_S
    try:
        fd = os.open(lock, os.O_RDWR)
    except OSError:
        return True  # cannot even open it: not ours to delete
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # also releases the lock taken just now
    return False


def remove_leftovers(output: Path, log: Log) -> None:
    """Remove what exports to `output` left behind when they were killed or failed."""
    for folder in sorted(output.parent.glob(f".{output.name}.partial-*")):
        if not folder.is_dir():
            continue
        if in_use(folder):
            log(f"left {folder} alone: another export is writing it")
            continue
        size = _size(folder)
        shutil.rmtree(folder, ignore_errors=True)
        log(f"removed {folder} ({size / 1e6:.0f} MB), left by an export that did not finish")
    for backup in sorted(output.parent.glob(f".{output.name}.old-*")):
        if time.time() - backup.stat().st_mtime < BACKUP_GRACE_S:
            continue
        if output.exists():
            shutil.rmtree(backup, ignore_errors=True)
            log(f"removed {backup}, a previous artifact kept during an interrupted replacement")
        else:
            os.replace(backup, output)
            log(f"restored {output} from {backup.name}: a replacement was interrupted")


def replace_atomically(staged: Path, output: Path) -> None:
    """Move the finished `staged` folder to `output`, replacing an old artifact if present."""
    if not output.exists():
        os.replace(staged, output)
        return
    backup = output.with_name(f".{output.name}.old-{uuid.uuid4().hex[:8]}")
    os.replace(output, backup)
    try:
        os.replace(staged, output)
    except OSError:
        os.replace(backup, output)  # put the previous artifact back
        raise
    shutil.rmtree(backup, ignore_errors=True)


class StagedFolder:
    """``with StagedFolder(output, log) as staged: ...write into staged.path...; staged.publish()``
    Leaving the block without publishing removes the folder."""

    def __init__(self, output: Path, log: Log) -> None:
        self.output = output
        self.log = log
        self.path = output
        self._lock: int | None = None
        self._published = False

    def __enter__(self) -> StagedFolder:
        self.output.parent.mkdir(parents=True, exist_ok=True)
        remove_leftovers(self.output, self.log)
        prefix = f".{self.output.name}.partial-"
        self.path = Path(tempfile.mkdtemp(prefix=prefix, dir=self.output.parent))
        os.chmod(self.path, 0o755)  # mkdtemp makes it private; an artifact is meant to be shared
        self._lock = os.open(self.path / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        os.write(self._lock, f"{os.getpid()}\n".encode())
        return self

    def _unlock(self) -> None:
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None
            (self.path / LOCK_FILE).unlink(missing_ok=True)

    def publish(self) -> None:
        self._unlock()
        replace_atomically(self.path, self.output)
        self._published = True

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if not self._published:
            self._unlock()
            shutil.rmtree(self.path, ignore_errors=True)
