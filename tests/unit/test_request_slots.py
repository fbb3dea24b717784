"""The request cap's counters (api.limits.request_slots) and its memory of verified keys
(kernel.access.verified_keys): caps never exceeded, all-or-nothing claims, nothing left behind."""

from __future__ import annotations

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from api.limits.capped_slots import SlotsFull
from api.limits.request_cap import RequestCaps, claim_of
from api.limits.request_slots import Claim, RequestSlots
from kernel.access.verified_keys import KnownKeys, VerifiedKey

LIMITS = {"per-key": 2, "per-tenant": 3, "per-address": 2, "unverified": 3, "total": 5}
KEYS = [VerifiedKey(key_id=f"key_{k}", tenant_id=f"tn_{k // 2}") for k in range(4)]  # two keys per tenant
ADDRESSES = ["10.0.0.1", "10.0.0.2"]

claims = st.one_of(
    st.sampled_from(KEYS).map(lambda key: claim_of(key, address="10.9.9.9")),
    st.sampled_from(ADDRESSES).map(lambda address: claim_of(None, address=address)),
)


@settings(max_examples=200, deadline=None)
@given(steps=st.lists(st.tuples(st.booleans(), claims, st.integers(min_value=0, max_value=10)), max_size=60))
def test_no_cap_is_ever_exceeded_and_every_claim_is_all_or_nothing(steps: list[tuple[bool, Claim, int]]) -> None:
    slots = RequestSlots(limits=LIMITS)
    held: list[Claim] = []
    for take, claim, pick in steps:
        if take or not held:
            expected = all(
                sum(other.count(slot) for other in held) < LIMITS[slot[0]] for slot in claim
            )  # a model: what the held claims leave free
            try:
                slots.acquire(claim)
            except SlotsFull as exc:
                assert not expected
                assert exc.scope in {scope for scope, _ in claim}
                first_full = next(s for s in claim if sum(o.count(s) for o in held) >= LIMITS[s[0]])
                assert (exc.scope, exc.limit) == (first_full[0], LIMITS[first_full[0]])
            else:
                assert expected
                held.append(claim)
        else:
            slots.release(held.pop(pick % len(held)))
        for scope, owner in {slot for claim in held for slot in claim}:
            count = slots.in_flight(scope, owner)
            assert count == sum(claim.count((scope, owner)) for claim in held) <= LIMITS[scope]
    for claim in held:
        slots.release(claim)
    assert slots.owners() == 0  # counters of owners that left are dropped


def test_a_tenants_keys_share_its_cap_and_unverified_requests_never_touch_a_keys_counters() -> None:
    slots = RequestCaps.slots(per_key=2, per_tenant=3, per_address=2, unverified=2, total=10)
    first, second = (VerifiedKey(key_id=f"key_{n}", tenant_id="tn_a") for n in range(2))
    for claim in (claim_of(first, address="a"), claim_of(first, address="a"), claim_of(second, address="a")):
        slots.acquire(claim)
    with pytest.raises(SlotsFull) as refused:
        slots.acquire(claim_of(second, address="a"))
    assert (refused.value.scope, refused.value.limit) == ("per-tenant", 3)
    for _ in range(2):
        slots.acquire(claim_of(None, address="a"))  # the same address as the tenant's requests
    with pytest.raises(SlotsFull) as unverified:
        slots.acquire(claim_of(None, address="b"))
    assert unverified.value.scope == "unverified"
    assert slots.in_flight("per-key", "key_0") == 2 and slots.in_flight("per-tenant", "tn_a") == 3


def test_releasing_more_than_was_taken_is_an_error() -> None:
    slots = RequestSlots(limits=LIMITS)
    claim = claim_of(KEYS[0], address="x")
    slots.acquire(claim)
    slots.release(claim)
    with pytest.raises(RuntimeError):
        slots.release(claim)
    with pytest.raises(ValueError, match="no limit"):
        slots.acquire((("per-planet", "mars"),))


def test_known_keys_remember_only_active_keys_for_their_ttl() -> None:
    now = [0.0]
    lookups: list[str] = []
    active = {"digest-a": KEYS[0]}

    def lookup(digest: str) -> VerifiedKey | None:
        lookups.append(digest)
        return active.get(digest)

    known = KnownKeys(lookup=lookup, ttl_s=10.0, max_keys=2, clock=lambda: now[0])

    async def verify(digest: str) -> VerifiedKey | None:
        return await known.verify(digest)

    assert anyio.run(verify, "digest-a") == KEYS[0]
    assert anyio.run(verify, "random") is None
    assert known.cached("digest-a") == KEYS[0] and known.cached("random") is None
    assert len(known) == 1  # a digest that names no key is never remembered
    now[0] = 10.5
    assert known.cached("digest-a") is None  # expired: looked up again next time
    for n in range(3):
        known.remember(f"d{n}", KEYS[n])
    assert len(known) == 2 and known.cached("d0") is None  # bounded, oldest forgotten first
    assert lookups == ["digest-a", "random"]
