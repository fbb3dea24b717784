"""Base models: public pretrained weights (safetensors) for one zoo architecture, tenant-scoped."""

from __future__ import annotations

import unicodedata
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from api.limits.upload_slots import UploadSlotDep
from api.problems import Problem
from api.routes.deps import ServicesDep, SessionDep, TenantDep
from api.routes.routing import ReleasingRoute
from api.routes.upload_body import receive_upload_body, upload_request_body
from kernel.base_models.dtypes import stored_dtypes
from kernel.base_models.hf_upload import HFUpload, register_hf_base_model
from kernel.base_models.registry import (
    BaseModelUpload,
    base_model_for,
    delete_base_model,
    list_base_models,
    register_base_model,
)
from kernel.bounded_json import JsonBounds, JsonRefused, loads_bounded
from kernel.db.orm import BaseModelRecord
from kernel.ingest.limits import IngestLimits
from kernel.model_catalogue import ModelSizeLimits
from kernel.schemas.base_models import BaseModelList, BaseModelOut
from kernel.storage.blobs import BlobStore

router = APIRouter(prefix="/v1/base-models", tags=["base-models"], route_class=ReleasingRoute)

MAX_PARAMS_CHARS = 16_000
PARAMS_BOUNDS = JsonBounds(max_chars=MAX_PARAMS_CHARS, max_depth=16)
"""An architecture's params nest 2 or 3 levels ({"hidden_sizes": [64, 64]})."""
MAX_INPUT_DIMS = 4


def base_model_out(record: BaseModelRecord, blobs: BlobStore) -> BaseModelOut:
    return BaseModelOut(
        id=record.id,
        name=record.name,
        architecture=record.architecture,
        params=record.params,
        input_shape=list(record.input_shape),
        n_outputs=record.n_outputs,
        sha256=record.sha256,
        size_bytes=record.size_bytes,
        stored_dtypes=stored_dtypes(blobs, record),
        format=record.format,
        model_class=record.model_class,
        parameter_count=record.parameter_count,
        archive_sha256=record.archive_sha256,
        tokenizer_id=record.tokenizer_id,
        source=record.source,
        created_at=record.created_at,
        links={"self": f"/v1/base-models/{record.id}"},
    )


def _invalid(detail: str, *, reason: str | None = None) -> Problem:
    return Problem(
        status=422,
        slug="invalid-base-model-request",
        detail=detail,
        extra={"reason": reason} if reason is not None else None,
    )


def _parse_params(params: str) -> dict[str, Any]:
    try:
        parsed = loads_bounded(params, bounds=PARAMS_BOUNDS)
    except JsonRefused as exc:
        raise _invalid(
            f'params: {exc.detail}; it must be a JSON object, e.g. {{}} or {{"hidden_sizes": [64]}}',
            reason=f"params-{exc.reason}",
        ) from None
    if not isinstance(parsed, dict):
        raise _invalid("params must be a JSON object", reason="params-not-an-object")
    return parsed


def _parse_input_shape(input_shape: str) -> tuple[int, ...]:
    parts = [part.strip() for part in input_shape.split(",")]
    if not 1 <= len(parts) <= MAX_INPUT_DIMS or not all(part.isdigit() and int(part) > 0 for part in parts):
        raise _invalid(
            f"input_shape must be 1 to {MAX_INPUT_DIMS} positive integers, comma-separated (e.g. 64 or 1,8,8)"
        )
    return tuple(int(part) for part in parts)


def _check_name(name: str) -> str:
    if any(unicodedata.category(ch).startswith("C") for ch in name):
        raise _invalid("name must not contain control characters")
    return name


def _required(value: object, name: str) -> None:
    if value is None:
        raise _invalid(f"{name} is required for format=safetensors (a zoo architecture's weights file)")


