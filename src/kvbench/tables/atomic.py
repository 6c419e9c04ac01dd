"""Files published whole or not at all; a failed write names its file.

Every file kvbench's tables write goes through :func:`atomic_path` (or, streamed,
``ParquetStream``, which follows the same steps): it is written to a temporary file beside its
destination (``.NAME.tmp-PID``), flushed to the disk (``fsync``), renamed over the destination
(``os.replace``, atomic on POSIX) and the folder flushed too. A reader therefore sees the old file
or the new one, never a part: a run killed at any point (SIGKILL, power loss) leaves at most a
hidden temporary file, which the next run in that folder removes (:func:`remove_stale_temporaries`).
A write that fails (a full disk) removes its temporary file and leaves the destination as it was.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from kvbench.tables.kill_points import kill_point

TEMPORARY_INFIX = ".tmp-"
# How deep below its output folder a run writes: <grid point>/steps/, operating/<point>/plots/.
MAX_WRITE_DEPTH = 3


def temporary_path(path: Path) -> Path:
    """Where ``path`` is written before it is published: hidden, beside it, named by this process
    (so parallel jobs never share one, and readers of a folder skip it: a leading dot)."""
    return path.with_name(f".{path.name}{TEMPORARY_INFIX}{os.getpid()}")


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """Yield a temporary path to write ``path``'s content to; publish it when the block ends.

    On an exception the temporary file is removed and ``path`` keeps its previous content; an
    ``OSError`` comes back naming ``path`` (writers such as pyarrow's do not always say which
    file failed).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp_path = temporary_path(path)
    try:
        yield tmp_path
        kill_point(path, "written")
        publish(tmp_path, path)
    except BaseException as error:
        tmp_path.unlink(missing_ok=True)
        if isinstance(error, OSError):
            raise naming(error, path) from error
        raise
    kill_point(path, "published")


def publish(tmp_path: Path, path: Path) -> None:
    """Flush ``tmp_path`` to the disk and rename it to ``path`` (then flush the folder, so the
    rename itself survives a power loss)."""
    with open(tmp_path, "rb") as written:
        os.fsync(written.fileno())
    os.replace(tmp_path, path)
    _fsync_folder(path.parent)


def _fsync_folder(folder: Path) -> None:
    try:
        descriptor = os.open(folder, os.O_RDONLY)
    except OSError:  # a folder that cannot be opened (some platforms): the rename still holds
        return
    try:
        os.fsync(descriptor)
    except OSError:  # file systems that cannot fsync a folder
        pass
    finally:
        os.close(descriptor)


def naming(error: OSError, path: Path) -> OSError:
    """``error`` as an OSError that names ``path`` (unchanged when it names a file already)."""
    if error.filename is not None:
        return error
    return OSError(error.errno, error.strerror or str(error), str(path))


def remove_stale_temporaries(folder: Path) -> list[Path]:
    """Remove the temporary files that killed writers left in ``folder`` and the folders a run
    writes below it (``MAX_WRITE_DEPTH`` levels: ``operating/<point>/steps/``; an output folder
    set to a large tree is not walked whole).

    A temporary file of a process still running (a parallel job writing there) is kept.
    Returns the removed paths.
    """
    removed = []
    patterns = ("*/" * depth + f".*{TEMPORARY_INFIX}*" for depth in range(MAX_WRITE_DEPTH + 1))
    for tmp_path in (path for pattern in patterns for path in folder.glob(pattern)):
        pid_text = tmp_path.name.rpartition(TEMPORARY_INFIX)[2]
        if not pid_text.isdigit() or not tmp_path.is_file() or _is_running(int(pid_text)):
            continue
        tmp_path.unlink(missing_ok=True)
        removed.append(tmp_path)
    return removed


def _is_running(pid: int) -> bool:
    if pid == os.getpid():
        return False  # this process has written nothing in this folder yet
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def write_text_atomic(path: Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` through :func:`atomic_path` (a run's ``report.md``)."""
    with atomic_path(path) as tmp_path:
        tmp_path.write_text(text, encoding="utf-8")
    return path
