"""ORM models (SQLAlchemy 2.0). Every schema change comes with an Alembic migration."""

from __future__ import annotations

import datetime as dt
import secrets
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    false,
    text,
    true,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from kernel.datasets.status import DatasetStatus
from kernel.jobs.status import JobStatus

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def new_id(prefix: str) -> str:
    """Opaque, unguessable ids: knowing one id reveals nothing about others."""
    return f"{prefix}_{secrets.token_hex(12)}"


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class Tenant(Base):
    __tablename__ = "tenants"

    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("tn"))
    name: Mapped[str] = mapped_column(String(200), unique=True)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class ApiKey(Base):
    """An API key, stored only as a SHA-256 digest (keys are 256-bit random, so no slow hash)."""

    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("key"))
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), index=True)
    digest: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    label: Mapped[str] = mapped_column(String(200), default="")
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    revoked_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class UiSession(Base):
    """A dashboard session, kept server-side so that logout and key revocation end it.

    The cookie carries a random token; only its SHA-256 digest is stored, so a database reader
    cannot replay sessions. A session is live while ``ended_at`` is NULL, ``expires_at`` is in
    the future and its API key is not revoked.
    """

    __tablename__ = "ui_sessions"

    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("uis"))
    token_digest: Mapped[str] = mapped_column(String(64), unique=True)
    api_key_id: Mapped[str] = mapped_column(ForeignKey("api_keys.id"), index=True)
    csrf_token: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    expires_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True))
    ended_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class Dataset(Base):
    __tablename__ = "datasets"
    __table_args__ = (
        UniqueConstraint("tenant_id", "idempotency_key", name="uq_datasets_tenant_idempotency"),
        Index("ix_datasets_tenant_sha256", "tenant_id", "sha256"),
        Index("ix_datasets_tenant_content_digest", "tenant_id", "content_digest"),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("ds"))
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    format: Mapped[str] = mapped_column(String(16))
    sha256: Mapped[str] = mapped_column(String(64))
    blob_key: Mapped[str] = mapped_column(String(200))
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    label_column: Mapped[str | None] = mapped_column(String(200), nullable=True)
    n_rows: Mapped[int] = mapped_column(Integer)
    feature_shape: Mapped[list[int]] = mapped_column(JSON)
    n_features: Mapped[int] = mapped_column(Integer)
    task: Mapped[str] = mapped_column(String(16))
    n_classes: Mapped[int | None] = mapped_column(Integer, nullable=True)
    feature_names: Mapped[list[str] | None] = mapped_column(JSON, nullable=True)
    class_names: Mapped[list[str] | None] = mapped_column(JSON, nullable=True)
    """The public class list, index = label; NULL for rows registered before it was recorded."""
    classes_declared: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    """True when the owner declared the list at upload; False when it was taken from the labels."""
    preparation: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    """The owner's declared preparation (kernel.ingest.preparation canonical form); NULL: none."""
    public: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    """Declared public by its owner at upload: no budget, no ledger, non-private training allowed."""
    modality: Mapped[str] = mapped_column(String(16), default="tabular", server_default="tabular")
    """"tabular" (rows of numbers) or "image" (uint8 images, normalised on the worker)."""
    array_blob_key: Mapped[str | None] = mapped_column(String(200), nullable=True)
    """For image datasets: the decoded uint8 array (.npy, memory-mappable) the worker trains on;
    for text datasets: the (n, max_length) token ids (uint16 or int32 .npy)."""
    tokenizer_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    """Text datasets: "byte" (built in) or a tokenizer's ``tok_`` id; NULL for other modalities."""
    vocab_size: Mapped[int | None] = mapped_column(Integer, nullable=True)
    """Text datasets: the tokenizer's vocabulary size (every token id is below it)."""
    pad_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    """Text datasets: the id every row is right-padded with."""
    text_field: Mapped[str | None] = mapped_column(String(200), nullable=True)
    """Text datasets: the JSON member holding each record's text (its label's is ``label_column``)."""
    privacy_unit_column: Mapped[str | None] = mapped_column(String(200), nullable=True)
    """The column naming each row's privacy unit (e.g. patient_id): neighbouring datasets differ by
    one unit and all its rows. NULL: the privacy unit is one row."""
    n_units: Mapped[int | None] = mapped_column(Integer, nullable=True)
    """The number of privacy units, public like n_rows; NULL when the privacy unit is one row."""
    n_rows_public: Mapped[bool] = mapped_column(Boolean, default=True, server_default=true())
    """Whether non-owners see the exact row count. Always True when the unit is a row (n_rows is
    then the number of units); with a privacy unit column, the owner's declaration at upload
    (default False: the row count changes by a removed unit's row count, docs/privacy-units.md)."""
    idempotency_key: Mapped[str | None] = mapped_column(String(200), nullable=True)
    request_hash: Mapped[str | None] = mapped_column(String(64), nullable=True)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    content_digest: Mapped[str | None] = mapped_column(String(64), nullable=True)
    """The identity of the parsed rows (kernel/datasets/content_identity.py): one content, one budget. NULL for
    datasets registered before it existed, until ``privtrain-admin content-digests`` or their
    deletion fills it; meanwhile ``sha256`` (the uploaded bytes) stands for it."""
    status: Mapped[str] = mapped_column(
        String(16), default=DatasetStatus.ACTIVE, server_default=DatasetStatus.ACTIVE.value
    )
    """A :class:`kernel.datasets.status.DatasetStatus`: active, deleting (its jobs settle, then its
    stored files are erased) or deleted (a tombstone: public facts, budget and ledger, no rows)."""
    deletion_requested_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    deleted_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    """When its files were erased (status deleted); NULL otherwise."""
    delete_models: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    """The owner asked for the models of its jobs to be erased too (else they are kept)."""


