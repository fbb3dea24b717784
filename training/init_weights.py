"""Load a job's starting weights (``model.init``) with safetensors, never ``torch.load``.

The weights are a base model's blob or another job's released model, named in the job's stored
spec (``init``, resolved and checked against the caller's access at submission). Their SHA-256 is
checked against the one recorded then. Every state-dict entry of the new model must be found with
the same shape, except the head's (app: the last parameterised module), which is kept fresh when
the class count differs: a new head for a new task.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from torch import nn

from kernel.db.engine import Database
from kernel.db.orm import BaseModelRecord, Job
from kernel.storage.blobs import BlobStore
from training.finetune import head_parameter_names


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def init_blob_path(db: Database, blobs: BlobStore, provenance: dict[str, Any]) -> Path:
    """The blob of the weights the job starts from, checked against the recorded SHA-256."""
    with db.read_session() as session:
        if provenance["kind"] == "base-model":
            record = session.get(BaseModelRecord, provenance["base_model_id"])
            key = record.blob_key if record is not None else None
        else:
            job = session.get(Job, provenance["job_id"])
            key = job.model_blob if job is not None else None
    if key is None or not blobs.exists(key):
        raise ValueError("the job's starting weights are no longer stored")
    path = blobs.local_path(key)
    if _sha256(path) != provenance["sha256"]:
        raise ValueError("the job's starting weights differ from the ones recorded at submission")
    return path


def load_into(model: nn.Module, weights: dict[str, torch.Tensor], *, new_head: bool = False) -> list[str]:
    """Copy every matching tensor into ``model``; returns the names kept fresh (a new head).

    ``new_head``: keep the head fresh even where the init's has the same shape (planning decided
    its outputs mean other classes). Each tensor is cast to its parameter's dtype: a checkpoint
    stored in F16 or BF16 loads exactly (every such value is a float32 value), an F64 one is
    rounded once. Raises ValueError when anything outside the head is missing, has another shape,
    or holds integers where the parameter holds floats (the upload check refuses those already)."""
    head = head_parameter_names(model)
    state = model.state_dict()
    fresh: list[str] = []
    for name, tensor in state.items():
        source = weights.get(name)
        if new_head and name in head:
            fresh.append(name)
            continue
        if source is not None and tuple(source.shape) == tuple(tensor.shape):
            if tensor.is_floating_point() and not source.is_floating_point():
                raise ValueError(f"init weights: {name} is {source.dtype}; a floating parameter needs floating values")
            continue
        if name in head:
            fresh.append(name)
            continue
        found = "missing" if source is None else f"of shape {list(source.shape)}"
        raise ValueError(f"init weights: {name} is {found}; the model needs {list(tensor.shape)}")
    loaded = {name: weights[name].to(state[name].dtype) for name in state if name not in fresh}
    model.load_state_dict(loaded, strict=False)
    return fresh


def apply_init(model: nn.Module, path: Path, *, new_head: bool = False) -> list[str]:
    """Load the safetensors file at ``path`` into ``model`` (see :func:`load_into`)."""
    return load_into(model, load_file(str(path)), new_head=new_head)
