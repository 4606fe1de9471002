"""Files that are either whole or absent: written to a temporary file in the same folder, fsynced, renamed.

A crash (or SIGKILL) in the middle of a write leaves the previous version of the file intact.
:func:`replace_together` does the same for a group of files (a result's ``.pt`` and ``.json``): the previous
versions are kept as hard links (``.<name>.prev``) until every new file is in place, so a failure at any step
can be rolled back, and a reader that finds backups beside a group that does not fit together reads those.
Every error names the file and the step that failed.
"""
from __future__ import annotations

import contextlib
import errno
import glob
import io
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

try:
    import fcntl
except ImportError:  # Windows: saves into one folder are not serialised
    fcntl = None

__all__ = ["atomic_write", "backup_path", "locked", "replace_together", "resolve_interrupted", "save_figure",
           "torch_save", "write_bytes", "write_text"]

# a directory fsync that the file system does not support is skipped; any other failure is an error
_FSYNC_UNSUPPORTED = {errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EBADF, errno.EISDIR}


def _named(error: OSError, step: str, path: Path) -> OSError:
    """``error`` again, saying which step on which file failed (an ``OSError`` of the same errno and class)."""
    named = OSError(error.errno, f"{step} {path} failed: {error.strerror or error}", str(path))
    named.__cause__ = error
    return named


def _temporary(path: Path) -> tuple[int, Path]:
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as error:
        raise _named(error, "creating a temporary file in", path.parent) from error
    return fd, Path(tmp)


def _write_and_sync(fd: int, data: bytes | memoryview, path: Path) -> None:
    """Write ``data`` to ``fd`` (of a temporary file for ``path``) and fsync it."""
    view = memoryview(data)
    try:
        while view:
            view = view[os.write(fd, view):]
    except OSError as error:
        raise _named(error, "writing", path) from error
    try:
        os.fsync(fd)
    except OSError as error:
        raise _named(error, "fsync of", path) from error
    if hasattr(os, "fchmod"):
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes it private; a result is as readable as any other file


def _replace(source: Path, target: Path) -> None:
    try:
        os.replace(source, target)
    except OSError as error:
        raise _named(error, "renaming the new file onto", target) from error


def atomic_write(path: str | Path, write: Callable[[Any], None], binary: bool = True) -> Path:
    """Call ``write(handle)`` on an in-memory file, then write it to a temporary file beside ``path``, fsync it,
    rename it onto ``path`` and fsync the folder."""
    path = Path(path)
    buffer = io.BytesIO() if binary else io.StringIO()
    write(buffer)
    return write_bytes(path, buffer.getbuffer() if binary else buffer.getvalue().encode("utf-8"))


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _fsync_dir(directory: Path) -> None:
    if os.name == "nt":
        return
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError as error:
        raise _named(error, "opening the folder", directory) from error
    try:
        os.fsync(fd)
    except OSError as error:
        if error.errno not in _FSYNC_UNSUPPORTED:
            raise _named(error, "fsync of the folder", directory) from error
    finally:
        os.close(fd)


def make_directory(directory: Path) -> None:
    if directory.exists() and not directory.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, f"{directory} is a file, not a folder: choose another folder to "
                                                "save into or remove the file", str(directory))
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise _named(error, "creating the folder", directory) from error


def _refuse_directory(path: Path) -> None:
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, f"{path} is a folder, so no file can be saved under that name: "
                                              "remove or rename the folder, or save elsewhere", str(path))


def write_bytes(path: str | Path, data: bytes | memoryview) -> Path:
    path = Path(path)
    make_directory(path.parent)
    _refuse_directory(path)
    fd, tmp = _temporary(path)
    try:
        try:
            _write_and_sync(fd, data, path)
        finally:
            os.close(fd)
        _replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)
    return path


def write_text(path: str | Path, text: str) -> Path:
    return write_bytes(path, text.encode("utf-8"))


def torch_save(obj: Any, path: str | Path) -> Path:
    """``torch.save`` that never leaves a truncated file behind."""
    import torch

    return atomic_write(path, lambda handle: torch.save(obj, handle))


