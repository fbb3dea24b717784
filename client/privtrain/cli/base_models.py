"""``privtrain base-models``: public pretrained weights to start jobs from (model.init)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import click

from privtrain.cli.state import current_state, emit, json_flag
from privtrain.output import Column, key_values, table
from privtrain.resources import BaseModel
from privtrain.specs import parse_assignment

BASE_MODEL_COLUMNS: list[Column[BaseModel]] = [
    Column("ID", lambda b: b.id),
    Column("NAME", lambda b: b.name, 30),
    Column("ARCHITECTURE", lambda b: b.architecture),
    Column("INPUT", lambda b: b.input_shape),
    Column("OUTPUTS", lambda b: b.n_outputs),
    Column("SOURCE", lambda b: b.source, 40),
]


def _base_model_block(b: BaseModel) -> str:
    return key_values(
        [
            ("id", b.id),
            ("name", b.name),
            ("architecture", b.architecture),
            *(
                [("format", b.format), ("class", b.model_class), ("parameters", b.parameter_count)]
                if b.format == "hf"
                else []
            ),
            ("params", b.params),
            ("input shape", b.input_shape),
            ("outputs", b.n_outputs),
            ("source", b.source),
            ("sha256", b.sha256),
            ("size (bytes)", b.size_bytes),
            ("created", b.created_at),
        ]
    )


@click.group("base-models")
def base_models() -> None:
    """Public pretrained weights to start jobs from (model.init)."""


@base_models.command("upload")
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--name", help="default: the file name without its suffix")
@click.option("--architecture", required=True, help="the zoo model the weights belong to (see `privtrain models`)")
@click.option(
    "--model-param",
    "model_params",
    multiple=True,
    help="architecture parameter key=value (repeatable; values read as JSON)",
)
@click.option("--input-shape", required=True, help="the model's input shape, comma-separated (e.g. 64 or 1,28,28)")
@click.option("--n-outputs", type=click.IntRange(min=1), required=True, help="the model's outputs (classes, or 1)")
@click.option("--source", help="where the weights came from (shown in every report built on them)")
@json_flag
def base_models_upload(
    path: Path,
    name: str | None,
    architecture: str,
    model_params: Sequence[str],
    input_shape: str,
    n_outputs: int,
    source: str | None,
) -> None:
    """Upload a safetensors file of public pretrained weights; the server checks every tensor's
    name, dtype and shape against the architecture (nothing is unpickled)."""
    try:
        params = dict(parse_assignment(v) for v in model_params)
        shape = [int(part) for part in input_shape.split(",")]
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    base = (
        current_state()
        .client()
        .upload_base_model(
            path,
            name=name or path.stem,
            architecture=architecture,
            params=params,
            input_shape=shape,
            n_outputs=n_outputs,
            source=source,
        )
    )
    emit(base, lambda: _base_model_block(base))


@base_models.command("upload-hf")
@click.argument("path", type=click.Path(exists=True, path_type=Path))
@click.option("--name", help="default: the folder or file name")
@click.option(
    "--task",
    type=click.Choice(["sequence-classification", "causal-lm", "image-classification"]),
    help="needed only when the checkpoint's class does not say it (a bare BertModel)",
)
@click.option("--source", help="where the weights came from (shown in every report built on them)")
@json_flag
def base_models_upload_hf(path: Path, name: str | None, task: str | None, source: str | None) -> None:
    """Upload a Hugging Face Transformers checkpoint: the folder save_pretrained wrote (config.json
    and safetensors weights), or its ZIP. Pickled weights (pytorch_model.bin) are refused: convert
    them with save_pretrained(folder, safe_serialization=True)."""
    base = current_state().client().upload_hf_base_model(path, name=name or path.stem, task=task, source=source)
    emit(base, lambda: _base_model_block(base))


@base_models.command("list")
@json_flag
def base_models_list() -> None:
    """Your base models, newest first."""
    found = current_state().client().list_base_models()
    emit(found, lambda: table(found, BASE_MODEL_COLUMNS))


@base_models.command("show")
@click.argument("base_model_id")
@json_flag
def base_models_show(base_model_id: str) -> None:
    """One base model: its architecture, parameters, digests and tokenizer."""
    base = current_state().client().get_base_model(base_model_id)
    emit(base, lambda: _base_model_block(base))


@base_models.command("delete")
@click.argument("base_model_id")
@json_flag
def base_models_delete(base_model_id: str) -> None:
    """Delete a base model (refused while a queued or running job starts from it)."""
    current_state().client().delete_base_model(base_model_id)
    emit({"deleted": base_model_id}, lambda: f"deleted {base_model_id}")
