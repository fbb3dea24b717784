"""Python client and CLI for the privtrain service (distribution ``privtrain-client``).

The client and CLI need httpx and click only; ``load_model`` needs torch and safetensors (the
``model`` extra) and imports them only when called.

>>> from privtrain import Client
>>> client = Client.from_env()            # PRIVTRAIN_URL, PRIVTRAIN_API_KEY
>>> job = client.wait(client.submit(spec).id)
>>> loaded = privtrain.load_model("model.safetensors")   # loaded.model, loaded.classes
"""

from __future__ import annotations

__version__ = "0.1.0"

from privtrain.client import Client  # noqa: E402
from privtrain.errors import (  # noqa: E402
    AlreadyRegistered,
    BudgetExceeded,
    Conflict,
    IdempotencyKeyReused,
    IntegrityError,
    InvalidRequest,
    NotFound,
    PayloadTooLarge,
    PrivtrainError,
    RateLimited,
    ServerError,
    TransportError,
    Unauthorized,
    WaitTimeout,
)
from privtrain.resources import (  # noqa: E402
    Algorithm,
    BudgetStatus,
    Dataset,
    Estimate,
    Job,
    JobEvent,
    LedgerEntry,
    ModelInfo,
)
from privtrain.specs import build_job_spec  # noqa: E402

__all__ = [
    "AlreadyRegistered", "Algorithm", "BudgetExceeded", "BudgetStatus", "Client", "Conflict", "Dataset", "Estimate",
    "IdempotencyKeyReused", "IntegrityError", "InvalidRequest", "Job", "JobEvent", "LedgerEntry",
    "ModelInfo", "NotFound", "PayloadTooLarge", "PrivtrainError", "RateLimited", "ServerError",
    "TransportError", "Unauthorized", "WaitTimeout", "build_job_spec", "load_model", "__version__",
]


def __getattr__(name: str) -> object:
    """``privtrain.load_model`` without importing torch until it is used."""
    if name in ("load_model", "LoadedModel"):
        from privtrain import model_files

        return getattr(model_files, name)
    raise AttributeError(f"module 'privtrain' has no attribute {name!r}")
