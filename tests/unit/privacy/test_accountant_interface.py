"""The accountant contract (kernel.privacy.accountant): supports / compose / epsilon / delta and the
one UnsupportedEvent, for every registered accountant; agreement with the functions they replace;
and a cross-check against dp-accounting's own RdpAccountant and PLDAccountant."""

from __future__ import annotations

import math

import dp_accounting
import pytest
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernel.privacy import (
    ACCOUNTANTS,
    AccountantFailed,
    ComposedEvent,
    ExponentialMechanismEvent,
    GaussianEvent,
    HyperparameterTuningEvent,
    LaplaceEvent,
    PoissonSampledGaussianEvent,
    PrivacyAccountant,
    PrivacyEvent,
    PrivacyEventError,
    PureDPEvent,
    Role,
    TruncatedNegativeBinomial,
    UnsupportedEvent,
    ZCDPEvent,
    accountant,
    accountants_for,
    add_curves,
    epsilon_from_rdp,
    ledger_epsilon,
    prv_epsilon,
    rdp_curve,
    single_job_epsilon,
    summed_curve,
)
from kernel.privacy.accounting import (
    GaussianDpAccountant,
    PldAccountant,
    PrvAccountant,
    PureDpOptimalAccountant,
    RdpAccountant,
    RdpAtDeltaAccountant,
)
from kernel.privacy.leaf_accountant import LeafAccountant
from kernel.privacy.orders import ORDERS
from kernel.privacy.pld_accountant import pld_epsilon
from kernel.privacy.rounding import round_up
from kernel.privacy.single_job import METHODS, gaussian_dp_epsilon, pure_dp_composition_epsilon
from kernel.registry import UnknownName

DELTA = 1e-5
EVERY_METHOD = sorted(ACCOUNTANTS.names())
CLOSED_FORM = [name for name in EVERY_METHOD if ACCOUNTANTS.get(name).role is not Role.NUMERIC]
WITH_DELTA = ["rdp", "rdp-single-job", "gaussian-dp", "pure-dp-optimal", "pld"]

TUNING = HyperparameterTuningEvent(TruncatedNegativeBinomial(1.0, 0.1), (GaussianEvent(2.0, 1), LaplaceEvent(3.0, 1)))

# Golden numbers (float.hex) of the ledger's ε and the closed-form single-job ε at δ = 1e-5, recorded
# before the accountants existed: the interface must not move a single bit of them.
GOLDEN: dict[str, tuple[PrivacyEvent, str, str, str]] = {
    "psg": (
        PoissonSampledGaussianEvent(0.01, 1.1, 1000),
        "0x1.077b5a971e94ap+1",
        "0x1.b9c073774b697p+0",
        "rdp-single-job",
    ),
    "gauss": (
        ComposedEvent((GaussianEvent(2.0, 3), GaussianEvent(3.0, 5))),
        "0x1.90fec6a92adb6p+2",
        "0x1.4722ad979fab8p+2",
        "gaussian-dp",
    ),
    "pure": (
        ComposedEvent((PureDPEvent(0.1, 50), ExponentialMechanismEvent(0.1, 30))),
        "0x1.f895c7aa9571bp+1",
        "0x1.b9a683dc7b806p+1",
        "rdp-single-job",
    ),
    "zcdp": (ZCDPEvent(0.05, 40), "0x1.82c41bd56b6d9p+3", "0x1.5731c25691012p+3", "rdp-single-job"),
    "mixed": (
        ComposedEvent((ZCDPEvent(0.05, 40), LaplaceEvent(10.0, 1))),
        "0x1.835faf4c535e1p+3",
        "0x1.5a1d3927b13dap+3",
        "rdp-single-job",
    ),
    "tuning": (TUNING, "0x1.27779bf64db3ap+2", "0x1.14cf310c673c9p+2", "rdp-single-job"),
}

