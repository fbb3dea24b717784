"""The algorithm and model catalogues (public, but still behind an API key)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from algorithms import ALGORITHMS, UnknownAlgorithm, get_algorithm
from api.problems import not_found
from api.routes.deps import TenantDep
from api.routes.routing import ReleasingRoute
from kernel.model_catalogue import MODELS

router = APIRouter(prefix="/v1", tags=["catalogue"], route_class=ReleasingRoute)


@router.get("/algorithms")
def list_algorithms(_tenant: TenantDep) -> dict[str, Any]:
    return {"items": [entry.describe() for entry in ALGORITHMS.values()]}


@router.get("/algorithms/{name}")
def get_algorithm_entry(name: str, _tenant: TenantDep) -> dict[str, Any]:
    try:
        return get_algorithm(name).describe()
    except UnknownAlgorithm:
        raise not_found("algorithm") from None


@router.get("/models")
def list_models(_tenant: TenantDep) -> dict[str, Any]:
    return {
        "items": [
            {
                "name": m.name,
                "summary": m.summary,
                "tasks": sorted(m.tasks),
                "params_schema": m.params_model.model_json_schema(),
                "defaults": m.params_model().model_dump(mode="json"),
                "finetune_blocks": m.block_names(m.params_model().model_dump(mode="json")),
                "lora": m.lora,  # training.finetune "lora" applies (attention and MLP Linear layers)
                "lora_targets": m.lora_targets,  # hf: training.lora.target_modules per model type
            }
            for m in MODELS.values()
        ]
    }