class ErasedBlob(Base):
    """A blob the service erased on an owner's request (a deleted dataset's upload and arrays, its
    jobs' models): workers evict their cached copies of these keys unless a live row uses the key
    again (kernel/storage/erasure.py). Keys only: no content, never shown."""

    __tablename__ = "erased_blobs"

    key: Mapped[str] = mapped_column(String(200), primary_key=True)
    erased_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class BaseModelRecord(Base):
    """Public pretrained weights a tenant uploaded for one zoo architecture (safetensors, by hash)."""

    __tablename__ = "base_models"
    __table_args__ = (
        UniqueConstraint("tenant_id", "idempotency_key", name="uq_base_models_tenant_idempotency"),
        Index("ix_base_models_tenant_sha256", "tenant_id", "sha256"),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("bm"))
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    architecture: Mapped[str] = mapped_column(String(64))
    params: Mapped[dict[str, Any]] = mapped_column(JSON)
    input_shape: Mapped[list[int]] = mapped_column(JSON)
    n_outputs: Mapped[int] = mapped_column(Integer)
    sha256: Mapped[str] = mapped_column(String(64))
    blob_key: Mapped[str] = mapped_column(String(200))
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    source: Mapped[str | None] = mapped_column(Text, nullable=True)
    """Where the owner says the weights came from (shown in every report built on them)."""
    idempotency_key: Mapped[str | None] = mapped_column(String(200), nullable=True)
    request_hash: Mapped[str | None] = mapped_column(String(64), nullable=True)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    format: Mapped[str] = mapped_column(String(16), default="safetensors", server_default="safetensors")
    """How it was uploaded: "safetensors" (a zoo architecture's file) or "hf" (a zipped save_pretrained
    folder, stored as one safetensors file under the `hf` wrapper's names)."""
    model_class: Mapped[str | None] = mapped_column(String(200), nullable=True)
    """format=hf: the Transformers class the checkpoint was saved from (config.json's architectures)."""
    parameter_count: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    archive_sha256: Mapped[str | None] = mapped_column(String(64), nullable=True)
    """format=hf: SHA-256 of the ZIP as uploaded (``sha256`` is the stored weights file's)."""
    tokenizer_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    """format=hf: the tokenizer registered from the archive's tokenizer.json (``tokenizer=base:<id>``)."""