_COUNTS = st.integers(min_value=0, max_value=40)
_LEAVES = st.one_of(
    st.builds(PoissonSampledGaussianEvent, st.sampled_from([0.01, 0.1, 1.0]), st.floats(0.8, 20.0), _COUNTS),
    st.builds(GaussianEvent, st.floats(0.5, 50.0), _COUNTS),
    st.builds(LaplaceEvent, st.floats(0.5, 100.0), _COUNTS),
    st.builds(ZCDPEvent, st.floats(1e-4, 0.5), _COUNTS),
    st.builds(PureDPEvent, st.sampled_from([0.05, 0.2]), _COUNTS),
    st.builds(ExponentialMechanismEvent, st.sampled_from([0.05, 0.2]), _COUNTS),
)
_EVENTS = st.one_of(
    _LEAVES,
    st.lists(_LEAVES, max_size=3).map(lambda leaves: ComposedEvent(tuple(leaves))),
    st.just(TUNING),
)
_PROPERTY = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _fresh(method: str, *, zcdp_is_gaussian: bool = False) -> PrivacyAccountant:
    return accountant(method, zcdp_is_gaussian=zcdp_is_gaussian)


# ----------------------------------------------------------------------------- the registry


def test_every_report_method_is_one_registered_accountant() -> None:
    assert set(ACCOUNTANTS.names()) == set(METHODS)
    for name in EVERY_METHOD:
        cls = ACCOUNTANTS.get(name)
        assert issubclass(cls, PrivacyAccountant) and cls.method == name and isinstance(cls.role, Role)
    assert [name for name in EVERY_METHOD if ACCOUNTANTS.get(name).role is Role.LEDGER] == ["rdp"]
    with pytest.raises(UnknownName):
        accountant("moments")


@pytest.mark.parametrize(
    ("event", "zcdp_is_gaussian", "expected"),
    [
        (GaussianEvent(2.0, 3), False, {"gaussian-dp", "prv", "pld", "rdp-single-job", "rdp"}),
        (PoissonSampledGaussianEvent(0.01, 1.0, 10), False, {"prv", "pld", "rdp-single-job", "rdp"}),
        (PureDPEvent(0.1, 3), False, {"pure-dp-optimal", "prv", "pld", "rdp-single-job", "rdp"}),
        (
            ComposedEvent((PureDPEvent(0.1, 3), ExponentialMechanismEvent(0.2, 1))),
            False,
            {"prv", "pld", "rdp-single-job", "rdp"},
        ),
        (ZCDPEvent(0.1, 3), False, {"rdp-single-job", "rdp"}),
        (ZCDPEvent(0.1, 3), True, {"gaussian-dp", "prv", "pld", "rdp-single-job", "rdp"}),
        (ComposedEvent((ZCDPEvent(0.1, 3), LaplaceEvent(1.0, 0))), False, {"rdp-single-job", "rdp"}),
        (TUNING, True, {"rdp-single-job", "rdp"}),
    ],
)
def test_which_accountant_prices_an_event_is_answered_by_supports(
    event: PrivacyEvent, zcdp_is_gaussian: bool, expected: set[str]
) -> None:
    found = accountants_for(event, zcdp_is_gaussian=zcdp_is_gaussian)
    assert {a.method for a in found} == expected
    numeric = accountants_for(event, zcdp_is_gaussian=zcdp_is_gaussian, roles=frozenset({Role.NUMERIC}))
    assert {a.method for a in numeric} == expected & {"prv", "pld"}


# ----------------------------------------------------------------------------- the contract


@pytest.mark.parametrize("method", EVERY_METHOD)
def test_nothing_composed_is_free(method: str) -> None:
    assert _fresh(method).epsilon(DELTA) == 0.0
    if method in WITH_DELTA:
        assert _fresh(method).delta(1.0) == 0.0


