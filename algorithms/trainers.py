"""Worker-side implementations of the catalogue's algorithms, looked up by the same name.

Importing this package registers every trainer; add a module per algorithm family and import it
here.
"""

from algorithms.baselines import trainer as _baselines  # noqa: F401
from algorithms.dc_dpsgd import trainer as _dc_dpsgd  # noqa: F401  (registers "dc-dpsgd", "dc-dpsgd-threshold")
from algorithms.dicesgd import trainer as _dicesgd  # noqa: F401  (registers "dicesgd", "dicesgd-adam", "dicesgd-auto")
from algorithms.dp_sgd import trainer as _dp_sgd  # noqa: F401  (registers "dp-sgd")
from algorithms.ht_dpsco import trainer as _ht_dpsco  # noqa: F401  (registers the "ht-*" family)
from algorithms.kl_family import trainer as _kl_family  # noqa: F401  (registers "kl-spider", "adaptive-noisy-gd", "noisy-gd", "proximal-point")
from algorithms.non_private import trainer as _non_private  # noqa: F401  (registers "sgd", "adam")
from algorithms.trainer_registry import (
    TRAINERS,
    Trainer,
    TrainingRequest,
    get_trainer,
    preflight,
    register_trainer,
)

__all__ = ["TRAINERS", "Trainer", "TrainingRequest", "get_trainer", "preflight", "register_trainer"]
