"""Worker-side implementations of the catalogue's algorithms, looked up by the same name.

Importing this package registers every trainer; add a module per algorithm family and import it
here.
"""

from worker.trainers import baselines as _baselines  # noqa: F401
from worker.trainers import dc_dpsgd as _dc_dpsgd  # noqa: F401  (registers "dc-dpsgd", "dc-dpsgd-threshold")
from worker.trainers import dicesgd as _dicesgd  # noqa: F401  (registers "dicesgd", "dicesgd-adam", "dicesgd-auto")
from worker.trainers import dp_sgd as _dp_sgd  # noqa: F401  (registers "dp-sgd")
from worker.trainers import ht_dpsco as _ht_dpsco  # noqa: F401  (registers the "ht-*" family)
from worker.trainers import kl_family as _kl_family  # noqa: F401  (registers "kl-spider", "adaptive-noisy-gd", "noisy-gd", "proximal-point")
from worker.trainers import non_private as _non_private  # noqa: F401  (registers "sgd", "adam")
from worker.trainers.base import (
    TRAINERS,
    Trainer,
    TrainingRequest,
    get_trainer,
    preflight,
    register_trainer,
)

__all__ = ["TRAINERS", "Trainer", "TrainingRequest", "get_trainer", "preflight", "register_trainer"]