@pytest.mark.parametrize("method", EVERY_METHOD)
def test_compose_is_chainable_and_count_zero_is_a_no_op(method: str) -> None:
    event = GaussianEvent(3.0, 2) if method != "pure-dp-optimal" else PureDPEvent(0.3, 2)
    fresh = _fresh(method)
    assert fresh.compose(event, 0) is fresh
    assert fresh.epsilon(DELTA) == 0.0
    once = _fresh(method).compose(event).compose(event)
    twice = _fresh(method).compose(event, 2)
    assert once.epsilon(DELTA) > 0.0 and twice.epsilon(DELTA) > 0.0


@pytest.mark.parametrize("method", EVERY_METHOD)
@pytest.mark.parametrize("count", [-1, 1.5, True, "2"])
def test_a_bad_count_is_refused(method: str, count: object) -> None:
    with pytest.raises(PrivacyEventError, match="count"):
        _fresh(method).compose(GaussianEvent(1.0, 1), count)  # type: ignore[arg-type]


@pytest.mark.parametrize("method", EVERY_METHOD)
def test_a_non_event_is_the_one_unsupported_error(method: str) -> None:
    fresh = _fresh(method)
    assert not fresh.supports("gaussian")  # type: ignore[arg-type]
    with pytest.raises(UnsupportedEvent, match="not a privacy event") as caught:
        fresh.compose(object())  # type: ignore[arg-type]
    assert caught.value.accountant == method
    assert isinstance(caught.value, PrivacyEventError) and isinstance(caught.value, ValueError)


@pytest.mark.parametrize(
    ("method", "event"),
    [
        ("gaussian-dp", LaplaceEvent(1.0, 1)),
        ("gaussian-dp", ZCDPEvent(0.1, 1)),
        ("gaussian-dp", PoissonSampledGaussianEvent(0.5, 1.0, 1)),
        ("pure-dp-optimal", GaussianEvent(1.0, 1)),
        ("pure-dp-optimal", ComposedEvent((PureDPEvent(0.1, 1), PureDPEvent(0.2, 1)))),
        ("prv", ZCDPEvent(0.1, 1)),
        ("pld", ZCDPEvent(0.1, 1)),
        ("prv", TUNING),
        ("pld", ComposedEvent((TUNING, GaussianEvent(1.0, 1)))),
        ("gaussian-dp", TUNING),
        ("pure-dp-optimal", TUNING),
    ],
)
def test_an_unsupported_event_raises_unsupported_event_and_changes_nothing(method: str, event: PrivacyEvent) -> None:
    fresh = _fresh(method)
    assert not fresh.supports(event)
    with pytest.raises(UnsupportedEvent) as caught:
        fresh.compose(event)
    assert caught.value.accountant == method and caught.value.event == event
    assert method in str(caught.value)
    assert fresh.epsilon(DELTA) == 0.0


def test_pure_dp_support_depends_on_what_is_composed() -> None:
    composed = PureDpOptimalAccountant().compose(PureDPEvent(0.1, 3))
    assert composed.supports(ExponentialMechanismEvent(0.1, 2))
    assert not composed.supports(PureDPEvent(0.2, 1))
    assert composed.supports(PureDPEvent(0.2, 0))  # a mechanism used 0 times is none


def test_the_rdp_formulas_raise_the_same_error_for_an_unknown_kind() -> None:
    with pytest.raises(UnsupportedEvent, match="no RDP curve"):
        rdp_curve(object())  # type: ignore[arg-type]


def test_a_numeric_accountant_without_a_trustworthy_number_fails_without_a_number() -> None:
    tiny_delta = 1e-40  # below DELTA_MIN: prv-accountant's numerics are not trusted there
    with pytest.raises(AccountantFailed):
        PrvAccountant().compose(GaussianEvent(1.0, 1)).epsilon(tiny_delta)


def test_pure_dp_over_its_count_limit_fails_and_the_report_falls_back() -> None:
    event = PureDPEvent(1e-4, 300_000)
    with pytest.raises(AccountantFailed, match="uses"):
        PureDpOptimalAccountant().compose(event).epsilon(DELTA)
    assert single_job_epsilon(event, DELTA, zcdp_is_gaussian=False, numeric=False).method != "pure-dp-optimal"


