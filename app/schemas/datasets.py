"""Dataset responses."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from app.schemas.types import UtcDateTime


class BudgetIncrease(BaseModel):
    """The owner raises the budget; recorded as an ADJUST ledger entry and shown in later reports."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    epsilon: float = Field(gt=0, le=100)
    delta: float | None = Field(default=None, gt=0, lt=1, description="defaults to the current δ")
    reason: str = Field(default="", max_length=500)


class BudgetOut(BaseModel):
    epsilon: float
    delta: float


class DatasetOut(BaseModel):
    id: str
    name: str
    format: str
    sha256: str | None = Field(
        description="SHA-256 of the uploaded bytes: an exact function of the rows, so the owner's "
        "view only (null for analysts)",
    )
    size_bytes: int | None = Field(
        description="size of the uploaded bytes: an exact function of the rows, so the owner's view "
        "only (null for analysts)",
    )
    n_rows: int
    feature_shape: list[int]
    n_features: int
    task: str
    n_classes: int | None
    classes: list[str] | None = Field(
        default=None,
        description="the public class list (label i is classes[i]); null for regression",
    )
    classes_source: Literal["declared", "observed"] | None = Field(
        default=None,
        description="declared: the owner gave the list at upload; observed: it was taken from the "
        "labels found in the upload, and became public when the dataset was registered",
    )
    label_column: str | None
    feature_names: list[str] | None
    budget: BudgetOut
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
    epsilon: float | None
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


class GrantCreate(BaseModel):
    """The owner grants another tenant (by name) the analyst role on the dataset."""

    model_config = ConfigDict(extra="forbid")

    tenant: str = Field(min_length=1, max_length=200, description="the analyst tenant's name")


class GrantOut(BaseModel):
    """One grant; revoked grants stay listed (audit trail) with ``revoked_at`` set."""

    dataset_id: str
    tenant: str = Field(description="the grantee tenant's name")
    granted_at: UtcDateTime
    granted_by: str = Field(description="the name of the tenant that granted access")
    revoked_at: UtcDateTime | None
    revoked_by: str | None
    active: bool


class GrantList(BaseModel):
    items: list[GrantOut]