class TokenizerRecord(Base):
    """A public tokenizer a tenant uploaded (a Hugging Face tokenizer.json) or trained on a public
    text dataset; stored by content hash, tenant-scoped. The built-in "byte" tokenizer has no row."""

    __tablename__ = "tokenizers"
    __table_args__ = (Index("ix_tokenizers_tenant_sha256", "tenant_id", "sha256"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("tok"))
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    kind: Mapped[str] = mapped_column(String(16))
    """"uploaded" or "trained"."""
    sha256: Mapped[str] = mapped_column(String(64))
    blob_key: Mapped[str] = mapped_column(String(200))
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    vocab_size: Mapped[int] = mapped_column(Integer)
    pad_id: Mapped[int] = mapped_column(Integer)
    source: Mapped[str | None] = mapped_column(Text, nullable=True)
    """Where the owner says an uploaded tokenizer came from."""
    trained_from_dataset_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    """The public dataset a trained tokenizer learned its vocabulary from."""
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class DatasetGrant(Base):
    """An owner's invitation to an analyst tenant, and (once accepted) that tenant's access.

    Why an invitation: access is only ever held with the analyst's consent, so no owner can
    impose datasets on another tenant's listings. The owner names the tenant; the row is stored
    under that name whether or not such a tenant exists (the answer never tells which), and only
    a tenant of that name can accept it. Access needs ``accepted_at`` set and neither
    ``revoked_at`` nor ``declined_at``.

    Why rows are never deleted: a revoke (or a withdrawn invitation) sets ``revoked_at`` and keeps
    the row, so the grants table is an audit trail of who could submit jobs against the dataset
    when. A re-invitation after a revoke or a decline adds a new row. At most one live row
    (neither revoked nor declined) per dataset and grantee name: a partial unique index, so
    concurrent invitations cannot create two.
    """

    __tablename__ = "dataset_grants"
    __table_args__ = (
        Index(
            "uq_dataset_grants_live",
            "dataset_id",
            "grantee_name",
            unique=True,
            sqlite_where=text("revoked_at IS NULL AND declined_at IS NULL"),
            postgresql_where=text("revoked_at IS NULL AND declined_at IS NULL"),
        ),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    dataset_id: Mapped[str] = mapped_column(ForeignKey("datasets.id"), index=True)
    grantee_name: Mapped[str] = mapped_column(String(200), index=True)
    grantee_tenant_id: Mapped[str | None] = mapped_column(ForeignKey("tenants.id"), index=True, nullable=True)
    """Set when the tenant named ``grantee_name`` accepts; NULL while the invitation is pending."""
    granted_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    granted_by: Mapped[str] = mapped_column(ForeignKey("tenants.id"))
    accepted_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    declined_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    revoked_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    revoked_by: Mapped[str | None] = mapped_column(ForeignKey("tenants.id"), nullable=True)


class PrivacyBudget(Base):
    """The per-dataset budget row: the lock admission takes, and cached totals of the ledger."""

    __tablename__ = "privacy_budgets"

    dataset_id: Mapped[str] = mapped_column(ForeignKey("datasets.id"), primary_key=True)
    epsilon: Mapped[float] = mapped_column(Float)
    delta: Mapped[float] = mapped_column(Float)
    orders_version: Mapped[str] = mapped_column(String(32))
    committed: Mapped[list[float]] = mapped_column(JSON)
    reserved: Mapped[list[float]] = mapped_column(JSON)
    entry_count: Mapped[int] = mapped_column(Integer, default=0)
    last_hash: Mapped[str] = mapped_column(String(64))
    updated_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class LedgerEntry(Base):
    """Append-only, hash-chained record of every reservation, touch, commit and release."""

    __tablename__ = "ledger_entries"
    __table_args__ = (UniqueConstraint("dataset_id", "seq", name="uq_ledger_entries_dataset_seq"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    dataset_id: Mapped[str] = mapped_column(ForeignKey("datasets.id"), index=True)
    seq: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(16))
    job_id: Mapped[str | None] = mapped_column(ForeignKey("jobs.id"), nullable=True, index=True)
    event: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    curve: Mapped[list[float] | None] = mapped_column(JSON, nullable=True)
    orders_version: Mapped[str] = mapped_column(String(32))
    accountant: Mapped[str] = mapped_column(String(64))
    accountant_version: Mapped[str] = mapped_column(String(64))
    actor: Mapped[str] = mapped_column(String(120))
    details: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    prev_hash: Mapped[str] = mapped_column(String(64))
    hash: Mapped[str] = mapped_column(String(64))


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        UniqueConstraint("tenant_id", "idempotency_key", name="uq_jobs_tenant_idempotency"),
        Index("ix_jobs_status_heartbeat", "status", "heartbeat_at"),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("job"))
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), index=True)
    dataset_id: Mapped[str] = mapped_column(ForeignKey("datasets.id"), index=True)
    status: Mapped[str] = mapped_column(String(16), default=JobStatus.QUEUED)
    """A :class:`kernel.jobs.status.JobStatus`; only kernel.jobs.lifecycle changes it."""
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    algorithm: Mapped[str] = mapped_column(String(64))
    model_name: Mapped[str] = mapped_column(String(64))
    noise_multiplier: Mapped[float] = mapped_column(Float)
    sampling_probability: Mapped[float] = mapped_column(Float)
    steps_planned: Mapped[int] = mapped_column(Integer)
    steps_run: Mapped[int] = mapped_column(Integer, default=0)
    delta: Mapped[float] = mapped_column(Float)
    epsilon_ledger: Mapped[float] = mapped_column(Float)
    """The reserved charge: ledger ε of the planned run, held against the budget while it runs."""
    epsilon_committed: Mapped[float | None] = mapped_column(Float, nullable=True)
    """Ledger ε of what the job actually spent (its COMMIT curve; 0.0 when it ended with a RELEASE
    only); NULL until the job ends, and for jobs finished before migration 0008 could backfill."""
    epsilon_prv: Mapped[float | None] = mapped_column(Float, nullable=True)
    event: Mapped[dict[str, Any]] = mapped_column(JSON)
    reserved_curve: Mapped[list[float]] = mapped_column(JSON)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    error_code: Mapped[str | None] = mapped_column(String(64), nullable=True)
    metrics: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    idempotency_key: Mapped[str | None] = mapped_column(String(200), nullable=True)
    request_hash: Mapped[str | None] = mapped_column(String(64), nullable=True)
    model_blob: Mapped[str | None] = mapped_column(String(200), nullable=True)
    model_sha256: Mapped[str | None] = mapped_column(String(64), nullable=True)
    report_blob: Mapped[str | None] = mapped_column(String(200), nullable=True)
    touched_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    dispatched_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    queue: Mapped[str | None] = mapped_column(String(40), nullable=True)
    """The worker queue the job is sent to (kernel/jobs/routing.py); None for jobs admitted before queues."""
    heartbeat_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    started_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    finished_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    event_count: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    """How many events the job has: the last event's per-job ``seq`` (bumped atomically)."""


