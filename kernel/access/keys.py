"""API keys: generated with 256 bits of randomness, stored only as SHA-256 digests."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Callable

from sqlalchemy import ColumnElement, select
from sqlalchemy.orm import Session

from kernel.access.dashboard_sessions import end_sessions_of_key
from kernel.db.orm import ApiKey, Tenant, utcnow

KEY_PREFIX = "pt_"
DEFAULT_TENANT = "default"


def generate_api_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def key_digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def get_or_create_tenant(session: Session, name: str) -> Tenant:
    tenant = session.scalar(select(Tenant).where(Tenant.name == name))
    if tenant is None:
        tenant = Tenant(name=name)
        session.add(tenant)
        session.flush()
    return tenant


def register_api_key(session: Session, *, tenant: Tenant, key: str, label: str = "") -> ApiKey:
    """Store a key's digest for a tenant; registering the same key twice is a no-op."""
    digest = key_digest(key)
    existing = session.scalar(select(ApiKey).where(ApiKey.digest == digest))
    if existing is not None:
        if existing.tenant_id != tenant.id:
            raise ValueError("this API key is already registered for another tenant")
        return existing
    api_key = ApiKey(tenant_id=tenant.id, digest=digest, prefix=key[:8], label=label)
    session.add(api_key)
    session.flush()
    return api_key


def tenant_for_key(session: Session, key: str) -> Tenant | None:
    """The tenant owning an active key, or None. Compares digests in constant time."""
    digest = key_digest(key)
    api_key = session.scalar(select(ApiKey).where(ApiKey.digest == digest))
    if api_key is None or api_key.revoked_at is not None:
        return None
    if not hmac.compare_digest(api_key.digest, digest):
        return None
    return session.get(Tenant, api_key.tenant_id)


KEY_LOOKUPS: tuple[tuple[str, Callable[[str], ColumnElement[bool]]], ...] = (
    ("id", lambda ref: ApiKey.id == ref),
    ("key", lambda ref: ApiKey.digest == key_digest(ref)),
    ("prefix", lambda ref: ApiKey.prefix == ref),
)
"""How an operator may name a key: its id (``key_…``), the key itself, or its 8-character
prefix. Tried in this order; the first kind that matches anything decides."""


def find_api_keys(session: Session, ref: str) -> list[ApiKey]:
    """The keys ``ref`` names (more than one only for an ambiguous prefix)."""
    for _kind, clause in KEY_LOOKUPS:
        found = list(session.scalars(select(ApiKey).where(clause(ref)).order_by(ApiKey.created_at)))
        if found:
            return found
    return []


def revoke_api_key(session: Session, api_key: ApiKey) -> bool:
    """Mark a key revoked (the row stays for the audit trail); False if it already was.
    A revoked key authenticates nobody: it answers 401 exactly like an unknown key, and its
    dashboard sessions end (their lookup refuses a revoked key too; this records when)."""
    if api_key.revoked_at is not None:
        return False
    api_key.revoked_at = utcnow()
    end_sessions_of_key(session, api_key.id, now=api_key.revoked_at)
    session.flush()
    return True