def save_figure(figure: Any, path: str | Path, dpi: int = 150, **kwargs: Any) -> Path:
    """``figure.savefig`` to ``path`` (format from its suffix), atomically."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format=Path(path).suffix.lstrip(".") or "png", dpi=dpi, **kwargs)
    return write_bytes(path, buffer.getbuffer())


@contextlib.contextmanager
def locked(directory: Path, shared: bool = False) -> Iterator[None]:
    """Hold an advisory lock on ``directory``: exclusive for a writer, shared for a reader (POSIX ``flock``;
    no lock where the platform or the file system offers none)."""
    if fcntl is None:
        yield
        return
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # no folder: nothing to serialise with
        yield
        return
    try:
        with contextlib.suppress(OSError):  # e.g. ENOLCK on some network file systems
            fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def backup_path(path: Path) -> Path:
    """Where :func:`replace_together` keeps the previous version of ``path`` while it replaces it."""
    return path.with_name(f".{path.name}.prev")


def _keep_as_backup(path: Path) -> Path | None:
    if not path.exists():
        return None
    backup = backup_path(path)
    backup.unlink(missing_ok=True)
    try:
        os.link(path, backup)
    except OSError as error:
        if error.errno not in (errno.EPERM, errno.EXDEV, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK):
            raise _named(error, "keeping the previous version of", path) from error
        write_bytes(backup, path.read_bytes())  # a file system without hard links: a copy
    return backup


def _restore(path: Path, backup: Path) -> None:
    os.replace(backup, path)
    backup.unlink(missing_ok=True)  # a rename onto a hard link of the same file leaves both names


def resolve_interrupted(paths: Sequence[Path], keep_previous: Callable[[], bool]) -> None:
    """Finish what an interrupted :func:`replace_together` of ``paths`` left: put the backups back where
    ``keep_previous()`` says they hold a whole previous version, else remove them; remove its temporaries."""
    backups = [(p, backup_path(p)) for p in paths if backup_path(p).exists()]
    if backups:
        restore = keep_previous()
        for path, backup in backups:
            if restore:
                _restore(path, backup)
            else:
                backup.unlink()
    for path in paths:
        for stale in path.parent.glob(f".{glob.escape(path.name)}.*.tmp"):
            stale.unlink(missing_ok=True)
    if backups:
        _fsync_dir(paths[0].parent)


def replace_together(files: Sequence[tuple[Path, bytes | memoryview]]) -> None:
    """Replace each ``path`` by its ``data``, in the given order, as one change.

    Steps: write and fsync a temporary file for each; hard-link each current file to its backup
    (:func:`backup_path`); fsync the folder; rename the temporaries onto their paths in order; fsync the folder;
    remove the backups, the last file's first. On any failure the previous files are put back (a file that did
    not exist is removed) and the error, naming the file and the step, is raised. The change is complete when
    the first backup is removed: until then a reader that finds the backups (and they fit together) reads
    them, and the next :func:`resolve_interrupted` puts them back. A failure after that point (removing the
    backups, the last fsync) does not fail the change. Callers hold :func:`locked` on the folder.
    """
    directory = files[0][0].parent
    for path, _ in files:
        _refuse_directory(path)
    temporaries: list[Path] = []
    backups: list[tuple[Path, Path | None]] = []
    renamed: list[Path] = []
    try:
        for path, data in files:
            fd, tmp = _temporary(path)
            temporaries.append(tmp)
            try:
                _write_and_sync(fd, data, path)
            finally:
                os.close(fd)
        for path, _ in files:
            backups.append((path, _keep_as_backup(path)))
        _fsync_dir(directory)
        for (path, _), tmp in zip(files, temporaries):
            _replace(tmp, path)
            renamed.append(path)
        _fsync_dir(directory)
    except BaseException:
        _roll_back(renamed, dict(backups), temporaries, directory)
        raise
    with contextlib.suppress(OSError):  # the new files are in place and durable: the change is done
        for _, backup in reversed(backups):
            if backup is not None:
                backup.unlink()
        _fsync_dir(directory)  # so that the backups do not come back after a power loss


def _roll_back(renamed: list[Path], backups: dict[Path, Path | None], temporaries: list[Path],
               directory: Path) -> None:
    """Best effort: where this fails too, the backups stay and readers use them."""
    with contextlib.suppress(OSError):
        for path in reversed(renamed):
            if backups.get(path) is None:
                path.unlink(missing_ok=True)
        for path, backup in backups.items():
            if backup is not None:
                _restore(path, backup)
        _fsync_dir(directory)
    for tmp in temporaries:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
