"""The algorithm catalogue: what each algorithm's hyperparameters are and what a job costs.

Torch-free on purpose: the API computes and reserves a job's privacy cost before any worker sees
the data; the worker looks up its implementation by the same name.
"""

from algorithms.baselines import definition as _baselines  # noqa: F401
from algorithms.dc_dpsgd import definition as _dc_dpsgd  # noqa: F401  (registers "dc-dpsgd", "dc-dpsgd-threshold")
from algorithms.dicesgd import definition as _dicesgd  # noqa: F401  (registers "dicesgd", "dicesgd-adam", "dicesgd-auto")
from algorithms.dp_sgd import definition as _dp_sgd  # noqa: F401  (registers "dp-sgd")
from algorithms.errors import MissingTrainingFields, UnusedTrainingField
from algorithms.ht_dpsco import definition as _ht_dpsco  # noqa: F401  (registers "ht-dp-fw", "ht-private-lasso", "ht-sparse-linreg", "ht-sparse-opt")
from algorithms.kl_family import definition as _kl_family  # noqa: F401  (registers "kl-spider", "adaptive-noisy-gd", "noisy-gd", "proximal-point")
from algorithms.non_private import definition as _non_private  # noqa: F401  (registers "sgd", "adam")
from algorithms.registry import (
    ALGORITHMS,
    AlgorithmDefinition,
    InvalidHyperparameters,
    PrivacyPlan,
    UnknownAlgorithm,
    get_algorithm,
    register_algorithm,
)

__all__ = [
    "ALGORITHMS",
    "AlgorithmDefinition",
    "InvalidHyperparameters",
    "MissingTrainingFields",
    "PrivacyPlan",
    "UnknownAlgorithm",
    "UnusedTrainingField",
    "get_algorithm",
    "register_algorithm",
]
