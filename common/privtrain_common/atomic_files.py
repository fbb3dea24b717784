"""Files written whole or not at all, and what a killed write leaves behind.

Torch-free: the worker writes checkpoints and models with it, and the service's reconciler finds
the temp files of a worker that was killed mid-write.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import os
import tempfile
from pathlib import Path

__all__ = ["unfinished_writes", "write_atomically"]


def write_atomically(path: Path, data: bytes) -> str:
    """Write via a temp file in the same directory + os.replace; return the sha256 hex.

    Readers see either no file or the complete file, never a torn one.
    """
    path = Path(path)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise
    return hashlib.sha256(data).hexdigest()


def unfinished_writes(path: Path) -> list[Path]:
    """The temp files ``write_atomically(path, ...)`` leaves when its process is killed mid-write
    (SIGKILL, power loss): nothing else removes them, and they may hold secret bytes."""
    path = Path(path)
    return sorted(path.parent.glob(f".{glob.escape(path.name)}.*.tmp"))
