"""Reading what a student, or a student's kernel, could have written.

Only regular files, opened without following a symbolic link (``O_NOFOLLOW``) and without
waiting on a FIFO (``O_NONBLOCK``), never more than a stated number of bytes; folders walked
without entering a link, and never more than a stated number of entries. A link in a student's
folder would hand the grader, which may run as root, a file of the instructor's (the solutions);
a FIFO where the grader reads a log blocks it forever; a file of 100 GB takes its memory.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path


class UnsafeFile(OSError):
    """A path the grader will not read: a link, a FIFO, a device, a folder, or past its bound."""


def _open_regular(path: Path) -> tuple[int, os.stat_result]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise UnsafeFile(errno.ELOOP, "a symbolic link, which grading does not follow", str(path)) from None
        raise
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise UnsafeFile(errno.EINVAL, "not a regular file", str(path))
    return fd, info


def read_regular(path: Path, limit: int) -> bytes:
    """The whole of the regular file at ``path``; UnsafeFile where it is anything else or holds more than
    ``limit`` bytes (counted as read, not as its size says: the file may grow)."""
    fd, _ = _open_regular(path)
    with os.fdopen(fd, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise UnsafeFile(errno.EFBIG, f"larger than {limit:,} bytes", str(path))
    return data


def read_tail(path: Path, limit: int) -> bytes:
    """The last ``limit`` bytes of the regular file at ``path`` (a kernel's log); b"" where it is not one."""
    try:
        fd, info = _open_regular(path)
    except OSError:
        return b""
    with os.fdopen(fd, "rb") as f:
        f.seek(max(0, info.st_size - limit))
        return f.read(limit)


def regular_files(folder: Path, max_entries: int) -> Iterator[Path]:
    """Every regular file under ``folder``, in name order, without entering a symbolic link or yielding one;
    UnsafeFile once more than ``max_entries`` files and folders were seen."""
    seen = 0
    for root, dirs, files in os.walk(folder, followlinks=False):
        dirs.sort()
        seen += len(dirs) + len(files)
        if seen > max_entries:
            raise UnsafeFile(errno.EFBIG, f"more than {max_entries:,} files and folders", str(folder))
        for name in sorted(files):
            path = Path(root, name)
            try:
                if stat.S_ISREG(os.lstat(path).st_mode):
                    yield path
            except OSError:
                continue
