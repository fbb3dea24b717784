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
    sha256: str = Field(description="SHA-256 of the safetensors file as uploaded")
    size_bytes: int
    stored_dtypes: list[str] = Field(
        description="the safetensors dtypes the file's tensors were uploaded in, e.g. BF16 (each once); the worker "
        "casts each tensor to its parameter's dtype (F32 in the zoo) when it loads them"
    )
    source: str | None = Field(description="where the owner says the weights came from")
    created_at: UtcDateTime
    links: dict[str, str]


class BaseModelList(BaseModel):
    items: list[BaseModelOut]
