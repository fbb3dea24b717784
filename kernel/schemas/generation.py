"""Generation requests and responses (docs/text.md, "Generating text")."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

MAX_PROMPT_CHARS = 2000
MAX_GENERATED_TOKENS = 256


class GenerateRequest(BaseModel):
    """Sample a continuation of ``prompt`` from a succeeded language-model job's released model."""

    model_config = ConfigDict(extra="forbid", strict=True)

    prompt: str = Field(min_length=1, max_length=MAX_PROMPT_CHARS, description="the text to continue")
    max_tokens: int = Field(
        default=64, ge=1, le=MAX_GENERATED_TOKENS, description="at most this many tokens are generated"
    )
    temperature: float = Field(
        default=1.0, ge=0.0, le=2.0, description="softmax temperature; 0 picks the most likely token every time"
    )
    top_k: int | None = Field(
        default=None, ge=1, le=100_000, description="sample among the k most likely tokens only (null: all)"
    )


class GenerateResponse(BaseModel):
    text: str = Field(description="the generated continuation (the prompt not included)")
    prompt: str
    tokens_generated: int = Field(description="tokens sampled; fewer than max_tokens when an end token came first")
    model_sha256: str = Field(description="SHA-256 of the model file that generated the text")
    statement: str = Field(description="why generating costs no privacy budget")
