"""Base-model responses (docs/pretraining-and-finetuning.md)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from kernel.schemas.types import UtcDateTime


class BaseModelOut(BaseModel):
    id: str
    name: str
    architecture: str = Field(description="the zoo model the weights belong to (GET /v1/models)")
    params: dict[str, Any] = Field(description="the architecture's params, defaults filled in")
    input_shape: list[int]
    n_outputs: int
    sha256: str = Field(description="SHA-256 of the weights file as stored (format=safetensors: as uploaded)")
    size_bytes: int
    stored_dtypes: list[str] = Field(
        description="the safetensors dtypes the file's tensors were uploaded in, e.g. BF16 (each once); the worker "
        "casts each tensor to its parameter's dtype (F32 in the zoo) when it loads them"
    )
    format: str = Field(
        description="safetensors (a zoo architecture's file) or hf (a Transformers save_pretrained folder, zipped)"
    )
    model_class: str | None = Field(
        description="format=hf: the Transformers class the checkpoint was saved from (config.json's architectures)"
    )
    parameter_count: int | None = Field(description="format=hf: the model's trainable parameters")
    archive_sha256: str | None = Field(
        description="format=hf: SHA-256 of the ZIP as uploaded (sha256 is the stored weights file's: one "
        "safetensors file under the hf model's tensor names)"
    )
    tokenizer_id: str | None = Field(
        description="format=hf: the tokenizer registered from the archive's tokenizer.json; tokenise a text "
        "dataset for this model with tokenizer=base:<this base model's id> (or this id)"
    )
    source: str | None = Field(description="where the owner says the weights came from")
    created_at: UtcDateTime
    links: dict[str, str]


class BaseModelList(BaseModel):
    items: list[BaseModelOut]
