"""Files that are either whole or absent: written to a temporary file in the same folder, fsynced, renamed.

A crash (or SIGKILL) in the middle of a write leaves the previous version of the file intact.
"""
from __future__ import annotations

import io
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

__all__ = ["atomic_write", "save_figure", "torch_save", "write_bytes", "write_text"]


def atomic_write(path: str | Path, write: Callable[[Any], None], binary: bool = True) -> Path:
    """Call ``write(handle)`` on a temporary file beside ``path``, fsync it, then rename it onto ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb" if binary else "w", **({} if binary else {"encoding": "utf-8"})) as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes it private; a result file is as readable as any other
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_bytes(path: str | Path, data: bytes) -> Path:
    return atomic_write(path, lambda handle: handle.write(data))


def write_text(path: str | Path, text: str) -> Path:
    return atomic_write(path, lambda handle: handle.write(text), binary=False)


def torch_save(obj: Any, path: str | Path) -> Path:
    """``torch.save`` that never leaves a truncated file behind."""
    import torch

    return atomic_write(path, lambda handle: torch.save(obj, handle))


def save_figure(figure: Any, path: str | Path, dpi: int = 150, **kwargs: Any) -> Path:
    """``figure.savefig`` to ``path`` (format from its suffix), atomically."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format=Path(path).suffix.lstrip(".") or "png", dpi=dpi, **kwargs)
    return write_bytes(path, buffer.getvalue())