@pytest.mark.parametrize("method", EVERY_METHOD)
def test_invalid_delta_and_epsilon_are_refused(method: str) -> None:
    composed = _fresh(method).compose(GaussianEvent(3.0, 2) if method != "pure-dp-optimal" else PureDPEvent(0.3, 2))
    for delta in (0.0, 1.0, -1e-5, math.nan):
        with pytest.raises(PrivacyEventError):
            composed.epsilon(delta)
    if method in WITH_DELTA:
        for epsilon in (-1.0, math.inf, math.nan):
            with pytest.raises(PrivacyEventError):
                composed.delta(epsilon)
    else:
        with pytest.raises(NotImplementedError):
            composed.delta(1.0)


# ----------------------------------------------------------------------------- the old numbers


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_golden_numbers_are_bit_identical(name: str) -> None:
    event, ledger_hex, single_job_hex, method = GOLDEN[name]
    assert RdpAccountant().compose(event).epsilon(DELTA) == float.fromhex(ledger_hex)
    assert ledger_epsilon(rdp_curve(event), DELTA) == float.fromhex(ledger_hex)
    result = single_job_epsilon(event, DELTA, zcdp_is_gaussian=False, numeric=False)
    assert (result.epsilon, result.method) == (float.fromhex(single_job_hex), method)
    winner = _fresh(method).compose(event)
    assert winner.epsilon(DELTA) == result.epsilon and winner.label == result.detail


@_PROPERTY
@given(first=_EVENTS, second=_EVENTS)
def test_the_ledger_accountant_is_rdp_curve_summed(first: PrivacyEvent, second: PrivacyEvent) -> None:
    one = RdpAccountant().compose(first)
    assert one.curve == rdp_curve(first)
    both = RdpAccountant().compose(first).compose(second)
    assert both.curve == add_curves(rdp_curve(first), rdp_curve(second))
    assert both.curve == summed_curve([first, second])
    if any(one.curve):
        assert one.epsilon(DELTA) == ledger_epsilon(rdp_curve(first), DELTA)


def test_each_single_job_accountant_agrees_with_its_function() -> None:
    gaussians = ComposedEvent((GaussianEvent(2.0, 3), GaussianEvent(3.0, 5), GaussianEvent(2.0, 1)))
    gdp = GaussianDpAccountant().compose(gaussians)
    assert gdp.epsilon(DELTA) == gaussian_dp_epsilon(mu=math.sqrt(round_up(math.fsum([4 / 4.0, 5 / 9.0]))), delta=DELTA)
    pure = ComposedEvent((PureDPEvent(0.1, 50), ExponentialMechanismEvent(0.1, 30)))
    assert PureDpOptimalAccountant().compose(pure).epsilon(DELTA) == pure_dp_composition_epsilon(
        epsilon0=0.1, count=80, delta=DELTA
    )
    sampled = ComposedEvent((PoissonSampledGaussianEvent(0.01, 1.0, 200), LaplaceEvent(20.0, 3)))
    assert PrvAccountant().compose(sampled).epsilon(DELTA) == prv_epsilon(sampled, DELTA)
    assert PldAccountant().compose(sampled).epsilon(DELTA) == pld_epsilon(sampled, DELTA)
    assert RdpAtDeltaAccountant().compose(TUNING).epsilon(DELTA) == epsilon_from_rdp(rdp_curve(TUNING), DELTA)[0]


def test_dominated_leaves_are_priced_as_their_dominating_mechanisms() -> None:
    zcdp = ZCDPEvent(0.02, 10)
    as_gaussian = GaussianEvent(1.0 / math.sqrt(2 * 0.02), 10)
    assert PrvAccountant(zcdp_is_gaussian=True).compose(zcdp).epsilon(DELTA) == prv_epsilon(
        ComposedEvent((as_gaussian,)), DELTA
    )
    bounded = ExponentialMechanismEvent(0.3, 5)
    assert PldAccountant().compose(bounded).epsilon(DELTA) == pld_epsilon(PureDPEvent(0.3, 5), DELTA)


