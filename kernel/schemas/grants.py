"""Grant and invitation requests and responses."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from kernel.access.grants import MAX_TENANT_NAME_CHARS, is_plausible_tenant_name
from kernel.schemas.datasets import BudgetOut
from kernel.schemas.types import UtcDateTime

GrantStatusField = Literal["invited", "active", "declined", "revoked"]


class GrantCreate(BaseModel):
    """The owner invites another tenant (by name) to take the analyst role on the dataset."""

    model_config = ConfigDict(extra="forbid")

    tenant: str = Field(
        min_length=1,
        max_length=MAX_TENANT_NAME_CHARS,
        description="the name of the tenant to invite; it is not looked up, so the answer is the "
        "same whether or not such a tenant exists",
    )

    @field_validator("tenant")
    @classmethod
    def _plausible(cls, value: str) -> str:
        if not is_plausible_tenant_name(value):
            raise ValueError("a tenant name has no control characters")
        return value


class GrantOut(BaseModel):
    """One invitation or grant; revoked, withdrawn and declined ones stay listed (audit trail)."""

    dataset_id: str
    tenant: str = Field(description="the name the owner invited (not checked against existing tenants)")
    status: GrantStatusField = Field(
        description="invited: waiting for the tenant's answer (no access yet); active: accepted, "
        "the tenant is an analyst; declined: the tenant said no; revoked: the owner ended the "
        "grant or withdrew the invitation",
    )
    active: bool = Field(description="true only when accepted and not revoked (status active)")
    granted_at: UtcDateTime = Field(description="when the owner sent the invitation")
    granted_by: str = Field(description="the name of the tenant that sent the invitation")
    accepted_at: UtcDateTime | None
    declined_at: UtcDateTime | None
    revoked_at: UtcDateTime | None
    revoked_by: str | None


class GrantList(BaseModel):
    items: list[GrantOut]
    next_cursor: str | None


class InvitationOut(BaseModel):
    """An invitation to the caller: the dataset's public facts only, before it accepts anything."""

    id: str = Field(description="the invitation's id: its dataset's id (one invitation per dataset and name)")
    dataset_id: str
    dataset_name: str
    owner: str = Field(description="the name of the tenant that owns the dataset and sent the invitation")
    budget: BudgetOut | None = Field(
        description="the dataset's total privacy budget (ε_G, δ_G), shared by every analyst; null for a public dataset"
    )
    public: bool = Field(default=False, description="the owner declared the dataset public: no budget, no ledger")
    invited_at: UtcDateTime
    status: GrantStatusField = Field(description="invited while pending; active once accepted; declined")
    accepted_at: UtcDateTime | None
    declined_at: UtcDateTime | None
    links: dict[str, str]


class InvitationList(BaseModel):
    items: list[InvitationOut]
    next_cursor: str | None
