"""Typed views of the API's JSON objects.

Each is a frozen dataclass built from the response with the fields a caller usually needs;
``raw`` keeps the whole object, so fields the server adds later are never lost and the client
does not break when they appear.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import warnings
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

T = TypeVar("T", bound="Resource")

TERMINAL_STATUSES = frozenset({"succeeded", "failed", "cancelled"})


def _time(value: Any) -> dt.datetime | None:
    """ISO 8601 → aware datetime. The server speaks UTC; a value without an offset (servers
    before the RFC 3339 fix returned those on SQLite reads) is taken as UTC."""
    if not isinstance(value, str):
        return None
    parsed = dt.datetime.fromisoformat(value)
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=dt.UTC)


def _parsed(parse: Callable[[Any], Any]) -> Any:
    """Field metadata: how to turn the JSON value into the field's type."""
    return dataclasses.field(metadata={"parse": parse})


def _former_name(old: str) -> dict[str, str]:
    """Field metadata: the name a server before the rename sent this value under."""
    return {"former_name": old}


def _deprecated_name(resource: Resource, old: str, new: str) -> Any:
    """The value of a renamed field read under its old name, with a DeprecationWarning."""
    warnings.warn(
        f"{type(resource).__name__}.{old} is deprecated: use {new} (the old name goes away in privtrain 0.2.0)",
        DeprecationWarning,
        stacklevel=3,
    )
    return getattr(resource, new)


@dataclasses.dataclass(frozen=True)
class Resource:
    """Base: ``from_api`` copies the fields by name; missing optional members become None."""

    raw: dict[str, Any] = dataclasses.field(repr=False, compare=False, kw_only=True)

    @classmethod
    def from_api(cls: type[T], data: Mapping[str, Any]) -> T:
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if f.name == "raw":
                continue
            value = data.get(f.name)
            if value is None and "former_name" in f.metadata:  # a server older than the rename
                value = data.get(f.metadata["former_name"])
            parse = f.metadata.get("parse")
            values[f.name] = parse(value) if parse is not None and value is not None else value
        return cls(**values, raw=dict(data))


@dataclasses.dataclass(frozen=True)
class Budget(Resource):
    epsilon: float
    delta: float


@dataclasses.dataclass(frozen=True)
class Deletion(Resource):
    """A deletion its owner asked for, and how far it has gone."""

    requested_at: dt.datetime | None = _parsed(_time)
    deleted_at: dt.datetime | None = _parsed(_time)
    """When the rows were erased; None while the dataset's jobs are still settling."""
    models: str | None = None
    """"kept" or "deleted": the owner's choice for the models of the dataset's jobs."""
    jobs_settling: int | None = None
    models_pending: int | None = None


@dataclasses.dataclass(frozen=True)
class Dataset(Resource):
    id: str
    name: str
    format: str
    sha256: str | None
    """The content hash: shown to the dataset's owner only (None for analysts)."""
    size_bytes: int | None
    """Shown to the dataset's owner only (None for analysts)."""
    n_rows: int | None
    """None for everyone but the owner on a person-level dataset whose owner did not declare it public."""
    feature_shape: list[int]
    n_features: int
    task: str
    n_classes: int | None
    classes: list[str] | None
    """The public class list (label i is classes[i]); None for regression."""
    classes_source: str | None
    """"declared" by the owner at upload, or "observed" (taken from the labels found)."""
    label_column: str | None
    budget: Budget | None = _parsed(Budget.from_api)
    """None for a public dataset (it has no budget)."""
    created_at: dt.datetime | None = _parsed(_time)
    deletion: Deletion | None = _parsed(Deletion.from_api)
    """None while active; how far its deletion has gone otherwise."""
    modality: str | None = None
    """"image" (uint8 images, feature_shape is [C, H, W]) or "tabular"."""
    image_shape: list[int] | None = None
    """An image dataset's [H, W, C]; None for tabular datasets."""
    public: bool | None = None
    """True when its owner declared it public: no budget, no ledger, sgd/adam allowed."""
    tokenizer_id: str | None = None
    """A text dataset's tokenizer ("byte" or a tok_ id); None for other modalities."""
    vocab_size: int | None = None
    pad_id: int | None = None
    max_length: int | None = None
    """A text dataset's tokens per row (its feature_shape is [max_length])."""
    privacy_unit_column: str | None = None
    """The column naming each row's person (the privacy unit); None: the privacy unit is one row."""
    n_units: int | None = None
    """The number of privacy units (persons), public like n_rows; None when the unit is a row."""
    privacy_unit: str | None = None
    """What one privacy unit is, in words ("one patient_id and all its rows")."""
    status: str | None = None
    """"active", "deleting" (its jobs are stopping, then its files go) or "deleted" (a tombstone)."""
    content_digest: str | None = None
    """The identity of the parsed rows (one content, one budget): the owner's view only."""
    ledger_continued: bool | None = None
    """Upload only: True when these rows had been registered and deleted before, so the upload
    continues their old ledger (budget and spend) under the old id."""
    n_rows_public: bool | None = None
    """Whether n_rows is shown to everyone with access (always, when the unit is a row)."""
    feature_names: list[str] | None = None
    """A table's column names, in the order of the features."""
    preparation: dict[str, Any] | None = None
    """How the features were prepared at upload (declared bounds, scaling), public."""
    text_field: str | None = None
    notices: list[str] | None = dataclasses.field(default=None, compare=False)
    """Upload only: advice about the rows (e.g. features far from unit scale); not compared."""
    role: str | None = None
    """"owner" or "analyst": how you see this dataset."""
    links: dict[str, str] | None = None
    """The resource's related URLs (self, and what belongs to it)."""


