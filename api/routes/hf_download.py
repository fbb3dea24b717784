"""The ``format=hf`` and ``format=peft`` downloads' response: the ZIP is written to a temporary file
(the weights may be larger than memory should hold), streamed, and removed once sent."""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any, Protocol

from fastapi.responses import FileResponse
from starlette.background import BackgroundTask

from kernel.jobs.hf_release import HF_FORMAT, write_hf_zip
from kernel.jobs.peft_release import PEFT_FORMAT, write_peft_zip


class ZipWriter(Protocol):
    def __call__(self, model_path: Path, *, report: Mapping[str, Any], destination: IO[bytes]) -> None: ...


ZIP_WRITERS: dict[str, ZipWriter] = {HF_FORMAT: write_hf_zip, PEFT_FORMAT: write_peft_zip}
"""format → the writer of its ZIP: a Transformers folder, or a PEFT adapter folder."""


def zip_response(model_path: Path, *, format: str, report: Mapping[str, Any], filename: str) -> FileResponse:
    """The released model at ``model_path`` as a folder of ``format``, zipped (or the domain error
    ``model-format-unavailable`` for a model that has no such representation)."""
    handle = tempfile.NamedTemporaryFile(prefix="privtrain-hf-", suffix=".zip", delete=False)  # noqa: SIM115
    try:
        with handle:
            ZIP_WRITERS[format](model_path, report=report, destination=handle)
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
