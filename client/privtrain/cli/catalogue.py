"""``privtrain algorithms`` and ``privtrain models``: the service's catalogues."""

from __future__ import annotations

import click

from privtrain.cli.state import current_state, emit, json_flag
from privtrain.output import Column, key_values, table
from privtrain.resources import Algorithm, ModelInfo

ALGORITHM_COLUMNS: list[Column[Algorithm]] = [
    Column("NAME", lambda a: a.name),
    Column("FAMILY", lambda a: a.family),
    Column("HYPERPARAMETERS", lambda a: ", ".join(a.hyperparameters_schema.get("properties", {})), 50),
    Column("PAPER", lambda a: a.paper, 50),
]

MODEL_COLUMNS: list[Column[ModelInfo]] = [
    Column("NAME", lambda m: m.name),
    Column("TASKS", lambda m: ", ".join(m.tasks)),
    Column("PARAMETERS", lambda m: m.defaults, 50),
    Column("SUMMARY", lambda m: m.summary, 60),
]


@click.command("algorithms")
@click.argument("name", required=False)
@json_flag
def algorithms(name: str | None) -> None:
    """The algorithm catalogue, or one algorithm's hyperparameters and defaults."""
    client = current_state().client()
    if name is None:
        found = sorted(client.list_algorithms(), key=lambda a: a.name)
        emit(found, lambda: table(found, ALGORITHM_COLUMNS))
        return
    entry = client.get_algorithm(name)
    properties = entry.hyperparameters_schema.get("properties", {})
    training = [("training fields", ", ".join(entry.training_fields))] if entry.training_fields is not None else []
    emit(
        entry,
        lambda: key_values(
            [("name", entry.name), ("family", entry.family), ("paper", entry.paper), ("summary", entry.summary)]
            + training
            + [
                (f"  {k}", f"{entry.defaults.get(k)!r}  {v.get('description', '')}".rstrip())
                for k, v in properties.items()
            ]
        ),
    )


@click.command("models")
@click.argument("name", required=False)
@json_flag
def models(name: str | None) -> None:
    """The model catalogue, with each model's parameters and defaults; or one model in full."""
    found = sorted(current_state().client().list_models(), key=lambda m: m.name)
    if name is None:
        emit(found, lambda: table(found, MODEL_COLUMNS))
        return
    entry = next((m for m in found if m.name == name), None)
    if entry is None:
        known = ", ".join(m.name for m in found)
        raise click.BadParameter(f"no model {name!r}; the models: {known}", param_hint="NAME")
    properties = entry.params_schema.get("properties", {})
    extra = entry.raw
    emit(
        entry,
        lambda: key_values(
            [("name", entry.name), ("tasks", ", ".join(entry.tasks)), ("summary", entry.summary)]
            + [("finetune blocks", ", ".join(extra.get("finetune_blocks") or []) or "-"), ("lora", extra.get("lora"))]
            + [
                (f"  {k}", f"{entry.defaults.get(k)!r}  {v.get('description', '')}".rstrip())
                for k, v in properties.items()
            ]
        ),
    )
