"""API keys: generated with 256 bits of randomness, stored only as SHA-256 digests."""

from __future__ import annotations

import hashlib
import hmac
import secrets

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.models import ApiKey, Tenant

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
