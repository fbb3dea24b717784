"""The ``format=hf`` download's response: the ZIP is written to a temporary file (the weights may be
larger than memory should hold), streamed, and removed once sent."""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fastapi.responses import FileResponse
from starlette.background import BackgroundTask

from kernel.jobs.hf_release import write_hf_zip


def hf_zip_response(model_path: Path, *, report: Mapping[str, Any], filename: str) -> FileResponse:
    """The released `hf` model at ``model_path`` as a Transformers folder, zipped (or the domain
    error ``model-format-unavailable`` for a model that is not an `hf` one)."""
    handle = tempfile.NamedTemporaryFile(prefix="privtrain-hf-", suffix=".zip", delete=False)  # noqa: SIM115
    try:
        with handle:
            write_hf_zip(model_path, report=report, destination=handle)
    except BaseException:
        os.unlink(handle.name)
        raise
    digest = hashlib.sha256()
    with open(handle.name, "rb") as written:
        for chunk in iter(lambda: written.read(1 << 20), b""):
            digest.update(chunk)
    return FileResponse(
        handle.name,
        media_type="application/zip",
        filename=filename,
        headers={"X-Content-SHA256": digest.hexdigest()},  # the client checks it as for the model file
        background=BackgroundTask(os.unlink, handle.name),
    )