# ----------------------------------------------------------------------------- properties


@_PROPERTY
@given(event=_EVENTS, zcdp_is_gaussian=st.booleans())
def test_supports_is_exactly_whether_compose_accepts(event: PrivacyEvent, zcdp_is_gaussian: bool) -> None:
    for method in EVERY_METHOD:
        fresh = _fresh(method, zcdp_is_gaussian=zcdp_is_gaussian)
        if fresh.supports(event):
            assert fresh.compose(event) is fresh
        else:
            with pytest.raises(UnsupportedEvent):
                fresh.compose(event)


@_PROPERTY
@given(event=_EVENTS, a=st.integers(0, 4), b=st.integers(0, 4))
def test_composition_is_associative_in_count_for_the_leaf_accountants(event: PrivacyEvent, a: int, b: int) -> None:
    """compose(e, a).compose(e, b) is compose(e, a + b), exactly: counts are summed, never rounded."""
    for method in CLOSED_FORM:
        fresh = _fresh(method, zcdp_is_gaussian=True)
        if not isinstance(fresh, LeafAccountant) or not fresh.supports(event):
            continue
        split = _fresh(method, zcdp_is_gaussian=True).compose(event, a).compose(event, b)
        whole = _fresh(method, zcdp_is_gaussian=True).compose(event, a + b)
        assert isinstance(split, LeafAccountant) and isinstance(whole, LeafAccountant)
        assert split.leaves == whole.leaves
        assert split.epsilon(DELTA) == whole.epsilon(DELTA)


@_PROPERTY
@given(event=_EVENTS, a=st.integers(1, 4), b=st.integers(1, 4))
def test_rdp_composition_is_associative_in_count_up_to_outward_rounding(event: PrivacyEvent, a: int, b: int) -> None:
    """The RDP accountants add rounded-up curves, so splitting a count moves a value by rounding only."""
    for method in ("rdp", "rdp-single-job"):
        split = _fresh(method).compose(event, a).compose(event, b).epsilon(DELTA)
        whole = _fresh(method).compose(event, a + b).epsilon(DELTA)
        stepwise = _fresh(method)
        for _ in range(a + b):
            stepwise.compose(event)
        for value in (whole, stepwise.epsilon(DELTA)):
            assert value == pytest.approx(split, rel=1e-9, abs=1e-12)


@_PROPERTY
@given(first=_EVENTS, second=_EVENTS)
def test_composing_more_never_lowers_a_closed_form_epsilon(first: PrivacyEvent, second: PrivacyEvent) -> None:
    for method in CLOSED_FORM:
        one = _fresh(method)
        if not one.supports(first):
            continue
        before = one.compose(first).epsilon(DELTA)
        if not one.supports(second):
            continue
        assert one.compose(second).epsilon(DELTA) >= before * (1 - 1e-9)


@_PROPERTY
@given(event=_EVENTS, delta=st.sampled_from([1e-3, 1e-5, 1e-9]))
def test_delta_inverts_epsilon_on_the_safe_side(event: PrivacyEvent, delta: float) -> None:
    """δ(ε(δ)) <= δ up to rounding: the two directions describe one bound."""
    for method in ("rdp", "rdp-single-job", "gaussian-dp", "pure-dp-optimal"):
        fresh = _fresh(method)
        if not fresh.supports(event):
            continue
        fresh.compose(event)
        if fresh.epsilon(delta) == 0.0:
            continue
        if method == "rdp-single-job":  # its ε may come from a real order; δ is on the grid
            epsilon = epsilon_from_rdp(RdpAccountant().compose(event).curve, delta)[0]
        else:
            epsilon = fresh.epsilon(delta)
        assert fresh.delta(epsilon) <= delta * (1 + 1e-6)
        assert fresh.delta(epsilon * 1.5) <= fresh.delta(epsilon)


