"""Torch-free privacy math for privtrain: events, RDP curves, the Rényi filter, calibration, PRV,
the tight single-job ε of the report, and private hyperparameter tuning.

Every accountant (the ledger's RDP, and the report's single-job ones) meets one contract,
:class:`PrivacyAccountant` (``supports`` / ``compose`` / ``epsilon`` / ``delta``), and refuses an
event outside its model with :class:`UnsupportedEvent` (docs/privacy-model.md#accountants).

Every number produced here is meant to be a true upper bound on privacy loss (docs/privacy-model.md): costs
and epsilons are rounded up, capacities down (see :mod:`kernel.privacy.rounding`).
"""

from kernel.privacy.accountant import ACCOUNTANTS, AccountantFailed, PrivacyAccountant, Role, UnsupportedEvent
from kernel.privacy.accounting import (
    GaussianDpAccountant,
    PldAccountant,
    PrvAccountant,
    PureDpOptimalAccountant,
    RdpAccountant,
    RdpAtDeltaAccountant,
    accountant,
    accountants_for,
)
from kernel.privacy.budget_filter import admission_order, remaining_epsilon
from kernel.privacy.calibration import calibrate_noise_multiplier
from kernel.privacy.chain_composition import ComposedGuarantee, compose_guarantee, summed_curve
from kernel.privacy.conversion import capacity_curve, epsilon_from_rdp, ledger_epsilon
from kernel.privacy.curves import add_curves, subtract_curves
from kernel.privacy.errors import CalibrationError, PrivacyEventError
from kernel.privacy.event_json import EVENT_SCHEMA, EVENT_SCHEMA_VERSION, event_from_json, event_to_json
from kernel.privacy.events import (
    ComposedEvent,
    ExponentialMechanismEvent,
    GaussianEvent,
    HyperparameterTuningEvent,
    LaplaceEvent,
    PoissonSampledGaussianEvent,
    PoissonTrials,
    PrivacyEvent,
    PureDPEvent,
    TrialDistribution,
    TruncatedNegativeBinomial,
    ZCDPEvent,
)
from kernel.privacy.orders import ORDERS, ORDERS_VERSION
from kernel.privacy.prv import prv_epsilon
from kernel.privacy.rdp import rdp_curve
from kernel.privacy.single_job import SingleJobEpsilon, capped_single_job_epsilon, single_job_epsilon
from kernel.privacy.tuning import (
    expected_trials,
    sample_trial_count,
    trial_count_probability,
    truncated_negative_binomial_for_mean,
    tuned_curve,
)
from kernel.privacy.versions import ACCOUNTANT_NAME, ACCOUNTANT_VERSION

__all__ = [
    "ACCOUNTANTS",
    "ACCOUNTANT_NAME",
    "ACCOUNTANT_VERSION",
    "EVENT_SCHEMA",
    "EVENT_SCHEMA_VERSION",
    "ORDERS",
    "ORDERS_VERSION",
    "AccountantFailed",
    "CalibrationError",
    "ComposedEvent",
    "ComposedGuarantee",
    "ExponentialMechanismEvent",
    "GaussianDpAccountant",
    "GaussianEvent",
    "HyperparameterTuningEvent",
    "LaplaceEvent",
    "PldAccountant",
    "PoissonSampledGaussianEvent",
    "PoissonTrials",
    "PrivacyAccountant",
    "PrivacyEvent",
    "PrivacyEventError",
    "PrvAccountant",
    "PureDPEvent",
    "PureDpOptimalAccountant",
    "RdpAccountant",
    "RdpAtDeltaAccountant",
    "Role",
    "SingleJobEpsilon",
    "TrialDistribution",
    "TruncatedNegativeBinomial",
    "UnsupportedEvent",
    "ZCDPEvent",
    "accountant",
    "accountants_for",
    "add_curves",
    "admission_order",
    "calibrate_noise_multiplier",
    "capacity_curve",
    "capped_single_job_epsilon",
    "compose_guarantee",
    "epsilon_from_rdp",
    "event_from_json",
    "event_to_json",
    "expected_trials",
    "ledger_epsilon",
    "prv_epsilon",
    "rdp_curve",
    "remaining_epsilon",
    "sample_trial_count",
    "single_job_epsilon",
    "subtract_curves",
    "summed_curve",
    "trial_count_probability",
    "truncated_negative_binomial_for_mean",
    "tuned_curve",
]
