"""Tokenizers for text datasets: the built-in byte tokenizer, uploaded tokenizer.json files and
BPE tokenizers trained on public text; all public, tenant-scoped (docs/text.md)."""

from __future__ import annotations

import unicodedata
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.concurrency import run_in_threadpool

from api.limits.upload_slots import UploadSlotDep
from api.problems import Problem
from api.routes.deps import ServicesDep, SessionDep, TenantDep
from api.routes.routing import ReleasingRoute
from api.routes.upload_body import receive_upload_body, upload_request_body
from kernel.access.roles import dataset_for
from kernel.datasets.status import require_active
from kernel.db.orm import TokenizerRecord
from kernel.ingest.limits import IngestLimits
from kernel.schemas.tokenizers import TokenizerList, TokenizerOut, TokenizerTrain
from kernel.tokenizer_registry import (
    TrainRequest,
    list_tokenizers,
    register_tokenizer,
    tokenizer_for,
    train_tokenizer,
)
from kernel.tokenizers import byte
from kernel.tokenizers.base import BYTE_TOKENIZER_ID
from kernel.tokenizers.hugging_face import TRAINED_SPECIAL_TOKENS

router = APIRouter(prefix="/v1/tokenizers", tags=["tokenizers"], route_class=ReleasingRoute)


BYTE_TOKENIZER = TokenizerOut(
    id=BYTE_TOKENIZER_ID,
    name="byte-level (UTF-8 bytes)",
    kind="built-in",
    vocab_size=byte.VOCAB_SIZE,
    pad_id=byte.PAD_ID,
    special_tokens={"pad": byte.PAD_ID, "bos": byte.BOS_ID, "eos": byte.EOS_ID},
    sha256=None,
    size_bytes=None,
    source=None,
    trained_from_dataset_id=None,
    created_at=None,
    links={"self": f"/v1/tokenizers/{BYTE_TOKENIZER_ID}"},
)


def tokenizer_out(record: TokenizerRecord) -> TokenizerOut:
    return TokenizerOut(
        id=record.id,
        name=record.name,
        kind="trained" if record.kind == "trained" else "uploaded",
        vocab_size=record.vocab_size,
        pad_id=record.pad_id,
        special_tokens=_special_tokens(record),
        sha256=record.sha256,
        size_bytes=record.size_bytes,
        source=record.source,
        trained_from_dataset_id=record.trained_from_dataset_id,
        created_at=record.created_at,
        links={"self": f"/v1/tokenizers/{record.id}"},
    )


def _special_tokens(record: TokenizerRecord) -> dict[str, int]:
    """A trained tokenizer's are fixed (pad 0, bos 1, eos 2); an uploaded one's pad is what was found."""
    if record.kind == "trained":
        return {name.strip("<>"): index for index, name in enumerate(TRAINED_SPECIAL_TOKENS)}
    return {"pad": record.pad_id}


def _check_name(name: str) -> str:
    if any(unicodedata.category(ch).startswith("C") for ch in name):
        raise Problem(status=422, slug="invalid-tokenizer-request", detail="name must not contain control characters")
    return name


@router.post(
    "",
    status_code=201,
    response_model=TokenizerOut,
    openapi_extra=upload_request_body(
        "application/json", "application/octet-stream", description="a Hugging Face tokenizer.json file"
    ),
)
async def upload_tokenizer(
    request: Request,
    services: ServicesDep,
    tenant: TenantDep,
    _upload_slot: UploadSlotDep,
    name: Annotated[str, Query(min_length=1, max_length=200)],
    pad_token: Annotated[
        str | None,
        Query(
            min_length=1,
            max_length=200,
            description="the token rows are padded with, when the file sets no padding and has no token named "
            "<pad>, [PAD], <|pad|> or <PAD>",
        ),
    ] = None,
    source: Annotated[str | None, Query(max_length=2000, description="where the tokenizer came from")] = None,
) -> TokenizerOut:
    """Upload a Hugging Face ``tokenizer.json`` (the body). It is loaded with the ``tokenizers``
    library to check it (no network), must have a pad token, and is stored by content hash; a
    refusal stores nothing. A tokenizer is public: never upload one learned from private text."""
    _check_name(name)
    settings = services.settings
    pending = await receive_upload_body(
        request, settings=settings, blobs=services.blobs, max_bytes=settings.max_tokenizer_bytes
    )
    record = await run_in_threadpool(
        register_tokenizer,
        db=services.db,
        blobs=services.blobs,
        tenant_id=tenant.id,
        pending=pending,
        name=name,
        pad_token=pad_token,
        source=source,
        limits=IngestLimits.from_settings(services.settings),
    )
    return tokenizer_out(record)


@router.post("/train", status_code=201, response_model=TokenizerOut)
async def train(
    body: TokenizerTrain, services: ServicesDep, session: SessionDep, tenant: TenantDep, _upload_slot: UploadSlotDep
) -> TokenizerOut:
    """Train a byte-level BPE tokenizer on a public text dataset's texts. A private dataset is
    refused (409 tokenizer-on-private-data): a learned vocabulary reveals strings of its texts."""
    _check_name(body.name)
    dataset = dataset_for(session, tenant, body.dataset_id)
    require_active(dataset)  # its texts are erased, or about to be
    session.expunge(dataset)
    session.close()
    record = await run_in_threadpool(
        train_tokenizer,
        db=services.db,
        blobs=services.blobs,
        tenant_id=tenant.id,
        dataset=dataset,
        request=TrainRequest(vocab_size=body.vocab_size, name=body.name),
        limits=IngestLimits.from_settings(services.settings),
    )
    return tokenizer_out(record)


@router.get("", response_model=TokenizerList)
def list_all(session: SessionDep, tenant: TenantDep) -> TokenizerList:
    """The built-in byte tokenizer, then the caller's tokenizers, newest first."""
    return TokenizerList(items=[BYTE_TOKENIZER, *(tokenizer_out(r) for r in list_tokenizers(session, tenant.id))])


@router.get("/{tokenizer_id}", response_model=TokenizerOut)
def get_one(tokenizer_id: str, session: SessionDep, tenant: TenantDep) -> TokenizerOut:
    if tokenizer_id == BYTE_TOKENIZER_ID:
        return BYTE_TOKENIZER
    return tokenizer_out(tokenizer_for(session, tenant.id, tokenizer_id))