def test_pld_delta_inverts_its_epsilon() -> None:
    pld = PldAccountant().compose(PoissonSampledGaussianEvent(0.05, 1.0, 100))
    epsilon = pld.epsilon(DELTA)
    assert 0.0 < pld.delta(epsilon) <= DELTA * (1 + 1e-6)
    assert pld.delta(epsilon / 2) > DELTA


# ----------------------------------------------------------------------------- dp-accounting


def _dp_accounting_event(leaf: PrivacyEvent) -> tuple[dp_accounting.DpEvent, int]:
    if isinstance(leaf, PoissonSampledGaussianEvent):
        sampled = dp_accounting.PoissonSampledDpEvent(
            leaf.sampling_probability, dp_accounting.GaussianDpEvent(leaf.noise_multiplier)
        )
        return sampled, leaf.count
    if isinstance(leaf, GaussianEvent):
        return dp_accounting.GaussianDpEvent(leaf.noise_multiplier), leaf.count
    assert isinstance(leaf, LaplaceEvent)
    return dp_accounting.LaplaceDpEvent(leaf.noise_multiplier), leaf.count


CROSS_CHECKED = [
    PoissonSampledGaussianEvent(0.01, 1.1, 1000),
    PoissonSampledGaussianEvent(0.1, 2.0, 300),
    GaussianEvent(4.0, 20),
    LaplaceEvent(5.0, 10),
]


@pytest.mark.parametrize("leaf", CROSS_CHECKED, ids=repr)
def test_rdp_accountants_match_dp_accountings_rdp_accountant(leaf: PrivacyEvent) -> None:
    """Same orders, same conversion: ours is above theirs by our outward rounding and margins only."""
    theirs = rdp_privacy_accountant.RdpAccountant(orders=list(ORDERS))
    theirs.compose(*_dp_accounting_event(leaf))
    ours_at_delta = epsilon_from_rdp(RdpAccountant().compose(leaf).curve, DELTA)[0]
    their_at_delta = theirs.get_epsilon(DELTA)
    assert their_at_delta <= ours_at_delta <= their_at_delta * (1 + 1e-6)
    assert RdpAtDeltaAccountant().compose(leaf).epsilon(DELTA) <= ours_at_delta
    ledger = RdpAccountant().compose(leaf).epsilon(DELTA)
    their_ledger = theirs.get_epsilon(DELTA / len(ORDERS))
    assert their_ledger <= ledger <= their_ledger * (1 + 1e-6)


@pytest.mark.parametrize("leaf", CROSS_CHECKED, ids=repr)
def test_pld_accountant_matches_dp_accountings_pld_accountant(leaf: PrivacyEvent) -> None:
    theirs = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    theirs.compose(*_dp_accounting_event(leaf))
    ours = PldAccountant().compose(leaf)
    assert ours.epsilon(DELTA) == pytest.approx(theirs.get_epsilon(DELTA), rel=1e-3)
    assert ours.delta(1.0) == pytest.approx(theirs.get_delta(1.0), rel=1e-2, abs=1e-12)


def test_the_exact_gaussian_profile_is_below_dp_accountings_pessimistic_pld() -> None:
    """μ-GDP is the exact profile of Gaussians: a pessimistic PLD is not below it (beyond the
    LOG_DELTA_MARGIN that keeps ours on the safe side, ~3e-7 in ε here), and close above it."""
    leaves = (GaussianEvent(2.0, 3), GaussianEvent(3.0, 5))
    theirs = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    for leaf in leaves:
        theirs.compose(*_dp_accounting_event(leaf))
    exact = GaussianDpAccountant().compose(ComposedEvent(leaves)).epsilon(DELTA)
    pessimistic = theirs.get_epsilon(DELTA)
    assert exact - 1e-6 <= pessimistic <= exact + 0.01