@router.post(
    "",
    status_code=201,
    response_model=BaseModelOut,
    openapi_extra=upload_request_body(
        "application/octet-stream",
        "application/zip",
        description="format=safetensors: the weights file; format=hf: a ZIP of a Transformers save_pretrained folder",
    ),
)
async def upload_base_model(
    request: Request,
    services: ServicesDep,
    tenant: TenantDep,
    _upload_slot: UploadSlotDep,
    name: Annotated[str, Query(min_length=1, max_length=200)],
    format: Annotated[
        Literal["safetensors", "hf"],
        Query(
            description="safetensors: one file for a zoo architecture (give architecture, input_shape, n_outputs); "
            "hf: a ZIP of a Transformers save_pretrained folder (config.json and safetensors weights)"
        ),
    ] = "safetensors",
    architecture: Annotated[
        str | None, Query(min_length=1, max_length=64, description="a zoo model name (GET /v1/models)")
    ] = None,
    input_shape: Annotated[
        str | None,
        Query(max_length=200, description="the model's input shape, comma-separated (a dataset's feature_shape)"),
    ] = None,
    n_outputs: Annotated[
        int | None, Query(ge=1, le=100_000, description="outputs of the model (classes, or 1)")
    ] = None,
    params: Annotated[
        str | None, Query(max_length=MAX_PARAMS_CHARS, description="the architecture's params, JSON")
    ] = None,
    task: Annotated[
        Literal["sequence-classification", "causal-lm", "image-classification"] | None,
        Query(description="format=hf: the task the weights serve; default: what config.json's class says"),
    ] = None,
    source: Annotated[
        str | None, Query(max_length=2000, description="where the weights came from (shown in reports)")
    ] = None,
    idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key", max_length=200)] = None,
) -> BaseModelOut | JSONResponse:
    """Upload public pretrained weights, checked without unpickling anything. ``format=safetensors``:
    a safetensors file whose tensor names and shapes must match the architecture's exactly, in any
    floating dtype (F16, BF16, F32, F64; the worker casts them). ``format=hf``: a ZIP of a
    Transformers ``save_pretrained`` folder (docs/hugging-face.md), registered as an `hf` model.
    Stored by content hash; a refusal stores nothing. With an Idempotency-Key a retry answers 200
    with the first upload's base model."""
    settings = services.settings
    limits = ModelSizeLimits.from_settings(settings)
    if format == "hf":
        given = [
            n
            for n, v in (
                ("architecture", architecture),
                ("input_shape", input_shape),
                ("n_outputs", n_outputs),
                ("params", params),
            )
            if v is not None
        ]
        if given:
            raise _invalid(
                f"{', '.join(given)}: format=hf reads the model from the archive's config.json; leave them out"
            )
        hf_upload = HFUpload(name=_check_name(name), task=task, source=source, idempotency_key=idempotency_key)
        pending = await receive_upload_body(request, settings=settings, blobs=services.blobs)
        registered = await run_in_threadpool(
            register_hf_base_model,
            db=services.db,
            blobs=services.blobs,
            tenant_id=tenant.id,
            pending=pending,
            upload=hf_upload,
            limits=limits,
            tokenizer_limits=IngestLimits.from_settings(settings),
            max_bytes=settings.max_upload_bytes,
        )
    else:
        _required(architecture, "architecture")
        _required(input_shape, "input_shape")
        _required(n_outputs, "n_outputs")
        if task is not None:
            raise _invalid("task applies to format=hf; a zoo architecture's task is its dataset's")
        assert architecture is not None and input_shape is not None and n_outputs is not None
        upload = BaseModelUpload(
            name=_check_name(name),
            architecture=architecture,
            params=_parse_params(params or "{}"),
            input_shape=_parse_input_shape(input_shape),
            n_outputs=n_outputs,
            source=source,
            idempotency_key=idempotency_key,
        )
        pending = await receive_upload_body(request, settings=settings, blobs=services.blobs)
        registered = await run_in_threadpool(
            register_base_model,
            db=services.db,
            blobs=services.blobs,
            tenant_id=tenant.id,
            pending=pending,
            upload=upload,
            limits=limits,
        )
    out = base_model_out(registered.record, services.blobs)
    if registered.replayed:
        return JSONResponse(out.model_dump(mode="json"), status_code=200)
    return out


@router.get("", response_model=BaseModelList)
def list_all(services: ServicesDep, session: SessionDep, tenant: TenantDep) -> BaseModelList:
    """The caller's base models, newest first."""
    return BaseModelList(items=[base_model_out(r, services.blobs) for r in list_base_models(session, tenant.id)])


@router.get("/{base_model_id}", response_model=BaseModelOut)
def get_one(base_model_id: str, services: ServicesDep, session: SessionDep, tenant: TenantDep) -> BaseModelOut:
    return base_model_out(base_model_for(session, tenant.id, base_model_id), services.blobs)


@router.delete("/{base_model_id}", status_code=204)
def delete(base_model_id: str, services: ServicesDep, session: SessionDep, tenant: TenantDep) -> Response:
    """Refused (409 base-model-in-use) while a queued or running job starts from it; reports of
    finished jobs keep its name, source and SHA-256."""
    session.close()
    delete_base_model(services.db, services.blobs, tenant_id=tenant.id, base_model_id=base_model_id)
    return Response(status_code=204)