@dataclasses.dataclass(frozen=True)
class Grant(Resource):
    """An invitation the owner sent, and the access it gives once accepted (owner's view).

    ``status``: ``invited`` (no access until the tenant accepts), ``active``, ``declined`` or
    ``revoked`` (the owner ended it, or withdrew the invitation).
    """

    dataset_id: str
    tenant: str
    """The name the owner invited; the server does not say whether such a tenant exists."""
    status: str
    active: bool
    granted_by: str
    revoked_by: str | None
    granted_at: dt.datetime | None = _parsed(_time)
    accepted_at: dt.datetime | None = _parsed(_time)
    declined_at: dt.datetime | None = _parsed(_time)
    revoked_at: dt.datetime | None = _parsed(_time)


@dataclasses.dataclass(frozen=True)
class Invitation(Resource):
    """An invitation addressed to you: accept it to become an analyst of the dataset. ``id`` is
    the dataset's id (one invitation per dataset and tenant)."""

    id: str
    dataset_id: str
    dataset_name: str
    owner: str
    status: str
    budget: Budget | None = _parsed(Budget.from_api)
    invited_at: dt.datetime | None = _parsed(_time)
    accepted_at: dt.datetime | None = _parsed(_time)
    declined_at: dt.datetime | None = _parsed(_time)
    public: bool | None = None
    """Whether the dataset is public (no budget)."""
    links: dict[str, str] | None = None
    """The resource's related URLs (self, and what belongs to it)."""


@dataclasses.dataclass(frozen=True)
class BudgetStatus(Resource):
    """``GET /v1/datasets/{id}/budget``: what is spent, reserved and left (ε at the dataset's δ)."""

    dataset_id: str
    epsilon: float
    delta: float
    committed_epsilon: float
    reserved_epsilon: float
    spent_epsilon: float
    remaining_epsilon: float
    entries: int
    last_hash: str


@dataclasses.dataclass(frozen=True)
class LedgerEntry(Resource):
    seq: int
    kind: str
    job_id: str | None
    epsilon: float | None
    actor: str
    details: dict[str, Any]
    hash: str
    prev_hash: str
    created_at: dt.datetime | None = _parsed(_time)
    accountant: str | None = None
    """The accountant that priced the entry, and its version (recomputing an ε needs both)."""
    accountant_version: str | None = None
    orders_version: str | None = None
    """The Rényi orders the curve is on."""
    curve: list[float] | None = None
    """The entry's Rényi curve, one ε per order."""
    event: dict[str, Any] | None = None
    """The privacy event the curve was computed from (the mechanism, in data)."""
    explanation: str | None = None
    """The entry in words."""


@dataclasses.dataclass(frozen=True)
class Algorithm(Resource):
    name: str
    family: str
    paper: str
    summary: str
    hyperparameters_schema: dict[str, Any]
    defaults: dict[str, Any]
    training_fields: list[str] | None = None
    """The ``training.*`` fields the algorithm reads (None from servers that predate the list)."""


