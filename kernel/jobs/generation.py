"""Sample text from a finished language model, asked of a capped child process (the API never imports torch).

The API checks what it can without torch (the job is the caller's to read, succeeded, a language
model, with its model file), then runs ``python -m worker.generation`` under a wall-clock timeout;
the child limits its own CPU time and address space before importing torch, so one request costs
at most those. A deployment without torch answers ``generation-unavailable``.

Generating from a released model is post-processing of it: it reads no training row and costs no
privacy budget, so nothing is charged, stored or recorded.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from sqlalchemy.orm import Session

from kernel.access.roles import job_for
from kernel.db.orm import Dataset, Job, Tenant, TokenizerRecord
from kernel.errors import Conflict, InvalidInput, Unavailable
from kernel.jobs.status import JobStatus
from kernel.storage.blobs import BlobStore
from kernel.tokenizers.base import BYTE_TOKENIZER_ID

__all__ = [
    "POST_PROCESSING_STATEMENT",
    "Generated",
    "GenerationFailed",
    "GenerationLimits",
    "GenerationRequest",
    "GenerationTarget",
    "GenerationTimedOut",
    "GenerationUnavailable",
    "JobNotSucceeded",
    "NotALanguageModel",
    "generate",
    "generation_target",
]

POST_PROCESSING_STATEMENT: Final = (
    "text generated from the released model is post-processing of it: generating reads no training row "
    "and costs no privacy budget"
)
PRIVATE_BOUND: Final = "whatever the text reveals about the training rows is bounded by the job's guarantee"
PUBLIC_BOUND: Final = "the dataset is public, so nothing bounds how much of its text the samples reproduce"

log = logging.getLogger("privtrain.generation")

CHILD_MODULE: Final = "worker.generation"
MAX_CHILD_OUTPUT_BYTES: Final = 1024 * 1024
"""A child answer larger than this is refused: a few hundred tokens never decode to more."""


class GenerationUnavailable(Unavailable):
    """This deployment cannot run the model (no torch where the API runs, or the child did not start)."""

    def __init__(self, detail: str) -> None:
        super().__init__(slug="generation-unavailable", detail=detail)


class GenerationTimedOut(Unavailable):
    """The child ran past its wall-clock limit (503: the service was too busy or the model too large)."""

    def __init__(self, timeout_s: float) -> None:
        super().__init__(
            slug="generation-timed-out",
            detail=f"generating took longer than {timeout_s:g} s and was stopped; retry with fewer max_tokens",
            extra={"timeout_s": timeout_s},
            retry_after_s=max(1, round(timeout_s)),
        )


class GenerationFailed(InvalidInput):
    """The child ran but refused the request (a prompt that encodes to no token, a broken model file)."""

    def __init__(self, detail: str) -> None:
        super().__init__(slug="generation-failed", detail=detail)


class JobNotSucceeded(Conflict):
    def __init__(self, status: str) -> None:
        super().__init__(
            slug="job-not-succeeded",
            detail=f"text can be generated only from a succeeded job's model; this job is {status}",
            extra={"status": status},
        )


class NotALanguageModel(InvalidInput):
    def __init__(self, task: str) -> None:
        super().__init__(
            slug="not-a-language-model",
            detail=f"this job trained a {task} model; text can be generated only from a language model "
            "(a transformer-lm on a language-model text dataset)",
            extra={"task": task},
        )


@dataclass(frozen=True)
class GenerationLimits:
    timeout_s: float
    cpu_s: int
    address_space_bytes: int


@dataclass(frozen=True)
class GenerationRequest:
    prompt: str
    max_tokens: int
    temperature: float
    top_k: int | None


@dataclass(frozen=True)
class GenerationTarget:
    """What the child needs, read from the database (no row is held while it runs)."""

    job_id: str
    model_path: Path
    model_sha256: str
    tokenizer: dict[str, Any]
    """``{"kind": "byte"}`` or ``{"kind": "hugging-face", "path": ..., "pad_id": ...}``."""
    statement: str
    """What generating costs, and what bounds what the text reveals (nothing, for public data)."""


@dataclass(frozen=True)
class Generated:
    text: str
    tokens_generated: int


def generation_target(session: Session, tenant: Tenant, job_id: str, *, blobs: BlobStore) -> GenerationTarget:
    """The caller's succeeded language-model job; 404 if it may not read it, 422 unless it is a
    language model (checked first: waiting would not change it), 409 unless it succeeded."""
    job = job_for(session, tenant, job_id, need="read")
    dataset = session.get(Dataset, job.dataset_id)
    assert dataset is not None  # a job's dataset row is never deleted while jobs reference it
    if dataset.task != "language-model":
        raise NotALanguageModel(dataset.task)
    if job.status != JobStatus.SUCCEEDED or job.model_blob is None:
        raise JobNotSucceeded(job.status)
    return GenerationTarget(
        job_id=job.id,
        model_path=blobs.local_path(job.model_blob),
        model_sha256=job.model_sha256 or "",
        tokenizer=_tokenizer_of(session, job, dataset, blobs=blobs),
        statement=f"{POST_PROCESSING_STATEMENT}; {PUBLIC_BOUND if dataset.public else PRIVATE_BOUND}",
    )


def _tokenizer_of(session: Session, job: Job, dataset: Dataset, *, blobs: BlobStore) -> dict[str, Any]:
    """The dataset's tokenizer. Not tenant-scoped: a dataset's tokenizer is public to everyone who
    may read the dataset (an analyst's job uses the owner's tokenizer)."""
    if dataset.tokenizer_id in (None, BYTE_TOKENIZER_ID):
        return {"kind": "byte"}
    record = session.get(TokenizerRecord, dataset.tokenizer_id)
    if record is None:
        raise GenerationFailed(f"job {job.id}'s dataset names tokenizer {dataset.tokenizer_id}, which is gone")
    return {"kind": "hugging-face", "path": str(blobs.local_path(record.blob_key)), "pad_id": record.pad_id}


def generate(target: GenerationTarget, request: GenerationRequest, *, limits: GenerationLimits) -> Generated:
    """Run the child (blocking: call it from a worker thread) and read its answer."""
    message = json.dumps(
        {
            "model_path": str(target.model_path),
            "tokenizer": target.tokenizer,
            "prompt": request.prompt,
            "max_tokens": request.max_tokens,
            "temperature": request.temperature,
            "top_k": request.top_k,
            "limits": {"cpu_s": limits.cpu_s, "address_space_bytes": limits.address_space_bytes},
        }
    )
    try:
        done = subprocess.run(
            [*child_command(), "-m", CHILD_MODULE],
            input=message.encode("utf-8"),
            capture_output=True,
            timeout=limits.timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise GenerationTimedOut(limits.timeout_s) from None
    except OSError as exc:
        raise GenerationUnavailable(f"the service could not start the generation process ({exc.strerror})") from None
    if done.returncode != 0:
        stderr = done.stderr[-2000:].decode("utf-8", errors="replace")
        log.warning(
            "generation process failed",
            extra={"job_id": target.job_id, "exit_code": done.returncode, "stderr": stderr},
        )
    return _answer(done.stdout, returncode=done.returncode)


def child_command() -> list[str]:
    """The interpreter the child runs under (the API's own; tests point it elsewhere)."""
    return [sys.executable]


def _answer(stdout: bytes, *, returncode: int) -> Generated:
    answer: Any = None
    if len(stdout) <= MAX_CHILD_OUTPUT_BYTES:
        try:
            answer = json.loads(stdout.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            answer = None
    if not isinstance(answer, dict):
        raise GenerationUnavailable(
            f"the generation process ended without an answer (exit code {returncode}); "
            "this deployment may lack the worker extra (torch)"
        )
    if "unavailable" in answer:
        raise GenerationUnavailable(
            f"this deployment cannot generate text: {answer['unavailable']}; run the API with the worker "
            "extra (torch) installed to sample from language models"
        )
    if "error" in answer:
        raise GenerationFailed(str(answer["error"]))
    return Generated(text=str(answer["text"]), tokens_generated=int(answer["tokens_generated"]))
