"""The algorithm and model catalogue pages, generated from the registries the API serves.

They render what ``GET /v1/algorithms`` and ``GET /v1/models`` return (each entry's
``describe()``), so the pages cannot drift from the code. Importing ``algorithms`` and
``kernel.model_catalogue`` needs no torch.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from markdown_tables import code, schema_bounds, schema_type, table

from algorithms import ALGORITHMS
from kernel.model_catalogue import MODELS

ALGORITHMS_URI = "reference/algorithms.md"
MODELS_URI = "reference/models.md"

FAMILY_PAGES: Mapping[str, tuple[str, str]] = {
    "dp-sgd": ("DP-SGD and its baselines", "../algorithms/dp-sgd.md"),
    "dc-dpsgd": ("DC-DPSGD", "../algorithms/dc-dpsgd.md"),
    "dicesgd": ("DiceSGD", "../algorithms/dicesgd.md"),
    "kl-condition": ("KL-condition family", "../algorithms/kl-family.md"),
    "heavy-tailed-dpsco": ("Heavy-tailed DP-SCO", "../algorithms/heavy-tailed-dpsco.md"),
}
"""Each family's hand-written page (privacy calibration, why it differs from the paper)."""

_ALGORITHMS_INTRO = """# Algorithm catalogue

Generated from the algorithm registry (`algorithms.ALGORITHMS`) when the site is built: the
same entries, hyperparameters and defaults as `GET /v1/algorithms`. Each family's page explains
its privacy calibration: [Algorithms](../algorithms/index.md).
"""

_MODELS_INTRO = """# Model catalogue

Generated from the zoo's table (`privtrain_common.zoo.catalogue`, as the service validates it in
`kernel.model_catalogue.MODELS`) when the site is built: the same entries as `GET /v1/models`.
A model that cannot take a dataset is refused at submission (422).
Each entry lists its fine-tuning blocks with the default params (`finetune_blocks`), first to
last: `training.finetune: last_k_blocks` trains the last `finetune_k` of them, and a larger
`finetune_k` is refused at submission (see [fine-tuning blocks](../pretraining-and-finetuning.md#fine-tuning-blocks)).
"""


def properties_table(schema: Mapping[str, Any], defaults: Mapping[str, Any]) -> str:
    """One row per property of a JSON schema: name, type, default, bounds, description."""
    rows = [
        (
            code(name),
            schema_type(prop),
            code(defaults[name]) if name in defaults else "",
            schema_bounds(prop),
            prop.get("description", ""),
        )
        for name, prop in schema.get("properties", {}).items()
    ]
    if not rows:
        return "No parameters."
    return table(("name", "type", "default", "bounds", "meaning"), rows)


def family_link(family: str) -> str:
    title, page = FAMILY_PAGES.get(family, (family, ""))
    return f"[{title}]({page})" if page else family


def algorithm_section(entry: Mapping[str, Any]) -> str:
    """One algorithm: what it is, the training fields it reads, its hyperparameters."""
    lines = [
        f"## `{entry['name']}`",
        "",
        f"Family: {family_link(entry['family'])}. Paper: {entry['paper']}.",
        "",
        entry["summary"],
        "",
    ]
    if "training_fields" in entry:
        fields = ", ".join(code(name) for name in entry["training_fields"])
        batch = " Full batch: the service records `batch_size` = n." if entry.get("full_batch") else ""
        lines += [f"Training fields it reads: {fields}; any other is refused.{batch}", ""]
    lines += [
        "Hyperparameters:",
        "",
        properties_table(entry["hyperparameters_schema"], entry["defaults"]),
        "",
        "JSON schema:",
        "",
        "```json",
        json.dumps(entry["hyperparameters_schema"], indent=2, ensure_ascii=False),
        "```",
        "",
    ]
    return "\n".join(lines)


def render_algorithms_page() -> str:
    """Every registered algorithm, grouped by family in the order of FAMILY_PAGES."""
    entries = [ALGORITHMS.get(name).describe() for name in ALGORITHMS.names()]
    order = list(FAMILY_PAGES)
    entries.sort(key=lambda e: (order.index(e["family"]) if e["family"] in order else len(order), e["name"]))
    summary = table(
        ("algorithm", "family", "summary"),
        [(f"[`{e['name']}`](#{e['name']})", family_link(e["family"]), e["summary"]) for e in entries],
    )
    return _ALGORITHMS_INTRO + "\n" + summary + "\n\n" + "\n".join(algorithm_section(e) for e in entries)


def render_models_page() -> str:
    """Every registered model: summary, tasks, parameters and their defaults."""
    sections = []
    for model in sorted(MODELS.values(), key=lambda m: m.name):
        params = model.params_model
        blocks = model.block_names(params().model_dump(mode="json"))
        sections.append(
            "\n".join(
                [
                    f"## `{model.name}`",
                    "",
                    model.summary,
                    "",
                    f"Tasks: {', '.join(sorted(model.tasks))}.",
                    "",
                    f"Fine-tuning blocks with the default params ({len(blocks)}): "
                    f"{', '.join(code(name) for name in blocks)}.",
                    "",
                    properties_table(params.model_json_schema(), params().model_dump(mode="json")),
                    "",
                ]
            )
        )
    return _MODELS_INTRO + "\n" + "\n".join(sections)