@dataclasses.dataclass(frozen=True)
class ModelInfo(Resource):
    name: str
    summary: str
    tasks: list[str]
    params_schema: dict[str, Any]
    defaults: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Estimate(Resource):
    """The dry run: the noise, steps and ε a job would be charged, and whether it fits now."""

    noise_multiplier: float
    sampling_probability: float
    steps: int
    delta: float
    epsilon_reserved: float = dataclasses.field(metadata=_former_name("epsilon_ledger"))
    """The ledger ε of the planned run: what admission reserves (formerly ``epsilon_ledger``)."""
    epsilon_single_job: float | None = dataclasses.field(metadata=_former_name("epsilon_prv"))
    """The tightest valid single-job ε the service computed (never above epsilon_reserved;
    formerly ``epsilon_prv``)."""
    epsilon_single_job_method: str | None = dataclasses.field(metadata=_former_name("epsilon_prv_method"))
    """Which method produced it (prv, pld, gaussian-dp, pure-dp-optimal, rdp-single-job, rdp)."""
    noise_std_on_sum: float
    sensitivity: float
    admissible: bool
    budget_remaining_epsilon: float | None
    """None on a public dataset (no budget)."""
    largest_admissible_epsilon: float | None
    evaluation_epsilon: float | None
    budget_remaining_after_epsilon: float | None = None
    """What would remain if this job were admitted now (None when it does not fit)."""
    smallest_admissible_noise_multiplier: float | None = None
    smallest_admissible_noise_multiplier_reason: str | None = None
    largest_admissible_steps: int | None = None
    largest_admissible_steps_reason: str | None = None
    public_dataset: bool | None = None
    """True on a public dataset: nothing is charged."""
    init_chain: dict[str, Any] | None = None
    """With ``model.init`` naming a job: whether the job would use the same rows again, and the
    composed ε of the model it would release (``epsilon_composed_ledger``; a ``notice`` in words)."""
    witness_order: float | None = None
    """The Rényi order at which the ledger's ε is attained."""
    evaluation_interval: dict[str, Any] | None = None
    """With an evaluation block: how wide the released metric's 95% interval will be (``statement``)."""

    @property
    def epsilon_ledger(self) -> float:
        """Deprecated: :attr:`epsilon_reserved`."""
        return _deprecated_name(self, "epsilon_ledger", "epsilon_reserved")  # type: ignore[no-any-return]

    @property
    def epsilon_prv(self) -> float | None:
        """Deprecated: :attr:`epsilon_single_job`."""
        return _deprecated_name(self, "epsilon_prv", "epsilon_single_job")  # type: ignore[no-any-return]

    @property
    def epsilon_prv_method(self) -> str | None:
        """Deprecated: :attr:`epsilon_single_job_method`."""
        return _deprecated_name(self, "epsilon_prv_method", "epsilon_single_job_method")  # type: ignore[no-any-return]


@dataclasses.dataclass(frozen=True)
class BaseModel(Resource):
    """Public pretrained weights for one zoo architecture, or a Transformers checkpoint (``hf``),
    to start jobs from (``model.init``: {"base_model_id": id})."""

    id: str
    name: str
    architecture: str
    params: dict[str, Any]
    input_shape: list[int]
    n_outputs: int
    sha256: str
    size_bytes: int
    source: str | None
    created_at: dt.datetime | None = _parsed(_time)
    format: str | None = None
    """"safetensors" (a zoo architecture's file) or "hf" (a Transformers checkpoint)."""
    model_class: str | None = None
    parameter_count: int | None = None
    archive_sha256: str | None = None
    tokenizer_id: str | None = None
    stored_dtypes: list[str] | None = None
    """The dtypes the weights were uploaded in (cast to float32 when loaded)."""
    links: dict[str, str] | None = None
    """The resource's related URLs (self, and what belongs to it)."""


@dataclasses.dataclass(frozen=True)
class Tokenizer(Resource):
    """A public tokenizer for text datasets: "byte" (built in), uploaded, or trained on public text."""

    id: str
    name: str
    kind: str
    """"built-in", "uploaded" or "trained"."""
    vocab_size: int
    pad_id: int
    sha256: str | None
    source: str | None
    trained_from_dataset_id: str | None
    created_at: dt.datetime | None = _parsed(_time)
    size_bytes: int | None = None
    special_tokens: dict[str, int] | None = None
    """The tokenizer's special tokens and their ids (the pad token among them)."""
    links: dict[str, str] | None = None
    """The resource's related URLs (self, and what belongs to it)."""


