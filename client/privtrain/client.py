"""The privtrain HTTP client: one typed method per endpoint of the v1 API.

Imports only the standard library and httpx, so it runs where torch is not installed. Errors are
raised as :mod:`privtrain.errors` exceptions carrying the RFC 9457 problem; transient failures
are retried as :mod:`privtrain.retry` allows; list endpoints are followed page by page.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TextIO, TypeVar
from urllib.parse import quote

import httpx

from privtrain.errors import TransportError, WaitTimeout, error_for
from privtrain.event_stream import events_from_stream
from privtrain.events import ProgressSource, poll_progress
from privtrain.former_names import FormerNames
from privtrain.progress import ProgressBar
from privtrain.resources import (
    Algorithm,
    BaseModel,
    BudgetStatus,
    Dataset,
    Estimate,
    Grant,
    Invitation,
    Job,
    JobEvent,
    LedgerEntry,
    ModelInfo,
    Resource,
    Tokenizer,
    TuningJob,
)
from privtrain.retry import RetryNotice, RetryPolicy
from privtrain.transfers import ModelDownload, upload_body, zipped_checkpoint
from privtrain.version import __version__

R = TypeVar("R")
ModelFormat = Literal["safetensors", "hf", "peft"]
"""What ``download_model`` fetches: the model file, or (an `hf` model) a Transformers folder, zipped."""
T = TypeVar("T", bound=Resource)

DEFAULT_URL = "http://127.0.0.1:8000"
EVENTS_PAGE = 500


def _image_size(size: int | tuple[int, int] | None) -> str | None:
    """The ``image_size`` query value: "28" or "32x24" (height x width)."""
    if size is None or isinstance(size, int):
        return None if size is None else str(size)
    height, width = size
    return f"{height}x{width}"


def _json(response: httpx.Response) -> Any:
    response.read()
    return response.json()


def _error_body(response: httpx.Response) -> Any:
    response.read()
    try:
        return response.json()
    except ValueError:
        return response.text


class Client(FormerNames):
    """A privtrain API client.

    ``transport`` is handed to httpx (tests pass an in-process app; proxies or mocks work too).
    ``sleep`` is what the client waits with between retries and polls; ``on_retry`` hears of
    each retry before its wait (the CLI prints it).
    """

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float = 30.0,
        max_retries: int = 3,
        transport: httpx.BaseTransport | None = None,
        backoff_base: float = 0.5,
        sleep: Callable[[float], None] = time.sleep,
        on_retry: Callable[[RetryNotice], None] | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.on_retry = on_retry
        self.retry = RetryPolicy(max_retries=max_retries, backoff_base=backoff_base)
        self.sleep = sleep
        self._http = httpx.Client(
            base_url=self.base_url,
            timeout=timeout,
            transport=transport,
            headers={
                "Authorization": f"Bearer {api_key}",
                "User-Agent": f"privtrain-client/{__version__}",
                "Accept": "application/json",
            },
        )

    @classmethod
    def from_env(
        cls,
        *,
        timeout: float = 30.0,
        max_retries: int = 3,
        transport: httpx.BaseTransport | None = None,
    ) -> Client:
        """``PRIVTRAIN_URL`` (default: the embedded server's address) and ``PRIVTRAIN_API_KEY``."""
        key = os.environ.get("PRIVTRAIN_API_KEY")
        if not key:
            raise ValueError("PRIVTRAIN_API_KEY is not set")
        return cls(
            os.environ.get("PRIVTRAIN_URL", DEFAULT_URL),
            key,
            timeout=timeout,
            max_retries=max_retries,
            transport=transport,
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ transport

    def _call(
        self,
        method: str,
        path: str,
        *,
        replay_safe: bool,
        consume: Callable[[httpx.Response], R] = _json,
        params: Mapping[str, Any] | None = None,
        json: Any = None,
        content: Callable[[], bytes | Iterator[bytes]] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> R:
        """Send with retries; ``consume`` reads a successful (streamed) response inside the loop,
        so a connection lost mid-download is retried like one lost before the headers."""
        attempt = 0
        while True:
            request = self._http.build_request(
                method,
                path,
                params=params,
                json=json,
                content=content() if content is not None else None,
                headers=headers,
            )
            try:
                response = self._http.send(request, stream=True)
                try:
                    if response.status_code < 400:
                        return consume(response)
                    body = _error_body(response)
                finally:
                    response.close()
            except httpx.TransportError as exc:
                if attempt >= self.retry.max_retries or not self.retry.should_retry_error(exc, replay_safe=replay_safe):
                    raise TransportError(
                        title="Connection failed",
                        detail=f"{type(exc).__name__} on {method} {self.base_url}{path}: {exc}",
                    ) from exc
                delay = self.retry.backoff(attempt)
                reason = type(exc).__name__
            else:
                retryable = attempt < self.retry.max_retries and self.retry.should_retry_status(
                    response.status_code, replay_safe=replay_safe
                )
                wait = self.retry.delay(attempt, response) if retryable else None
                if wait is None:
                    raise error_for(response.status_code, body)
                delay, reason = wait, f"HTTP {response.status_code}"
            attempt += 1
            if self.on_retry is not None:
                self.on_retry(RetryNotice(method=method, path=path, attempt=attempt, delay=delay, reason=reason))
            self.sleep(delay)

    def _get(self, path: str, params: Mapping[str, Any] | None = None) -> Any:
        clean = {k: v for k, v in (params or {}).items() if v is not None}
        return self._call("GET", path, replay_safe=True, params=clean or None)

    def _pages(self, path: str, parse: Callable[[Mapping[str, Any]], T], params: Mapping[str, Any]) -> Iterator[T]:
        """Follow ``next_cursor`` until the last page."""
        query = {k: v for k, v in params.items() if v is not None}
        while True:
            page = self._get(path, query)
            yield from (parse(item) for item in page["items"])
            if not page.get("next_cursor"):
                return
            query["cursor"] = page["next_cursor"]

    # ------------------------------------------------------------------ datasets

    def upload_dataset(
        self,
        source: str | os.PathLike[str] | bytes,
        *,
        name: str | None = None,
        epsilon: float | None = None,
        delta: float | None = None,
        public: bool = False,
        format: str | None = None,
        label_column: str | None = "label",
        task: str | None = None,
        classes: Sequence[str] | None = None,
        preparation: Mapping[str, Any] | str | None = None,
        modality: str | None = None,
        image_size: int | tuple[int, int] | None = None,
        channels: int | None = None,
        tokenizer: str | None = None,
        max_length: int | None = None,
        text_field: str | None = None,
        label_field: str | None = None,
        privacy_unit_column: str | None = None,
        n_rows_public: bool = False,
        idempotency_key: str | None = None,
    ) -> Dataset:
        """Upload a CSV/NPZ file (streamed from disk) or bytes, with the owner's budget (ε_G, δ_G),
        or with ``public=True`` and no budget: a dataset its owner declares public (no ledger,
        non-private ``sgd``/``adam`` allowed; docs/pretraining-and-finetuning.md).

        ``format`` and ``name`` default to the file's suffix and name when ``source`` is a path.
        One Idempotency-Key per call, reused by every retry: a retried upload whose answer was
        lost is answered with the dataset already registered, never a second one.
        ``classes`` declares the public class list (label i is ``classes[i]``); without it, the
        labels found become the public list. Rows already registered (the same content, whatever
        the line endings or the order of rows and columns) raise the ``dataset-already-registered``
        problem, which names the existing dataset; rows of a dataset you deleted continue its
        ledger (``ledger_continued`` is True).
        ``preparation`` declares, publicly, how the rows become features (a dict or its JSON text):
        ``{"drop": [...], "one_hot": {column: [categories]}, "scale": {column or "*": {"bounds":
        [lo, hi]} or {"center": c, "scale": s}}}``; see docs/preparing-data.md.
        Images: a ``.zip`` of class folders of PNG/JPEG files (``class_name/image.png``), or an NPZ
        of uint8 ``X`` (n, H, W) or (n, H, W, C); ``image_size`` (one side, or (height, width))
        resizes every ZIP image, ``channels`` (1 or 3) converts them, ``modality="tabular"`` reads
        a uint8 NPZ as numbers instead.
        Text: a ``.jsonl`` file of ``{"text": ..., "label": ...}`` records (classification) or
        ``{"text": ...}`` (language modelling), tokenised at upload with ``tokenizer`` ("byte", the
        default, or a tokenizer id) into rows of ``max_length`` tokens (server default 128);
        ``text_field``/``label_field`` rename the members; see docs/text.md.
        ``privacy_unit_column`` (CSV) names the column identifying the person each row belongs to:
        the dataset's guarantee is then per person, not per row (docs/privacy-units.md); its exact row
        count is then shown to the owner only, unless ``n_rows_public=True`` declares it public.
        """
        body = upload_body(source if isinstance(source, bytes) else Path(source))
        inferred_name = body.inferred_name
        fmt = format or body.inferred_format
        if fmt is None:
            raise ValueError(
                "give format= ('csv', 'npz', 'zip' or 'jsonl'): it cannot be inferred from bytes or this suffix"
            )
        if (name or inferred_name) is None:
            raise ValueError("give name= for an upload from bytes")
        params = {
            "name": name or inferred_name,
            "format": fmt,
            "epsilon": epsilon,
            "delta": delta,
            "public": "true" if public else None,
            "label_column": label_column if fmt == "csv" else None,
            "task": task,
            "classes": ",".join(classes) if classes is not None else None,
            "preparation": preparation
            if isinstance(preparation, str | None)
            else json.dumps(preparation, separators=(",", ":"), allow_nan=False),
            "modality": modality,
            "image_size": _image_size(image_size),
            "channels": channels,
            "tokenizer": tokenizer,
            "max_length": max_length,
            "text_field": text_field,
            "label_field": label_field,
            "privacy_unit_column": privacy_unit_column,
            "n_rows_public": "true" if n_rows_public else None,
        }
        headers = {**body.headers, "Idempotency-Key": idempotency_key or uuid.uuid4().hex}
        return Dataset.from_api(
            self._call(
                "POST",
                "/v1/datasets",
                replay_safe=True,
                content=body.content,
                headers=headers,
                params={k: v for k, v in params.items() if v is not None},
            )
        )

    def iter_datasets(self, *, page_size: int = 50, include_deleted: bool = False) -> Iterator[Dataset]:
        params = {"limit": page_size, "include_deleted": "true" if include_deleted else None}
        return self._pages("/v1/datasets", Dataset.from_api, params)

    def list_datasets(self, *, page_size: int = 50, include_deleted: bool = False) -> list[Dataset]:
        """All the datasets you own or accepted an invitation to, newest first (every page), and
        with ``include_deleted`` your deleted ones (tombstones). Listing items leave out
        ``classes`` and the feature names: :meth:`get_dataset` has them."""
        return list(self.iter_datasets(page_size=page_size, include_deleted=include_deleted))

    def delete_dataset(self, dataset_id: str, *, delete_models: bool = False) -> Dataset:
        """Delete your dataset: its grants end, its jobs stop (queued ones are released, running
        ones commit what they ran), then its rows, arrays and the jobs' checkpoints are erased;
        with ``delete_models`` the jobs' models too (reports are kept). The dataset stays as a
        tombstone with its ledger; uploading the same rows again continues that ledger.

        Returns the dataset with ``status`` "deleted", or "deleting" while its jobs settle (call
        again, or :meth:`get_dataset`, to follow it). Idempotent, so retried like a read.
        """
        return Dataset.from_api(
            self._call(
                "DELETE",
                f"/v1/datasets/{_segment(dataset_id)}",
                replay_safe=True,
                params={"models": "delete" if delete_models else "keep"},
            )
        )

    def get_dataset(self, dataset_id: str) -> Dataset:
        return Dataset.from_api(self._get(f"/v1/datasets/{_segment(dataset_id)}"))

    def get_budget(self, dataset_id: str) -> BudgetStatus:
        return BudgetStatus.from_api(self._get(f"/v1/datasets/{_segment(dataset_id)}/budget"))

    def raise_budget(
        self, dataset_id: str, *, epsilon: float, delta: float | None = None, reason: str = ""
    ) -> BudgetStatus:
        """Raise the dataset's ε (and optionally δ); the server allows only increases."""
        body: dict[str, Any] = {"epsilon": epsilon, "reason": reason}
        if delta is not None:
            body["delta"] = delta
        return BudgetStatus.from_api(
            self._call("POST", f"/v1/datasets/{_segment(dataset_id)}/budget", replay_safe=False, json=body)
        )

    def iter_ledger(self, dataset_id: str, *, page_size: int = 100) -> Iterator[LedgerEntry]:
        return self._pages(f"/v1/datasets/{_segment(dataset_id)}/ledger", LedgerEntry.from_api, {"limit": page_size})

    def list_ledger(self, dataset_id: str, *, page_size: int = 100) -> list[LedgerEntry]:
        """The dataset's whole append-only ledger, oldest entry first."""
        return list(self.iter_ledger(dataset_id, page_size=page_size))

    # ------------------------------------------------------------------ base models

    def upload_base_model(
        self,
        weights: str | os.PathLike[str] | bytes,
        *,
        name: str,
        architecture: str,
        input_shape: Sequence[int],
        n_outputs: int,
        params: Mapping[str, Any] | None = None,
        source: str | None = None,
        idempotency_key: str | None = None,
    ) -> BaseModel:
        """Upload public pretrained weights (a safetensors file whose tensors are the state dict of
        ``architecture`` built with ``params`` for ``input_shape`` and ``n_outputs``). ``source``
        says where they came from: every report of a job built on them shows it."""
        data = weights if isinstance(weights, bytes) else Path(weights).read_bytes()
        shape, encoded = ",".join(str(int(d)) for d in input_shape), json.dumps(dict(params or {}), allow_nan=False)
        query: dict[str, Any] = {"name": name, "architecture": architecture, "params": encoded, "input_shape": shape}
        query |= {"n_outputs": n_outputs, "source": source}
        return self._post_base_model(data, "application/octet-stream", query, idempotency_key)

    def _post_base_model(self, data: bytes, content_type: str, query: Mapping[str, Any], key: str | None) -> BaseModel:
        headers = {"Idempotency-Key": key or uuid.uuid4().hex, "Content-Type": content_type}
        params = {k: v for k, v in query.items() if v is not None}
        sent: Any = self._call(
            "POST", "/v1/base-models", replay_safe=True, content=lambda: data, headers=headers, params=params
        )
        return BaseModel.from_api(sent)

    def upload_hf_base_model(
        self,
        checkpoint: str | os.PathLike[str] | bytes,
        *,
        name: str,
        task: str | None = None,
        source: str | None = None,
        idempotency_key: str | None = None,
    ) -> BaseModel:
        """Upload a Transformers checkpoint: a ``save_pretrained`` folder (zipped here) or its ZIP.
        ``task`` ("sequence-classification", "causal-lm", "image-classification") only where the class
        does not say it."""
        data = checkpoint if isinstance(checkpoint, bytes) else zipped_checkpoint(Path(checkpoint))
        query = {"name": name, "format": "hf", "task": task, "source": source}
        return self._post_base_model(data, "application/zip", query, idempotency_key)

    def list_base_models(self) -> list[BaseModel]:
        return [BaseModel.from_api(item) for item in self._get("/v1/base-models")["items"]]

    def get_base_model(self, base_model_id: str) -> BaseModel:
        return BaseModel.from_api(self._get(f"/v1/base-models/{_segment(base_model_id)}"))

    # ------------------------------------------------------------------ tokenizers

    def upload_tokenizer(
        self,
        tokenizer_json: str | os.PathLike[str] | bytes,
        *,
        name: str,
        pad_token: str | None = None,
        source: str | None = None,
    ) -> Tokenizer:
        """Upload a Hugging Face ``tokenizer.json`` (public: never one learned from private text).
        ``pad_token`` names the pad token when the file sets no padding and has no ``<pad>``/``[PAD]``."""
        data = tokenizer_json if isinstance(tokenizer_json, bytes) else Path(tokenizer_json).read_bytes()
        query = {"name": name, "pad_token": pad_token, "source": source}
        return Tokenizer.from_api(
            self._call(
                "POST",
                "/v1/tokenizers",
                replay_safe=False,
                content=lambda: data,
                headers={"Content-Type": "application/octet-stream"},
                params={k: v for k, v in query.items() if v is not None},
            )
        )

    def train_tokenizer(self, *, dataset_id: str, vocab_size: int, name: str) -> Tokenizer:
        """Train a byte-level BPE tokenizer on a public text dataset (a private one is refused:
        409 tokenizer-on-private-data)."""
        body = {"dataset_id": dataset_id, "vocab_size": vocab_size, "name": name}
        return Tokenizer.from_api(self._call("POST", "/v1/tokenizers/train", replay_safe=False, json=body))

    def list_tokenizers(self) -> list[Tokenizer]:
        """The built-in byte tokenizer, then yours, newest first."""
        return [Tokenizer.from_api(item) for item in self._get("/v1/tokenizers")["items"]]

    def get_tokenizer(self, tokenizer_id: str) -> Tokenizer:
        return Tokenizer.from_api(self._get(f"/v1/tokenizers/{_segment(tokenizer_id)}"))

    def delete_base_model(self, base_model_id: str) -> None:
        """Refused (409 base-model-in-use) while a queued or running job starts from it."""
        self._call(
            "DELETE", f"/v1/base-models/{_segment(base_model_id)}", replay_safe=True, consume=lambda _response: None
        )

    # ------------------------------------------------------------------ sharing

    def grant(self, dataset_id: str, tenant: str) -> Grant:
        """Invite ``tenant`` (by name) to take the analyst role on your dataset.

        The invitation is ``invited`` until that tenant accepts it; the server answers alike
        whether or not such a tenant exists. Inviting a name again returns its pending
        invitation or active grant, so this is retried like a read.
        """
        return Grant.from_api(
            self._call("POST", f"/v1/datasets/{_segment(dataset_id)}/grants", replay_safe=True, json={"tenant": tenant})
        )

    def iter_grants(self, dataset_id: str, *, page_size: int = 50) -> Iterator[Grant]:
        return self._pages(f"/v1/datasets/{_segment(dataset_id)}/grants", Grant.from_api, {"limit": page_size})

    def list_grants(self, dataset_id: str, *, page_size: int = 50) -> list[Grant]:
        """Every invitation and grant of your dataset, oldest first: the audit trail (every page)."""
        return list(self.iter_grants(dataset_id, page_size=page_size))

    def revoke_grant(self, dataset_id: str, tenant: str) -> Grant:
        """Revoke the tenant's active grant, or withdraw its pending invitation."""
        path = f"/v1/datasets/{_segment(dataset_id)}/grants/{_segment(tenant)}"
        return Grant.from_api(self._call("DELETE", path, replay_safe=False))

    def iter_invitations(self, *, page_size: int = 50) -> Iterator[Invitation]:
        return self._pages("/v1/invitations", Invitation.from_api, {"limit": page_size})

    def list_invitations(self, *, page_size: int = 50) -> list[Invitation]:
        """Pending invitations addressed to you, newest first (every page)."""
        return list(self.iter_invitations(page_size=page_size))

    def accept_invitation(self, invitation_id: str) -> Invitation:
        """Accept: you become an analyst of the dataset (``invitation_id`` is its dataset id)."""
        return Invitation.from_api(
            self._call("POST", f"/v1/invitations/{_segment(invitation_id)}/accept", replay_safe=False)
        )

    def decline_invitation(self, invitation_id: str) -> Invitation:
        return Invitation.from_api(
            self._call("POST", f"/v1/invitations/{_segment(invitation_id)}/decline", replay_safe=False)
        )

    # ------------------------------------------------------------------ catalogues

    def list_algorithms(self) -> list[Algorithm]:
        return [Algorithm.from_api(a) for a in self._get("/v1/algorithms")["items"]]

    def get_algorithm(self, name: str) -> Algorithm:
        return Algorithm.from_api(self._get(f"/v1/algorithms/{_segment(name)}"))

    def list_models(self) -> list[ModelInfo]:
        return [ModelInfo.from_api(m) for m in self._get("/v1/models")["items"]]

    # ------------------------------------------------------------------ jobs

    def estimate(self, spec: Mapping[str, Any]) -> Estimate:
        """Dry run: stores nothing, so it is retried like a read."""
        return Estimate.from_api(self._call("POST", "/v1/jobs/estimate", replay_safe=True, json=dict(spec)))

    def submit(self, spec: Mapping[str, Any], *, idempotency_key: str | None = None) -> Job:
        """Admit a job. One Idempotency-Key per call, reused by every retry, so a retried
        submission is replayed by the server instead of reserving budget twice. Pass your own
        key to make a resubmission after a crash safe as well."""
        key = idempotency_key or uuid.uuid4().hex
        return Job.from_api(
            self._call("POST", "/v1/jobs", replay_safe=True, json=dict(spec), headers={"Idempotency-Key": key})
        )

    def estimate_tuning(self, request: Mapping[str, Any]) -> dict[str, Any]:
        """Dry run of a tuning: its one-entry charge against its trials run as separate jobs."""
        return dict(self._call("POST", "/v1/tuning-jobs/estimate", replay_safe=True, json=dict(request)))

    def create_tuning(self, request: Mapping[str, Any], *, idempotency_key: str | None = None) -> TuningJob:
        """Admit a private hyperparameter tuning (``{"base", "search_space", "trials", "selection"}``,
        docs/tuning.md) as one ledger entry; retried with one Idempotency-Key, like :meth:`submit`."""
        key = idempotency_key or uuid.uuid4().hex
        answer: Any = self._call(
            "POST", "/v1/tuning-jobs", replay_safe=True, json=dict(request), headers={"Idempotency-Key": key}
        )
        return TuningJob.from_api(answer)

    def get_tuning(self, tuning_id: str) -> TuningJob:
        return TuningJob.from_api(self._get(f"/v1/tuning-jobs/{_segment(tuning_id)}"))

    def list_tunings(self, *, page_size: int = 50) -> list[TuningJob]:
        """Every tuning the caller may read, newest first."""
        return list(self._pages("/v1/tuning-jobs", TuningJob.from_api, {"limit": page_size}))

    def cancel_tuning(self, tuning_id: str) -> TuningJob:
        """A running tuning stops at its next check and commits its whole charge."""
        return TuningJob.from_api(
            self._call("POST", f"/v1/tuning-jobs/{_segment(tuning_id)}/cancel", replay_safe=False)
        )

    def wait_tuning(self, tuning_id: str, *, timeout: float | None = None, poll_interval: float = 2.0) -> TuningJob:
        """Block until the tuning has ended (it reports no progress: that would count its trials)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            tuning = self.get_tuning(tuning_id)
            if tuning.is_terminal:
                return tuning
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(title="Timed out", detail=f"tuning {tuning_id} is still {tuning.status}")
            time.sleep(poll_interval)

    def iter_jobs(
        self, *, dataset_id: str | None = None, status: str | None = None, page_size: int = 50
    ) -> Iterator[Job]:
        return self._pages("/v1/jobs", Job.from_api, {"dataset_id": dataset_id, "status": status, "limit": page_size})

    def list_jobs(self, *, dataset_id: str | None = None, status: str | None = None, page_size: int = 50) -> list[Job]:
        """All matching jobs, newest first (every page)."""
        return list(self.iter_jobs(dataset_id=dataset_id, status=status, page_size=page_size))

    def get_job(self, job_id: str) -> Job:
        return Job.from_api(self._get(f"/v1/jobs/{_segment(job_id)}"))

    def cancel(self, job_id: str) -> Job:
        return Job.from_api(self._call("POST", f"/v1/jobs/{_segment(job_id)}/cancel", replay_safe=False))

    def list_events(self, job_id: str, *, after: int = 0, page_size: int = EVENTS_PAGE) -> list[JobEvent]:
        """The job's events with ``seq`` > ``after``, oldest first (every page)."""
        found: list[JobEvent] = []
        while True:
            page = self._get(f"/v1/jobs/{_segment(job_id)}/events", {"after": after, "limit": page_size})
            found.extend(JobEvent.from_api(e) for e in page)
            if len(page) < page_size:
                return found
            after = found[-1].seq

    def stream_events(self, job_id: str, *, after: int = 0) -> Generator[JobEvent, None, None]:
        """The job's events after ``after`` as Server-Sent Events, as they happen, until the
        server ends the stream (the job is terminal, or the stream reached its maximum life).

        A connection lost mid-stream ends the iteration like a server close: resume with
        ``after`` = the last ``seq`` seen (:func:`privtrain.sse.sse_progress` does).
        """
        path = f"/v1/jobs/{_segment(job_id)}/events"
        request = self._http.build_request(
            "GET",
            path,
            params={"after": after},
            headers={"Accept": "text/event-stream", "Last-Event-ID": str(after)},
            # between events the server sends keep-alives (every 15 s by default): a longer
            # silence means a dead connection, which ends the stream so the caller resumes
            timeout=httpx.Timeout(self._http.timeout.connect, read=max(self._http.timeout.read or 0.0, 120.0)),
        )
        try:
            response = self._http.send(request, stream=True)
        except httpx.TransportError as exc:
            raise TransportError(
                title="Connection failed", detail=f"{type(exc).__name__} on GET {path}: {exc}"
            ) from exc
        try:
            if response.status_code >= 400:
                raise error_for(response.status_code, _error_body(response))
            yield from events_from_stream(response.iter_lines())
        except httpx.TransportError:
            return
        finally:
            response.close()

    def get_report(self, job_id: str) -> dict[str, Any]:
        """The privacy report (JSON) of a job that succeeded, or that ended otherwise after it had
        committed ε (cancelled while running, failed after opening the data: no model, its
        ``outcome`` says why). A job that spent nothing has none (409 ``job-not-succeeded``)."""
        return dict(self._get(f"/v1/jobs/{_segment(job_id)}/report"))

    def generate(
        self, job_id: str, prompt: str, *, max_tokens: int = 64, temperature: float = 1.0, top_k: int | None = None
    ) -> dict[str, Any]:
        """Text sampled from a succeeded language-model job's model, continuing ``prompt``:
        {"text", "prompt", "tokens_generated", "model_sha256", "statement"}. ``temperature`` 0 is
        greedy; ``top_k`` samples among the k most likely tokens. Post-processing of the released
        model: no privacy cost, nothing stored. Not retried after a 503 (a generation that timed out
        would only run again); 429 is retried after the server's ``Retry-After``."""
        body: dict[str, Any] = {"prompt": prompt, "max_tokens": max_tokens, "temperature": float(temperature)}
        if top_k is not None:
            body["top_k"] = top_k
        return dict(self._call("POST", f"/v1/jobs/{_segment(job_id)}/generate", replay_safe=False, json=body))

    def download_model(self, job_id: str, path: str | os.PathLike[str], *, format: ModelFormat = "safetensors") -> Path:
        """Stream the safetensors file to ``path`` (a directory gets ``<job id>.safetensors``).

        ``format="hf"`` (models named ``hf``): a ZIP of a Transformers ``save_pretrained`` folder; ``"peft"``
        (their LoRA jobs): a ZIP of the PEFT adapter folder; each with the report and a model card.

        Written to a temporary file, checked against the server's X-Content-SHA256, then renamed:
        a failed or corrupted download never leaves a partial model at ``path``. A service with
        pre-signed downloads answers 307: the file is then fetched from the object store's URL,
        without this client's API key, and checked against the digest the API announced.
        """
        target = Path(path)
        if target.is_dir():
            target = target / (f"{job_id}-{format}.zip" if format != "safetensors" else f"{job_id}.safetensors")
        query = {"format": format} if format != "safetensors" else None
        download = ModelDownload(
            target=target, partial=target.with_name(target.name + ".part"), timeout=self._http.timeout
        )
        try:
            return self._call(
                "GET", f"/v1/jobs/{_segment(job_id)}/model", replay_safe=True, params=query, consume=download.consume
            )
        finally:
            download.partial.unlink(missing_ok=True)

    def wait(
        self,
        job_id: str,
        *,
        timeout: float | None = None,
        poll_interval: float = 2.0,
        progress: bool = True,
        progress_source: ProgressSource = poll_progress,
        stream: TextIO | None = None,
    ) -> Job:
        """Block until the job is succeeded, failed or cancelled and return it.

        With ``progress`` a bar (steps done / planned, ε spent) is drawn on stderr. Raises
        :class:`WaitTimeout` after ``timeout`` seconds; the job keeps running on the server.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        bar = ProgressBar(stream) if progress else None
        try:
            for snapshot in progress_source(self, job_id, poll_interval=poll_interval):
                if bar is not None:
                    bar.update(snapshot)
                if snapshot.job.is_terminal:
                    return snapshot.job
                if deadline is not None and time.monotonic() >= deadline:
                    raise WaitTimeout(
                        title="Timed out",
                        detail=f"job {job_id} is still {snapshot.job.status} after {timeout:g} s",
                    )
        finally:
            if bar is not None:
                bar.close()
        raise WaitTimeout(title="Progress ended", detail=f"the progress source stopped before job {job_id} finished")


def _segment(value: str) -> str:
    """Ids become exactly one path segment: a '/' or '..' in an id must not address another route."""
    if not value or value in {".", ".."}:
        raise ValueError(f"invalid id {value!r}")
    return quote(value, safe="")
