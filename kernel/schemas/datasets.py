"""Dataset responses."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from kernel.privacy.ranges import DELTA_MIN
from kernel.schemas.types import UtcDateTime


class BudgetIncrease(BaseModel):
    """The owner raises the budget; recorded as an ADJUST ledger entry and shown in later reports."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    epsilon: float = Field(gt=0, le=100)
    delta: float | None = Field(default=None, ge=DELTA_MIN, lt=1, description="defaults to the current δ")
    reason: str = Field(default="", max_length=500)


class BudgetOut(BaseModel):
    epsilon: float
    delta: float


class DeletionOut(BaseModel):
    """A deletion asked for by the owner (``DELETE /v1/datasets/{id}``) and how far it has gone."""

    requested_at: UtcDateTime
    deleted_at: UtcDateTime | None = Field(
        description="when the rows, arrays and private files were erased (status deleted); null while deleting"
    )
    models: Literal["kept", "deleted"] = Field(
        description="the owner's choice for the models of the dataset's jobs (their reports are always kept)"
    )
    jobs_settling: int | None = Field(
        default=None,
        description="queued or running jobs still to settle before the erasure (null in listings)",
    )
    models_pending: int | None = Field(
        default=None,
        description="models to delete that a job on another dataset still starts from; erased once it settles "
        "(null in listings)",
    )


