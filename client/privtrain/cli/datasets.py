"""``privtrain datasets``: upload datasets and inspect their privacy budget and ledger."""

from __future__ import annotations

from pathlib import Path

import click

from privtrain.cli.figures import down, up
from privtrain.cli.sharing import datasets_grant, datasets_grants, datasets_revoke
from privtrain.cli.state import current_state, emit, json_flag
from privtrain.output import Column, key_values, table
from privtrain.resources import BudgetStatus, Dataset, LedgerEntry

DATASET_COLUMNS: list[Column[Dataset]] = [
    Column("ID", lambda d: d.id),
    Column("NAME", lambda d: d.name, 30),
    Column("ROWS", lambda d: d.n_rows if d.n_rows is not None else "withheld"),
    Column("FEATURES", lambda d: "x".join(map(str, d.feature_shape or []))),
    Column("TASK", lambda d: d.task),
    Column("CLASSES", lambda d: d.n_classes),
    Column("ε_G", lambda d: up(d.budget.epsilon) if d.budget is not None else "public"),
    Column("δ_G", lambda d: up(d.budget.delta) if d.budget is not None else "-"),
    Column("STATUS", lambda d: d.status or "active"),
    Column("CREATED", lambda d: d.created_at),
]

LEDGER_COLUMNS: list[Column[LedgerEntry]] = [
    Column("SEQ", lambda e: e.seq),
    Column("KIND", lambda e: e.kind),
    Column("JOB", lambda e: e.job_id),
    Column("ε", lambda e: up(e.epsilon)),
    Column("ACTOR", lambda e: e.actor, 30),
    Column("CREATED", lambda e: e.created_at),
    Column("HASH", lambda e: e.hash[:12]),
]


def _dataset_block(d: Dataset) -> str:
    return key_values(
        [
            ("id", d.id),
            ("name", d.name),
            ("format", d.format),
            ("rows", d.n_rows if d.n_rows is not None else "withheld by the owner (person-level dataset)"),
            *([("privacy unit", f"{d.privacy_unit} ({d.n_units} units)")] if d.privacy_unit_column else []),
            ("feature shape", d.feature_shape),
            *([("images (H, W, C)", d.image_shape)] if d.image_shape else []),
            *(
                [("tokenizer", d.tokenizer_id), ("vocabulary size", d.vocab_size), ("pad id", d.pad_id)]
                if d.tokenizer_id
                else []
            ),
            ("task", d.task),
            ("classes", _class_list(d)),
            ("label column", d.label_column),
            *(
                [("budget", "none: declared public by its owner (no ledger)")]
                if d.budget is None
                else [("budget ε_G", up(d.budget.epsilon)), ("budget δ_G", up(d.budget.delta))]
            ),
            ("sha256", d.sha256 or "(the owner's view only)"),
            ("content digest", d.content_digest or ("(not computed yet)" if d.sha256 else "(the owner's view only)")),
            ("size (bytes)", d.size_bytes if d.size_bytes is not None else "(the owner's view only)"),
            ("created", d.created_at),
            *_deletion_lines(d),
        ]
    )


def _deletion_lines(d: Dataset) -> list[tuple[str, object]]:
    if d.deletion is None:
        return []
    lines: list[tuple[str, object]] = [
        ("status", d.status),
        ("deletion asked", d.deletion.requested_at),
        ("models", d.deletion.models),
    ]
    if d.status == "deleted":
        lines.append(("erased", d.deletion.deleted_at))
    else:
        lines.append(("jobs still settling", d.deletion.jobs_settling))
        if d.deletion.models_pending:
            lines.append(("models in use elsewhere", d.deletion.models_pending))
    return lines


def _class_list(d: Dataset) -> str | None:
    if not d.classes:
        return None
    source = "declared" if d.classes_source == "declared" else "taken from the labels found"
    return f"{len(d.classes)}: {', '.join(d.classes)} ({source})"


def _budget_block(b: BudgetStatus) -> str:
    return key_values(
        [
            ("dataset", b.dataset_id),
            ("budget ε_G", up(b.epsilon)),
            ("budget δ_G", up(b.delta)),
            ("committed ε", up(b.committed_epsilon)),
            ("reserved ε", up(b.reserved_epsilon)),
            ("spent ε", up(b.spent_epsilon)),
            ("remaining ε", down(b.remaining_epsilon)),
            ("ledger entries", b.entries),
            ("last hash", b.last_hash),
        ]
    )


@click.group()
def datasets() -> None:
    """Upload datasets and inspect their privacy budget and ledger."""