@dataclasses.dataclass(frozen=True)
class Job(Resource):
    id: str
    dataset_id: str
    status: str
    algorithm: str
    model: str
    noise_multiplier: float
    steps_planned: int
    steps_run: int
    delta: float
    epsilon_reserved: float = dataclasses.field(metadata=_former_name("epsilon_ledger"))
    """The reservation: ledger ε of the planned run (formerly ``epsilon_ledger``)."""
    epsilon_single_job: float | None = dataclasses.field(metadata=_former_name("epsilon_prv"))
    """The tightest single-job ε of what the job's ``epsilon`` counts: the run it committed once it
    ended, the planned run while it runs (formerly ``epsilon_prv``). A server older than the rename
    sent the planned run's for a cancelled job too."""
    attempt: int
    cancel_requested: bool
    error_code: str | None
    metrics: dict[str, Any] | None
    spec: dict[str, Any]
    created_at: dt.datetime | None = _parsed(_time)
    started_at: dt.datetime | None = _parsed(_time)
    finished_at: dt.datetime | None = _parsed(_time)
    queue: str | None = None
    """The worker queue the job runs on (None from services older than queues)."""
    epsilon: float | None = None
    """The job's ε at delta: ``epsilon_committed`` once it has ended, ``epsilon_reserved`` while it is
    queued or running; ``epsilon_basis`` ("committed" or "reserved") says which."""
    epsilon_basis: str | None = None
    epsilon_committed: float | None = None
    """Ledger ε of what the job spent (its COMMIT entry); None until it ends."""
    privacy: dict[str, Any] | None = None
    """The job's privacy estimate, as ``estimate`` answers it."""
    links: dict[str, str] | None = None
    """The resource's related URLs (self, and what belongs to it)."""

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES

    @property
    def epsilon_ledger(self) -> float:
        """Deprecated: :attr:`epsilon_reserved`."""
        return _deprecated_name(self, "epsilon_ledger", "epsilon_reserved")  # type: ignore[no-any-return]

    @property
    def epsilon_prv(self) -> float | None:
        """Deprecated: :attr:`epsilon_single_job`."""
        return _deprecated_name(self, "epsilon_prv", "epsilon_single_job")  # type: ignore[no-any-return]


@dataclasses.dataclass(frozen=True)
class TuningJob(Resource):
    """A private hyperparameter tuning: K secret trials over ``candidates``, the best released as
    the job ``best_job_id`` once succeeded; one ledger entry (``epsilon_reserved``) for all of it."""

    id: str
    dataset_id: str
    status: str
    job_id: str
    best_job_id: str | None
    selected: dict[str, Any] | None
    """The released trial's configuration (searched fields and values)."""
    selected_metric: float | None
    """The released trial's DP hold-out metric."""
    error_code: str | None
    epsilon_reserved: float = dataclasses.field(metadata=_former_name("epsilon_ledger"))
    """What the whole tuning reserves (formerly ``epsilon_ledger``)."""
    epsilon_committed: float | None
    epsilon_one_trial: float
    epsilon_separate_jobs: float
    delta: float
    trials: dict[str, Any]
    candidates: list[dict[str, Any]]
    search_space: dict[str, Any]
    selection: dict[str, Any]
    created_at: dt.datetime | None = _parsed(_time)
    schedule: dict[str, Any] | None = None
    """Its public slots: ``slots`` (one per possible trial), ``slots_done``, ``slot_seconds``, …"""
    links: dict[str, str] | None = None
    """The resource's related URLs (self, and what belongs to it)."""

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES

    @property
    def epsilon_ledger(self) -> float:
        """Deprecated: :attr:`epsilon_reserved`."""
        return _deprecated_name(self, "epsilon_ledger", "epsilon_reserved")  # type: ignore[no-any-return]


@dataclasses.dataclass(frozen=True)
class JobEvent(Resource):
    """A lifecycle or progress event; payloads carry only public or DP-released values."""

    seq: int
    kind: str
    payload: dict[str, Any]
    created_at: dt.datetime | None = _parsed(_time)
