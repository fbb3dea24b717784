"""Python client and CLI for the privtrain service (distribution ``privtrain-client``).

The client and CLI need httpx and click only; ``load_model`` needs torch and safetensors (the
``model`` extra) and imports them only when called.

>>> from privtrain import Client
>>> client = Client.from_env()  # PRIVTRAIN_URL, PRIVTRAIN_API_KEY
>>> job = client.wait(client.submit(spec).id)
>>> loaded = privtrain.load_model("model.safetensors")  # loaded.model, loaded.classes
>>> outputs = loaded(X)  # the model's outputs on X, without gradients
"""

from __future__ import annotations

from privtrain.client import Client
from privtrain.errors import (
    AlreadyRegistered,
    BudgetExceeded,
    Conflict,
    Gone,
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
from privtrain.resources import (
    Algorithm,
    BaseModel,
    BudgetStatus,
    Dataset,
    Estimate,
    Job,
    JobEvent,
    LedgerEntry,
    ModelInfo,
    Tokenizer,
)
from privtrain.specs import build_job_spec
from privtrain.version import __version__

__all__ = [
    "Algorithm",
    "AlreadyRegistered",
    "BaseModel",
    "BudgetExceeded",
    "BudgetStatus",
    "Client",
    "Conflict",
    "Dataset",
    "Estimate",
    "Gone",
    "IdempotencyKeyReused",
    "IntegrityError",
    "InvalidRequest",
    "Job",
    "JobEvent",
    "LedgerEntry",
    "ModelInfo",
    "NotFound",
    "PayloadTooLarge",
    "PrivtrainError",
    "RateLimited",
    "ServerError",
    "Tokenizer",
    "TransportError",
    "Unauthorized",
    "WaitTimeout",
    "__version__",
    "build_job_spec",
    "load_model",
]


def __dir__() -> list[str]:
    """The public names, ``load_model`` and ``LoadedModel`` among them (loaded on first use)."""
    return sorted({*__all__, "LoadedModel"})


def __getattr__(name: str) -> object:
    """``privtrain.load_model`` without importing torch until it is used."""
    if name in ("load_model", "LoadedModel"):
        # torch is optional for the client: model_files imports it, so only when a model is loaded
        from privtrain_common import model_files

        return getattr(model_files, name)
    raise AttributeError(f"module 'privtrain' has no attribute {name!r}")