@datasets.command("upload")
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--name", help="default: the file name without its suffix")
@click.option("--epsilon", type=float, help="the dataset's total budget ε_G (required unless --public)")
@click.option("--delta", type=float, help="the dataset's δ_G, below 1/n (required unless --public)")
@click.option(
    "--public",
    is_flag=True,
    help="declare the dataset public: no budget, no ledger, sgd/adam allowed (give no --epsilon/--delta)",
)
@click.option("--format", "fmt", type=click.Choice(["csv", "npz", "zip", "jsonl"]), help="default: from the suffix")
@click.option("--label-column", default="label", show_default=True, help="CSV label column")
@click.option(
    "--task",
    type=click.Choice(["classification", "regression", "language-model"]),
    help="default: inferred by the server (jsonl: classification when the records carry a label)",
)
@click.option(
    "--classes",
    help="the public class list, comma-separated; labels are matched by name "
    "(never shifted); default: the labels found become public",
)
@click.option(
    "--preparation",
    help="public data preparation as JSON, or @FILE holding it: "
    '{"drop": ["id"], "one_hot": {"sex": ["f", "m"]}, "scale": {"age": {"bounds": [0, 120]}}}',
)
@click.option(
    "--image-size",
    help="resize every image of a ZIP to HxW (e.g. 32x32) or to one side (28); default: all share one size",
)
@click.option("--channels", type=click.IntRange(1, 3), help="convert every image to 1 (grey) or 3 (RGB) channels")
@click.option(
    "--modality",
    type=click.Choice(["image", "tabular", "text"]),
    help="default: zip is image; jsonl is text; npz is image when X is uint8 (n, H, W) or (n, H, W, C)",
)
@click.option(
    "--tokenizer", help='jsonl: "byte" (built in; the server\'s default), a tokenizer id, or base:<base_model_id>'
)
@click.option("--max-length", type=click.IntRange(min=1), help="jsonl: tokens kept per row (server default: 128)")
@click.option("--text-field", help='jsonl: the member holding the text (default "text")')
@click.option("--label-field", help='jsonl: the member holding the label (default "label"; absent: language model)')
@click.option(
    "--privacy-unit-column",
    help="csv: the column naming the person each row belongs to (e.g. patient_id): the guarantee becomes per "
    "person, jobs sample persons; never a feature (docs/privacy-units.md)",
)
@click.option(
    "--n-rows-public",
    is_flag=True,
    help="with --privacy-unit-column: show the exact row count to analysts too (by default the owner's only: it "
    "changes by a removed person's row count)",
)
@json_flag
def datasets_upload(
    path: Path,
    name: str | None,
    epsilon: float | None,
    delta: float | None,
    public: bool,
    fmt: str | None,
    label_column: str,
    task: str | None,
    classes: str | None,
    preparation: str | None,
    image_size: str | None,
    channels: int | None,
    modality: str | None,
    tokenizer: str | None,
    max_length: int | None,
    text_field: str | None,
    label_field: str | None,
    privacy_unit_column: str | None,
    n_rows_public: bool,
) -> None:
    """Upload a CSV (header + label column), NPZ (X, y), ZIP (class folders of PNG/JPEG
    images) or JSON Lines (texts, tokenised at upload) file with its budget.

    The same rows can be registered once (whatever their line endings or the order of rows and
    columns): a second upload is refused and names the dataset that holds them (raise its budget
    instead, or delete it and upload again). Rows of a dataset you deleted continue its ledger.
    """
    if public and (epsilon is not None or delta is not None):
        raise click.UsageError("a public dataset has no budget: leave out --epsilon and --delta with --public")
    if not public and (epsilon is None or delta is None):
        raise click.UsageError("give --epsilon and --delta (the dataset's budget), or --public")
    if preparation is not None and preparation.startswith("@"):
        try:
            preparation = Path(preparation[1:]).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise click.UsageError(f"--preparation {preparation}: {exc}") from None
    try:
        dataset = (
            current_state()
            .client()
            .upload_dataset(
                path,
                name=name,
                epsilon=epsilon,
                delta=delta,
                public=public,
                format=fmt,
                label_column=label_column,
                task=task,
                classes=classes.split(",") if classes is not None else None,
                preparation=preparation,
                modality=modality,
                image_size=_cli_image_size(image_size),
                channels=channels,
                tokenizer=tokenizer,
                max_length=max_length,
                text_field=text_field,
                label_field=label_field,
                privacy_unit_column=privacy_unit_column,
                n_rows_public=n_rows_public,
            )
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    notices = [str(n) for n in dataset.raw.get("notices", [])]
    emit(dataset, lambda: "\n".join([_dataset_block(dataset), *(f"note: {n}" for n in notices)]))


def _cli_image_size(text: str | None) -> int | tuple[int, int] | None:
    """--image-size 28 or 32x24 (height x width), checked before anything is sent."""
    if text is None:
        return None
    parts = text.lower().split("x")
    if len(parts) not in (1, 2) or not all(part.strip().isdigit() for part in parts):
        raise click.UsageError(f"--image-size {text!r}: give HxW (e.g. 32x32) or one side (e.g. 28)")
    sides = [int(part) for part in parts]
    return sides[0] if len(sides) == 1 else (sides[0], sides[1])


@datasets.command("list")
@click.option("--include-deleted", is_flag=True, help="also list your deleted datasets (tombstones with their ledger)")
@json_flag
def datasets_list(include_deleted: bool) -> None:
    """All your datasets, newest first."""
    found = current_state().client().list_datasets(include_deleted=include_deleted)
    emit(found, lambda: table(found, DATASET_COLUMNS))


@datasets.command("delete")
@click.argument("dataset_id")
@click.option(
    "--delete-models",
    is_flag=True,
    help="also erase the models of the dataset's jobs (every submitter's); their reports are kept",
)
@click.option("--yes", "-y", is_flag=True, help="do not ask for confirmation")
@json_flag
def datasets_delete(dataset_id: str, delete_models: bool, yes: bool) -> None:
    """Delete a dataset you own: its grants end, its jobs stop (what they ran is committed), then its
    rows, arrays and the jobs' checkpoints are erased. Its ledger stays, and uploading the same rows
    again continues it."""
    client = current_state().client()
    if not yes:
        dataset = client.get_dataset(dataset_id)
        models = "and the models of its jobs " if delete_models else ""
        click.confirm(
            f"Delete dataset {dataset.id} ({dataset.name!r}): stop its jobs and erase its rows {models}"
            "for good? Its ledger is kept",
            abort=True,
            err=True,
        )
    deleted = client.delete_dataset(dataset_id, delete_models=delete_models)

    def human() -> str:
        block = _dataset_block(deleted)
        if deleted.status == "deleted":
            return block + "\nnote: the rows are erased; the ledger is kept (privtrain datasets ledger ID)"
        return block + (
            "\nnote: deletion in progress: its jobs are stopping; the rows are erased once they have settled "
            "(privtrain datasets show ID to follow it)"
        )

    emit(deleted, human)


@datasets.command("show")
@click.argument("dataset_id")
@json_flag
def datasets_show(dataset_id: str) -> None:
    """One dataset: its shape, task, classes, privacy unit and budget."""
    dataset = current_state().client().get_dataset(dataset_id)
    emit(dataset, lambda: _dataset_block(dataset))


@datasets.command("budget")
@click.argument("dataset_id")
@json_flag
def datasets_budget(dataset_id: str) -> None:
    """ε_G, δ_G, committed, reserved and remaining ε."""
    budget = current_state().client().get_budget(dataset_id)
    emit(budget, lambda: _budget_block(budget))


@datasets.command("raise-budget")
@click.argument("dataset_id")
@click.option("--epsilon", type=float, required=True, help="the new (larger) ε_G")
@click.option("--delta", type=float, help="the new δ_G (default: unchanged)")
@click.option("--reason", default="", help="recorded in the ledger's ADJUST entry")
@json_flag
def datasets_raise_budget(dataset_id: str, epsilon: float, delta: float | None, reason: str) -> None:
    """Raise the budget (owner only, upwards only; recorded in the ledger)."""
    budget = current_state().client().raise_budget(dataset_id, epsilon=epsilon, delta=delta, reason=reason)
    emit(budget, lambda: _budget_block(budget))


@datasets.command("ledger")
@click.argument("dataset_id")
@json_flag
def datasets_ledger(dataset_id: str) -> None:
    """The append-only, hash-chained ledger entries, oldest first."""
    entries = current_state().client().list_ledger(dataset_id)

    def human() -> str:
        # In words below the table: a RELEASE returns budget, it is not a second charge.
        said = [f"#{e.seq}  {e.raw['explanation']}" for e in entries if e.raw.get("explanation")]
        return table(entries, LEDGER_COLUMNS) + ("\n\nwhat happened\n" + "\n".join(said) if said else "")

    emit(entries, human)


for _shared in (datasets_grant, datasets_grants, datasets_revoke):
    datasets.add_command(_shared)