class PendingReport(Base):
    """A privacy report committed with its job's settlement and not yet in the blob store.

    The settling transaction holds the dataset's budget row, which every admission on that dataset
    waits for: the report's upload (a slow object store) happens after it commits
    (kernel/jobs/report_outbox.py). ``blob_key`` is already on the job row (blobs are
    content-addressed); the row goes once the blob is stored, and the report is served from
    ``body`` meanwhile."""

    __tablename__ = "pending_reports"

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), primary_key=True)
    blob_key: Mapped[str] = mapped_column(String(200))
    body: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class TuningJob(Base):
    """A private hyperparameter tuning: its trials run in one job (``job_id``), charged as one
    ledger entry; when it succeeds that job holds the selected model (docs/tuning.md). The number
    of trials is drawn on the worker and stored nowhere."""

    __tablename__ = "tuning_jobs"
    __table_args__ = (
        UniqueConstraint("tenant_id", "idempotency_key", name="uq_tuning_jobs_tenant_idempotency"),
        UniqueConstraint("job_id", name="uq_tuning_jobs_job_id"),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("tun"))
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), index=True)
    dataset_id: Mapped[str] = mapped_column(ForeignKey("datasets.id"), index=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"))
    idempotency_key: Mapped[str | None] = mapped_column(String(200), nullable=True)
    request_hash: Mapped[str | None] = mapped_column(String(64), nullable=True)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class TuningTrial(Base):
    """One trial of a running tuning, while it runs: the queue its slots take trials from
    (kernel/tuning/trial_queue.py). SECRET to the service: the rows tell how many trials
    were drawn, so no API field, event or log line shows them, and they are deleted when the
    tuning's job settles (or by the reconciler, if its worker vanished)."""

    __tablename__ = "tuning_trials"
    __table_args__ = (UniqueConstraint("job_id", "attempt", "seq", name="uq_tuning_trials_job_attempt_seq"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), index=True)
    attempt: Mapped[int] = mapped_column(Integer)
    seq: Mapped[int] = mapped_column(Integer)
    """Order of drawing: ties in the selection metric go to the earlier trial."""
    candidate: Mapped[int] = mapped_column(Integer)
    """Index into the tuning's candidate list (drawn by the job's worker)."""
    state: Mapped[str] = mapped_column(String(16), default="pending")
    worker: Mapped[str | None] = mapped_column(String(200), nullable=True)
    claims: Mapped[int] = mapped_column(Integer, default=0)
    heartbeat_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    score: Mapped[float | None] = mapped_column(Float, nullable=True)
    metrics: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    model_file: Mapped[str | None] = mapped_column(String(200), nullable=True)
    """The trained model's private file, None when it could not win when it finished."""
    device: Mapped[str | None] = mapped_column(String(200), nullable=True)
    """What the trial trained on, for the report's execution section if it is released."""


class TuningSlot(Base):
    """One of a running tuning's public slots: a fixed stretch of one worker's time in which the
    trial next in its queue runs, if there is one, and which lasts the same whatever it held
    (kernel/tuning/slots.py). A tuning has exactly as many slots as its public maximum number of
    trials, so how many exist, when they run and how long each takes say nothing about K; the
    rows are deleted with the trial queue when the tuning settles."""

    __tablename__ = "tuning_slots"
    __table_args__ = (
        UniqueConstraint("job_id", "attempt", "slot", name="uq_tuning_slots_job_attempt_slot"),
        Index("ix_tuning_slots_state", "state"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), index=True)
    attempt: Mapped[int] = mapped_column(Integer)
    slot: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(16), default="queued")
    """queued (waiting for a worker), running, done."""
    outcome: Mapped[str | None] = mapped_column(String(32), nullable=True)
    """When done: ok, or why the tuning must fail (overran, training-failed, ...)."""
    worker: Mapped[str | None] = mapped_column(String(200), nullable=True)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    dispatched_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    started_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    heartbeat_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    finished_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class JobEvent(Base):
    """Progress and lifecycle events of a job; payloads carry public values only.

    Why ``seq`` per job: the global row id would tell every tenant how busy the service is;
    clients see (and resume from) 1, 2, 3 … within the job.
    """

    __tablename__ = "job_events"
    __table_args__ = (UniqueConstraint("job_id", "seq", name="uq_job_events_job_seq"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), index=True)
    seq: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(32))
    payload: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