class DatasetOut(BaseModel):
    id: str
    name: str
    format: str
    status: Literal["active", "deleting", "deleted"] = Field(
        default="active",
        description="active; deleting (its jobs are stopping, then its files are erased); deleted (a tombstone: "
        "public facts, budget, ledger and jobs kept, rows erased). Only the owner sees a dataset once its "
        "deletion was asked for",
    )
    deletion: DeletionOut | None = Field(default=None, description="null while the dataset is active")
    sha256: str | None = Field(
        description="SHA-256 of the uploaded bytes: an exact function of the rows, so the owner's "
        "view only (null for analysts)",
    )
    content_digest: str | None = Field(
        default=None,
        description="the identity of the parsed rows (invariant to line endings, row and column order; "
        "docs/privacy-model.md#one-content-one-budget): an exact function of the rows, so the owner's view "
        "only; null for analysts, and for datasets registered before it existed until an operator computes it",
    )
    size_bytes: int | None = Field(
        description="size of the uploaded bytes: an exact function of the rows, so the owner's view "
        "only (null for analysts)",
    )
    n_rows: int | None = Field(
        description="the number of rows. On a dataset with a privacy unit column it is an exact function of the "
        "rows (a removed unit changes it by its row count): null for everyone but the owner unless the owner "
        "declared it public at upload (n_rows_public; docs/privacy-units.md#the-row-count)",
    )
    n_rows_public: bool = Field(
        default=True,
        description="whether n_rows is shown to everyone with access: always true when the privacy unit is a row",
    )
    feature_shape: list[int] = Field(
        description="the shape of one row as the models see it: [d] for rows of numbers, [C, H, W] for "
        "images (channels first)",
    )
    modality: Literal["tabular", "image", "text"] = Field(
        default="tabular",
        description="image: uint8 images stored as uploaded (channels-last) and normalised to x / 255 "
        "on the worker; tabular: rows of numbers; text: JSON Lines texts stored as token ids, "
        "[max_length] per row",
    )
    image_shape: list[int] | None = Field(
        default=None,
        description="an image dataset's [H, W, C] (height, width, channels: 1 grey, 3 RGB), as stored; "
        "null for tabular datasets",
    )
    tokenizer_id: str | None = Field(
        default=None,
        description='a text dataset\'s tokenizer: "byte" (built in) or a tok_ id (GET /v1/tokenizers); '
        "null for other modalities",
    )
    vocab_size: int | None = Field(
        default=None, description="a text dataset's vocabulary size (every token id is below it); null otherwise"
    )
    pad_id: int | None = Field(
        default=None,
        description="a text dataset's pad id: every row is truncated at max_length and right-padded with it",
    )
    max_length: int | None = Field(
        default=None,
        description="a text dataset's tokens per row, as declared at upload (its feature_shape is [max_length]); "
        "how many texts were truncated is not shown: it depends on the private texts",
    )
    text_field: str | None = Field(
        default=None, description="the JSON member holding each record's text; null for other modalities"
    )
    n_features: int
    task: str
    n_classes: int | None
    classes: list[str] | None = Field(
        default=None,
        description="the public class list (label i is classes[i]); null for regression, and null "
        "in GET /v1/datasets items (a list can be long: read it from GET /v1/datasets/{id})",
    )
    classes_source: Literal["declared", "observed"] | None = Field(
        default=None,
        description="declared: the owner gave the list at upload; observed: it was taken from the "
        "labels found in the upload, and became public when the dataset was registered",
    )
    label_column: str | None
    privacy_unit_column: str | None = Field(
        default=None,
        description="the column naming each row's privacy unit (e.g. patient_id), declared at upload; null: "
        "the privacy unit is one row",
    )
    n_units: int | None = Field(
        default=None,
        description="the number of privacy units (distinct values of privacy_unit_column), public like n_rows; "
        "null when the privacy unit is one row",
    )
    privacy_unit: str = Field(
        default="one row",
        description="what one privacy unit is: neighbouring datasets differ by adding or removing one of them",
    )
    preparation: dict[str, Any] | None = Field(
        default=None,
        description="the data preparation the owner declared at upload (drop, one_hot, scale), "
        "applied by the worker when it loads the rows; public, because it does not depend on the "
        "rows. null when none was declared, and null in GET /v1/datasets items (read it from "
        "GET /v1/datasets/{id})",
    )
    feature_names: list[str] | None = Field(
        description="the CSV header's feature columns; null for NPZ, and null in GET /v1/datasets "
        "items (a wide dataset's names run to megabytes: read them from GET /v1/datasets/{id})",
    )
    budget: BudgetOut | None = Field(
        description="the privacy budget; null for a public dataset, which has none",
    )
    public: bool = Field(
        default=False,
        description="declared public by its owner at upload: no budget, no ledger, non-private "
        "optimizers (sgd, adam) allowed, and no differential privacy guarantee in its jobs' reports",
    )
    created_at: UtcDateTime
    links: dict[str, str]
    role: Literal["owner", "analyst"] = Field(
        default="owner",
        description="the caller's role: owner (uploaded it) or analyst (granted access by the owner)",
    )
    notices: list[str] = Field(
        default_factory=list,
        description="things the owner should know about this registration (upload response only)",
    )
    ledger_continued: bool = Field(
        default=False,
        description="upload response only: true when these rows had been registered before and deleted, so "
        "this upload continues their old ledger, budget and spend under the old id (one content, one budget)",
    )


class DatasetList(BaseModel):
    items: list[DatasetOut]
    next_cursor: str | None


class OrderDetail(BaseModel):
    order: float
    committed: float
    reserved: float
    capacity: float


class BudgetView(BaseModel):
    dataset_id: str
    epsilon: float
    delta: float
    committed_epsilon: float
    reserved_epsilon: float
    spent_epsilon: float
    remaining_epsilon: float
    entries: int
    last_hash: str
    orders_version: str
    per_order: list[OrderDetail]


class LedgerEntryOut(BaseModel):
    seq: int
    kind: str
    job_id: str | None
    event: dict[str, Any] | None
    curve: list[float] | None
    epsilon: float | None = Field(description="ε of the entry's curve at the dataset's δ_G")
    explanation: str = Field(
        description="what the entry did to the budget, in words; ε in it is at the job's δ "
        "(a RELEASE returns budget: it is never a charge)"
    )
    orders_version: str
    accountant: str
    accountant_version: str
    actor: str
    details: dict[str, Any]
    created_at: UtcDateTime
    prev_hash: str
    hash: str


class LedgerPage(BaseModel):
    items: list[LedgerEntryOut]
    next_cursor: str | None
