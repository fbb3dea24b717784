"""``privtrain``: the user CLI on top of :class:`privtrain.Client`.

Human tables by default, ``--json`` for scripts (the server's objects, unchanged). Exit codes:
0 ok, 1 API error (the problem's title and detail on stderr; also a watched job that did not
succeed), 2 usage error. Server administration stays in ``privtrain-admin``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import click
import httpx

from privtrain import __version__
from privtrain.client import DEFAULT_URL, Client
from privtrain.errors import PrivtrainError
from privtrain.events import ProgressSource, poll_progress
from privtrain.output import Column, key_values, table, to_json
from privtrain.resources import (
    Algorithm,
    BaseModel,
    BudgetStatus,
    Dataset,
    Estimate,
    Grant,
    Invitation,
    Job,
    JobEvent,
    LedgerEntry,
    ModelInfo,
    Resource,
    Tokenizer,
    TuningJob,
)
from privtrain.retry import RetryNotice
from privtrain.specs import SpecFileError, SpecOverrides, load_spec_file, merge_spec, parse_assignment
from privtrain.sse import sse_progress
from privtrain_common.directed_rounding import format_guarantee, format_remaining

F = TypeVar("F", bound=Callable[..., Any])
ResourceT = TypeVar("ResourceT", bound=Resource)

EXIT_API_ERROR = 1


@dataclass
class CliEnvironment:
    """What a test (or an embedding program) injects through ``main(obj=...)``."""

    transport: httpx.BaseTransport | None = None
    progress_source: ProgressSource = poll_progress


@dataclass
class CliState:
    url: str
    api_key: str | None
    json_output: bool
    timeout: float
    environment: CliEnvironment
    _client: Client | None = field(default=None, repr=False)

    def client(self) -> Client:
        if self._client is None:
            if not self.api_key:
                raise click.UsageError("no API key: pass --api-key or set PRIVTRAIN_API_KEY")
            self._client = Client(
                self.url,
                self.api_key,
                timeout=self.timeout,
                transport=self.environment.transport,
                on_retry=_say_retry,
            )
        return self._client


def _up(value: float | None) -> str | None:
    """A guarantee (ε or δ spent, charged, reserved, committed) for a table: rounded toward +∞ so
    it never reads smaller than it is; None stays None (shown as '-')."""
    return None if value is None else format_guarantee(value)


def _down(value: float | None) -> str | None:
    """A remaining budget for a table: rounded toward −∞ so it never reads larger than it is."""
    return None if value is None else format_remaining(value)


def _say_retry(notice: RetryNotice) -> None:
    click.echo(
        f"{notice.reason} on {notice.method} {notice.path}; retry {notice.attempt} in {notice.delay:g} s",
        err=True,
    )


def _state() -> CliState:
    return click.get_current_context().find_object(CliState)  # type: ignore[return-value]


def _wants_json() -> bool:
    return _state().json_output


def _mark_json(ctx: click.Context, _param: click.Parameter, value: bool) -> bool:
    """``--json`` after a subcommand means the same as before it (errors included)."""
    state = ctx.find_object(CliState)
    if value and state is not None:
        state.json_output = True
    return value


json_flag = click.option(
    "--json",
    is_flag=True,
    expose_value=False,
    callback=_mark_json,
    is_eager=True,
    help="print the server's JSON instead of a table",
)


def emit(value: Resource | list[ResourceT] | dict[str, Any] | list[dict[str, Any]], human: Callable[[], str]) -> None:
    """JSON (raw server objects) for scripts, else the human rendering."""
    if _wants_json():
        click.echo(to_json(_raw(value)))
    else:
        click.echo(human())


def _raw(value: Any) -> Any:
    if isinstance(value, Resource):
        return value.raw
    if isinstance(value, list):
        return [_raw(v) for v in value]
    return value


PROBLEM_HINTS: dict[str, Callable[[dict[str, Any]], str]] = {
    "/problems/dataset-already-registered": lambda extra: (
        f"hint: privtrain datasets raise-budget {extra.get('existing_dataset_id', 'DATASET_ID')} "
        "--epsilon NEW_EPSILON --reason '…'\n"
        f"  or, to replace the upload: privtrain datasets delete {extra.get('existing_dataset_id', 'DATASET_ID')} "
        "and upload again (its ledger continues)"
    ),
}
"""What to type next, for problems whose way out is another CLI command."""


def report_error(error: PrivtrainError, *, as_json: bool) -> None:
    """The problem's title and detail (plus its type and extra members) on stderr."""
    if as_json and error.problem:
        click.echo(to_json(error.problem), err=True)
        return
    status = f" ({error.status})" if error.status else ""
    click.echo(f"Error: {error.title}{status}: {error.detail}", err=True)
    if error.type:
        click.echo(f"  type: {error.type}", err=True)
    for key, value in error.extra.items():
        if key != "errors":
            click.echo(f"  {key}: {value}", err=True)
    for item in error.extra.get("errors", []) or []:
        if isinstance(item, dict):
            click.echo(f"  - {'.'.join(map(str, item.get('loc', [])))}: {item.get('msg', '')}", err=True)
    hint = PROBLEM_HINTS.get(error.type or "")
    if hint is not None:
        click.echo(hint(dict(error.extra)), err=True)


class ApiErrorGroup(click.Group):
    """Turns client exceptions into exit code 1 with the problem on stderr (usage errors stay 2)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except PrivtrainError as error:
            state = ctx.find_object(CliState)
            report_error(error, as_json=bool(state and state.json_output))
            ctx.exit(EXIT_API_ERROR)
        finally:
            state = ctx.find_object(CliState)
            if state is not None and state._client is not None:
                state._client.close()


@click.group(cls=ApiErrorGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--url", envvar="PRIVTRAIN_URL", default=DEFAULT_URL, show_default=True, help="service URL [env PRIVTRAIN_URL]"
)
@click.option("--api-key", envvar="PRIVTRAIN_API_KEY", help="API key [env PRIVTRAIN_API_KEY]")
@click.option("--json", "json_output", is_flag=True, help="JSON output for every command")
@click.option(
    "--request-timeout",
    "timeout",
    type=click.FloatRange(min=0.1),
    default=30.0,
    show_default=True,
    help="per-request timeout (s)",
)
@click.version_option(__version__, prog_name="privtrain")
@click.pass_context
def cli(ctx: click.Context, url: str, api_key: str | None, json_output: bool, timeout: float) -> None:
    """Train models with differential privacy on a privtrain service."""
    environment = ctx.obj if isinstance(ctx.obj, CliEnvironment) else CliEnvironment()
    ctx.obj = CliState(url=url, api_key=api_key, json_output=json_output, timeout=timeout, environment=environment)


# ---------------------------------------------------------------------- datasets

DATASET_COLUMNS: list[Column[Dataset]] = [
    Column("ID", lambda d: d.id),
    Column("NAME", lambda d: d.name, 30),
    Column("ROWS", lambda d: d.n_rows if d.n_rows is not None else "withheld"),
    Column("FEATURES", lambda d: "x".join(map(str, d.feature_shape or []))),
    Column("TASK", lambda d: d.task),
    Column("CLASSES", lambda d: d.n_classes),
    Column("ε_G", lambda d: _up(d.budget.epsilon) if d.budget is not None else "public"),
    Column("δ_G", lambda d: _up(d.budget.delta) if d.budget is not None else "-"),
    Column("STATUS", lambda d: d.status or "active"),
    Column("CREATED", lambda d: d.created_at),
]

LEDGER_COLUMNS: list[Column[LedgerEntry]] = [
    Column("SEQ", lambda e: e.seq),
    Column("KIND", lambda e: e.kind),
    Column("JOB", lambda e: e.job_id),
    Column("ε", lambda e: _up(e.epsilon)),
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
                else [("budget ε_G", _up(d.budget.epsilon)), ("budget δ_G", _up(d.budget.delta))]
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
            ("budget ε_G", _up(b.epsilon)),
            ("budget δ_G", _up(b.delta)),
            ("committed ε", _up(b.committed_epsilon)),
            ("reserved ε", _up(b.reserved_epsilon)),
            ("spent ε", _up(b.spent_epsilon)),
            ("remaining ε", _down(b.remaining_epsilon)),
            ("ledger entries", b.entries),
            ("last hash", b.last_hash),
        ]
    )


@cli.group()
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
@click.option("--tokenizer", help='jsonl: "byte" (built in; the server\'s default) or a tokenizer id')
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
            _state()
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
    found = _state().client().list_datasets(include_deleted=include_deleted)
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
    client = _state().client()
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
    dataset = _state().client().get_dataset(dataset_id)
    emit(dataset, lambda: _dataset_block(dataset))


@datasets.command("budget")
@click.argument("dataset_id")
@json_flag
def datasets_budget(dataset_id: str) -> None:
    """ε_G, δ_G, committed, reserved and remaining ε."""
    budget = _state().client().budget(dataset_id)
    emit(budget, lambda: _budget_block(budget))


@datasets.command("raise-budget")
@click.argument("dataset_id")
@click.option("--epsilon", type=float, required=True, help="the new (larger) ε_G")
@click.option("--delta", type=float, help="the new δ_G (default: unchanged)")
@click.option("--reason", default="", help="recorded in the ledger's ADJUST entry")
@json_flag
def datasets_raise_budget(dataset_id: str, epsilon: float, delta: float | None, reason: str) -> None:
    """Raise the budget (owner only, upwards only; recorded in the ledger)."""
    budget = _state().client().raise_budget(dataset_id, epsilon=epsilon, delta=delta, reason=reason)
    emit(budget, lambda: _budget_block(budget))


@datasets.command("ledger")
@click.argument("dataset_id")
@json_flag
def datasets_ledger(dataset_id: str) -> None:
    """The append-only, hash-chained ledger entries, oldest first."""
    entries = _state().client().ledger(dataset_id)

    def human() -> str:
        # In words below the table: a RELEASE returns budget, it is not a second charge.
        said = [f"#{e.seq}  {e.raw['explanation']}" for e in entries if e.raw.get("explanation")]
        return table(entries, LEDGER_COLUMNS) + ("\n\nwhat happened\n" + "\n".join(said) if said else "")

    emit(entries, human)


# ---------------------------------------------------------------------- sharing

GRANT_COLUMNS: list[Column[Grant]] = [
    Column("TENANT", lambda g: g.tenant, 30),
    Column("STATUS", lambda g: g.status),
    Column("INVITED", lambda g: g.granted_at),
    Column("BY", lambda g: g.granted_by, 30),
    Column("ACCEPTED", lambda g: g.accepted_at),
    Column("DECLINED", lambda g: g.declined_at),
    Column("REVOKED", lambda g: g.revoked_at),
]

INVITATION_COLUMNS: list[Column[Invitation]] = [
    Column("ID", lambda i: i.id),
    Column("DATASET", lambda i: i.dataset_name, 30),
    Column("OWNER", lambda i: i.owner, 30),
    Column("ε_G", lambda i: _up(i.budget.epsilon) if i.budget is not None else "public"),
    Column("δ_G", lambda i: _up(i.budget.delta) if i.budget is not None else "-"),
    Column("INVITED", lambda i: i.invited_at),
]


def _grant_block(g: Grant) -> str:
    return key_values(
        [
            ("dataset", g.dataset_id),
            ("tenant", g.tenant),
            ("status", g.status),
            ("invited", g.granted_at),
            ("invited by", g.granted_by),
            ("accepted", g.accepted_at),
            ("declined", g.declined_at),
            ("revoked", g.revoked_at),
            ("revoked by", g.revoked_by),
        ]
    )


def _invitation_block(i: Invitation) -> str:
    return key_values(
        [
            ("id", i.id),
            ("dataset", i.dataset_name),
            ("owner", i.owner),
            ("status", i.status),
            *(
                [("budget", "none: declared public by its owner")]
                if i.budget is None
                else [("budget ε_G", _up(i.budget.epsilon)), ("budget δ_G", _up(i.budget.delta))]
            ),
            ("invited", i.invited_at),
            ("accepted", i.accepted_at),
            ("declined", i.declined_at),
        ]
    )


@datasets.command("grant")
@click.argument("dataset_id")
@click.argument("tenant")
@json_flag
def datasets_grant(dataset_id: str, tenant: str) -> None:
    """Invite TENANT (by name) to analyse your dataset; it has access once it accepts.

    The answer is the same whether or not a tenant of that name exists; inviting again shows
    the pending invitation or active grant.
    """
    grant = _state().client().grant(dataset_id, tenant)
    hint = f"note: access starts when {tenant} runs: privtrain invitations accept {dataset_id}"
    emit(grant, lambda: _grant_block(grant) + ("\n" + hint if grant.status == "invited" else ""))


@datasets.command("grants")
@click.argument("dataset_id")
@json_flag
def datasets_grants(dataset_id: str) -> None:
    """Every invitation and grant of your dataset, oldest first (the audit trail)."""
    found = _state().client().grants(dataset_id)
    emit(found, lambda: table(found, GRANT_COLUMNS))


@datasets.command("revoke")
@click.argument("dataset_id")
@click.argument("tenant")
@json_flag
def datasets_revoke(dataset_id: str, tenant: str) -> None:
    """Revoke TENANT's access, or withdraw its pending invitation (it keeps its past jobs)."""
    grant = _state().client().revoke_grant(dataset_id, tenant)
    emit(grant, lambda: _grant_block(grant))


@cli.group()
def invitations() -> None:
    """Invitations other tenants sent you: accept one to analyse their dataset."""


@invitations.command("list")
@json_flag
def invitations_list() -> None:
    """Pending invitations addressed to you, newest first."""
    found = _state().client().invitations()
    emit(found, lambda: table(found, INVITATION_COLUMNS))


@invitations.command("accept")
@click.argument("invitation_id")
@json_flag
def invitations_accept(invitation_id: str) -> None:
    """Accept: the dataset appears in `privtrain datasets list` and you may submit jobs on it."""
    invitation = _state().client().accept_invitation(invitation_id)
    emit(invitation, lambda: _invitation_block(invitation))


@invitations.command("decline")
@click.argument("invitation_id")
@json_flag
def invitations_decline(invitation_id: str) -> None:
    """Decline (the owner sees it declined and may invite you again)."""
    invitation = _state().client().decline_invitation(invitation_id)
    emit(invitation, lambda: _invitation_block(invitation))


# ---------------------------------------------------------------------- job specs from flags

_SPEC_KEY = "privtrain.spec"


def _collect(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """Store a spec option in ``ctx.meta`` so estimate and submit share one option set."""
    ctx.meta.setdefault(_SPEC_KEY, {})[param.name] = value
    return value


def _assignments(ctx: click.Context, param: click.Parameter, values: Sequence[str]) -> dict[str, Any]:
    try:
        parsed = dict(parse_assignment(v) for v in values)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param) from None
    _collect(ctx, param, parsed)
    return parsed


def _spec_option(
    *decls: str,
    type: click.ParamType[Any, Any] | type | None = None,
    multiple: bool = False,
    callback: Callable[[click.Context, click.Parameter, Any], Any] = _collect,
    help: str | None = None,
) -> Callable[[F], F]:
    return click.option(*decls, type=type, multiple=multiple, expose_value=False, callback=callback, help=help)


def _with(options: Sequence[Callable[[F], F]]) -> Callable[[F], F]:
    """Apply a shared list of click options (in the order listed in --help)."""

    def apply(command: F) -> F:
        for option in reversed(options):
            command = option(command)
        return command

    return apply


SPEC_OPTIONS = [
    _spec_option(
        "--spec",
        "spec_file",
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        help="job spec as JSON or YAML; the flags below override its fields",
    ),
    _spec_option("--dataset", "dataset_id", help="dataset id"),
    _spec_option("--model", help="model name (see `privtrain models`)"),
    _spec_option(
        "--model-param",
        "model_params",
        multiple=True,
        callback=_assignments,
        help="model parameter key=value (repeatable; values read as JSON)",
    ),
    _spec_option("--algorithm", help="algorithm name (see `privtrain algorithms`)"),
    _spec_option(
        "--hyper",
        "hyperparameters",
        multiple=True,
        callback=_assignments,
        help="hyperparameter key=value (repeatable; values read as JSON)",
    ),
    _spec_option("--target-epsilon", type=float, help="ε to spend; the server calibrates σ"),
    _spec_option("--noise-multiplier", type=float, help="fix σ instead of a target ε"),
    _spec_option("--delta", type=float, help="δ (default: the dataset's)"),
    _spec_option("--epochs", type=float),
    _spec_option("--steps", type=int),
    _spec_option("--batch-size", type=int, help="expected batch size q·n"),
    _spec_option("--lr", "learning_rate", type=float, help="learning rate"),
    _spec_option("--init-job", help="model.init: start from this succeeded job's model"),
    _spec_option("--init-base-model", help="model.init: start from this base model (bm_...)"),
    _spec_option(
        "--finetune",
        type=click.Choice(["full", "head", "last_k_blocks", "lora"]),
        help="with an init: which parameters train (default full)",
    ),
    _spec_option("--finetune-k", type=int, help="k of --finetune last_k_blocks"),
    _spec_option("--lora-rank", type=click.IntRange(1, 256), help="rank of the adapters of --finetune lora"),
    _spec_option("--lora-alpha", type=float, help="alpha of --finetune lora: the update is scaled by alpha/rank"),
    _spec_option(
        "--token-loss",
        type=click.Choice(["mean", "sum"]),
        help="language-model datasets: a row's loss is the mean (default) or sum of its token losses",
    ),
    _spec_option(
        "--augmult",
        type=click.IntRange(1, 32),
        help="image datasets: K augmented views (crop, flip) per sampled image, gradients averaged; same ε",
    ),
    _spec_option(
        "--rows-per-unit",
        type=click.IntRange(1, 64),
        help="datasets with a privacy unit column: rows averaged per sampled person before clipping "
        "(default 4); same ε",
    ),
    _spec_option(
        "--precision",
        type=click.Choice(["fp32", "bf16"]),
        help="bf16: mixed precision (faster on GPUs with bf16 tensor cores); norms, clipping, noise stay fp32; same ε",
    ),
    _spec_option(
        "--queue",
        help="the worker queue to run on (one the service offers, e.g. gpu-h100); default: by the model's size",
    ),
]


def spec_from_context(ctx: click.Context) -> dict[str, Any]:
    given = dict(ctx.meta.get(_SPEC_KEY, {}))
    spec_file = given.pop("spec_file", None)
    try:
        base = load_spec_file(spec_file) if spec_file else None
    except SpecFileError as exc:
        raise click.UsageError(str(exc)) from None
    if base is None and not any(v for v in given.values()):
        raise click.UsageError("give a job spec: --spec FILE and/or --dataset, --model, --algorithm, ...")
    return merge_spec(base, SpecOverrides(**{k: v for k, v in given.items() if v is not None}))


# ---------------------------------------------------------------------- jobs


def _job_epsilon(j: Job) -> tuple[float, str | None]:
    """The job's one ε and its basis: committed once it ended, reserved while it runs (the
    server decides; a server without ``epsilon`` gives the reservation and no basis)."""
    raw = j.raw
    if raw.get("epsilon") is None:
        return j.epsilon_reserved, None
    return float(raw["epsilon"]), str(raw.get("epsilon_basis") or "reserved")


JOB_COLUMNS: list[Column[Job]] = [
    Column("ID", lambda j: j.id),
    Column("STATUS", lambda j: j.status),
    Column("ALGORITHM", lambda j: j.algorithm),
    Column("MODEL", lambda j: j.model),
    Column("DATASET", lambda j: j.dataset_id),
    Column("STEPS", lambda j: f"{j.steps_run}/{j.steps_planned}"),
    Column("ε", lambda j: _up(_job_epsilon(j)[0])),
    Column("BASIS", lambda j: _job_epsilon(j)[1]),
    Column("CREATED", lambda j: j.created_at),
]

METRIC_COLUMNS: list[Column[dict[str, Any]]] = [
    Column("METRIC", lambda m: m.get("metric")),
    Column("RELEASED", lambda m: m.get(str(m.get("metric")))),
    Column("95% INTERVAL", lambda m: _interval_text(m.get("interval"))),
    Column("NOISE SCALE", lambda m: m.get("noise_scale")),
    Column("MECHANISM", lambda m: m.get("mechanism")),
    Column("CLAMPED", lambda m: m.get("clamped")),
]
"""A released DP metric beside its noise scale and interval (not privacy figures: 4 digits)."""


def _metric_rows(metrics: dict[str, Any]) -> list[dict[str, Any]]:
    """The released metric, then the values released beside it in its shape (perplexity: the mean token loss)."""
    also = metrics.get("also_released")
    return [metrics, *(row for row in also if isinstance(row, dict))] if isinstance(also, list) else [metrics]


def _interval_text(interval: object) -> str | None:
    if not isinstance(interval, dict):
        return None
    return f"[{float(interval['low']):.4g}, {float(interval['high']):.4g}]"


EVENT_COLUMNS: list[Column[JobEvent]] = [
    Column("SEQ", lambda e: e.seq),
    Column("KIND", lambda e: e.kind),
    Column("CREATED", lambda e: e.created_at),
    Column("PAYLOAD", lambda e: e.payload, 80),
]


ESTIMATE_EPSILONS_NOTE = (
    "remaining ε is what a plain Gaussian job could still get; the largest target ε is what this "
    "spec's own curve fits into the same room"
)


def _or_reason(value: str | int | None, reason: object) -> object:
    """A choice the server computed, or why it could not (servers before these fields: '-')."""
    return value if value is not None else reason


def _init_chain_rows(e: Estimate) -> list[tuple[str, object]]:
    """The estimate's warning that the job would use the same rows again (``init_chain``)."""
    chain = e.init_chain
    if not chain:
        return []
    rows: list[tuple[str, object]] = []
    if chain.get("epsilon_composed_ledger") is not None:
        rows.append(
            (
                f"ε of the released model (with {chain['earlier_jobs_on_this_data']} earlier job(s) on these rows)",
                _up(chain["epsilon_composed_ledger"]),
            )
        )
    return [*rows, ("init chain", chain.get("notice"))]


def _estimate_block(e: Estimate) -> str:
    # Newer fields come from ``raw``, so this CLI also prints estimates of older servers.
    raw = e.raw
    if raw.get("public_dataset"):
        return key_values(
            [
                ("dataset", "public: no budget, nothing is charged, no privacy guarantee"),
                ("noise multiplier σ", e.noise_multiplier),
                ("sampling probability q", e.sampling_probability),
                ("steps", e.steps),
                *_init_chain_rows(e),
            ]
        )
    differ = _down(e.budget_remaining_epsilon) != _down(e.largest_admissible_epsilon)
    return key_values(
        [
            ("noise multiplier σ", e.noise_multiplier),
            ("sampling probability q", e.sampling_probability),
            ("steps", e.steps),
            ("noise std on the sum", e.noise_std_on_sum),
            ("sensitivity", e.sensitivity),
            (f"ε reserved at δ={_up(e.delta)}", _up(e.epsilon_reserved)),
            (f"ε (single job, {e.epsilon_single_job_method or 'tightest'})", _up(e.epsilon_single_job)),
            ("ε of the evaluation", _up(e.evaluation_epsilon)),
            ("admissible now", e.admissible),
            ("budget remaining ε", _down(e.budget_remaining_epsilon)),
            ("budget remaining ε after this job", _down(raw.get("budget_remaining_after_epsilon"))),
            ("largest admissible target ε", _down(e.largest_admissible_epsilon)),
            (
                "largest admissible steps at this σ",
                _or_reason(raw.get("largest_admissible_steps"), raw.get("largest_admissible_steps_reason")),
            ),
            (
                "smallest admissible σ at these steps",
                _or_reason(
                    _up(raw.get("smallest_admissible_noise_multiplier")),
                    raw.get("smallest_admissible_noise_multiplier_reason"),
                ),
            ),
            *([("remaining ε vs largest target ε", ESTIMATE_EPSILONS_NOTE)] if differ else []),
            *_init_chain_rows(e),
        ]
    )


def _single_job_is_for_epsilon(j: Job) -> bool:
    """Whether the job's single-job ε is of what its ε counts: always from a server that names it
    ``epsilon_single_job``; a server before that sent a cancelled or failed job's planned run's."""
    return "epsilon_single_job" in j.raw or j.status not in ("cancelled", "failed")


def _job_block(j: Job) -> str:
    """Key/values, then the released metrics as a table. A finished job states the ε it committed
    (a stopped-early or cancelled job committed less than it reserved), a running one its reservation."""
    epsilon, basis = _job_epsilon(j)
    label = f"ε {basis or '(ledger)'} at δ={_up(j.delta)}"
    released = basis == "committed" and j.steps_run < j.steps_planned
    block = key_values(
        [
            ("id", j.id),
            ("status", j.status),
            ("dataset", j.dataset_id),
            ("algorithm", j.algorithm),
            ("model", j.model),
            ("queue", j.queue),
            ("steps", f"{j.steps_run}/{j.steps_planned}"),
            ("noise multiplier σ", j.noise_multiplier),
            (label, _up(epsilon)),
            *([("rest of the reservation", "released to the budget")] if released else []),
            *([("ε (single job, tightest)", _up(j.epsilon_single_job))] if _single_job_is_for_epsilon(j) else []),
            ("attempt", j.attempt),
            ("cancel requested", j.cancel_requested),
            ("error", j.error_code),
            ("created", j.created_at),
            ("started", j.started_at),
            ("finished", j.finished_at),
        ]
    )
    if not j.metrics:
        return block
    return f"{block}\n\nreleased DP metrics\n{table(_metric_rows(j.metrics), METRIC_COLUMNS)}"


@cli.group()
def jobs() -> None:
    """Price, submit, watch, cancel and download training jobs."""


@jobs.command("estimate")
@_with(SPEC_OPTIONS)
@json_flag
@click.pass_context
def jobs_estimate(ctx: click.Context) -> None:
    """Dry run: the noise, steps and ε a job would be charged, and whether it fits now."""
    estimate = _state().client().estimate(spec_from_context(ctx))
    emit(estimate, lambda: _estimate_block(estimate))


def _watch(job_id: str, *, poll_interval: float, timeout: float | None, quiet: bool, sse: bool) -> Job:
    state = _state()
    return state.client().wait(
        job_id,
        timeout=timeout,
        poll_interval=poll_interval,
        progress=not quiet,
        progress_source=sse_progress if sse else state.environment.progress_source,
    )


def _finish_watch(job: Job) -> None:
    emit(job, lambda: _job_block(job))
    if job.status != "succeeded":
        reason = f" ({job.error_code})" if job.error_code else ""
        click.echo(f"Error: job {job.id} {job.status}{reason}", err=True)
        click.get_current_context().exit(EXIT_API_ERROR)


watch_options = [
    click.option(
        "--interval",
        "poll_interval",
        type=click.FloatRange(min=0.01),
        default=2.0,
        show_default=True,
        help="seconds between polls",
    ),
    click.option(
        "--timeout", "wait_timeout", type=click.FloatRange(min=0), default=None, help="give up after this many seconds"
    ),
    click.option("--quiet", "-q", is_flag=True, help="no progress bar"),
    click.option("--sse", is_flag=True, help="follow the server's event stream instead of polling"),
]


@jobs.command("submit")
@_with(SPEC_OPTIONS)
@click.option("--idempotency-key", help="reuse to make a resubmission safe (default: a fresh one)")
@click.option("--wait", "wait_for_it", is_flag=True, help="watch the job until it ends")
@_with(watch_options)
@json_flag
@click.pass_context
def jobs_submit(
    ctx: click.Context,
    idempotency_key: str | None,
    wait_for_it: bool,
    poll_interval: float,
    wait_timeout: float | None,
    quiet: bool,
    sse: bool,
) -> None:
    """Admit a job against the dataset's budget and queue it."""
    job = _state().client().submit(spec_from_context(ctx), idempotency_key=idempotency_key)
    if not wait_for_it:
        emit(job, lambda: _job_block(job))
        return
    if not _wants_json():
        click.echo(f"submitted {job.id}", err=True)
    _finish_watch(_watch(job.id, poll_interval=poll_interval, timeout=wait_timeout, quiet=quiet, sse=sse))


@jobs.command("list")
@click.option("--dataset", "dataset_id", help="only this dataset's jobs")
@click.option("--status", type=click.Choice(["queued", "running", "succeeded", "failed", "cancelled"]))
@json_flag
def jobs_list(dataset_id: str | None, status: str | None) -> None:
    found = _state().client().list_jobs(dataset_id=dataset_id, status=status)
    emit(found, lambda: table(found, JOB_COLUMNS))


@jobs.command("show")
@click.argument("job_id")
@json_flag
def jobs_show(job_id: str) -> None:
    job = _state().client().get_job(job_id)
    emit(job, lambda: _job_block(job))


@jobs.command("watch")
@click.argument("job_id")
@_with(watch_options)
@json_flag
def jobs_watch(job_id: str, poll_interval: float, wait_timeout: float | None, quiet: bool, sse: bool) -> None:
    """Live progress (steps done / planned, ε spent) until the job ends; exit 1 unless it succeeded."""
    _finish_watch(_watch(job_id, poll_interval=poll_interval, timeout=wait_timeout, quiet=quiet, sse=sse))


@jobs.command("events")
@click.argument("job_id")
@click.option("--after", type=click.IntRange(min=0), default=0, help="only events after this seq")
@json_flag
def jobs_events(job_id: str, after: int) -> None:
    found = _state().client().events(job_id, after=after)
    emit(found, lambda: table(found, EVENT_COLUMNS))


@jobs.command("cancel")
@click.argument("job_id")
@json_flag
def jobs_cancel(job_id: str) -> None:
    """Cancel: a queued job is released at once, a running one stops at its next check."""
    job = _state().client().cancel(job_id)
    emit(job, lambda: _job_block(job))


@jobs.command("generate")
@click.argument("job_id")
@click.option("--prompt", required=True, help="the text to continue")
@click.option(
    "--max-tokens", type=click.IntRange(1, 256), default=64, show_default=True, help="most tokens to generate"
)
@click.option(
    "--temperature",
    type=click.FloatRange(0.0, 2.0),
    default=1.0,
    show_default=True,
    help="softmax temperature; 0 picks the most likely token every time",
)
@click.option("--top-k", type=click.IntRange(min=1), default=None, help="sample among the k most likely tokens only")
@json_flag
def jobs_generate(job_id: str, prompt: str, max_tokens: int, temperature: float, top_k: int | None) -> None:
    """Sample text from a succeeded language-model job's model (post-processing: no privacy cost)."""
    answer = _state().client().generate(job_id, prompt, max_tokens=max_tokens, temperature=temperature, top_k=top_k)
    emit(answer, lambda: str(answer["text"]))


def _ended_as(status: object) -> str:
    """'failed', 'was cancelled': how a job that released no model ended, in words."""
    return "failed" if status == "failed" else f"was {status}"


@jobs.command("download")
@click.argument("job_id")
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("."),
    show_default=True,
    help="directory for <job>.safetensors and <job>.report.json",
)
@json_flag
def jobs_download(job_id: str, out_dir: Path) -> None:
    """Download a job's privacy report (JSON) and, if it succeeded, its model (safetensors,
    digest-checked). A job cancelled or failed after it committed ε has a report and no model."""
    client = _state().client()
    out_dir.mkdir(parents=True, exist_ok=True)
    report = client.report(job_id)
    released = report.get("status", "succeeded") == "succeeded"
    model_path = client.download_model(job_id, out_dir / f"{job_id}.safetensors") if released else None
    report_path = out_dir / f"{job_id}.report.json"
    report_path.write_text(to_json(report) + "\n")
    files = {"model": None if model_path is None else str(model_path), "report": str(report_path)}
    epsilon = report.get("epsilon", {}) if isinstance(report.get("epsilon"), dict) else {}
    outcome = report.get("outcome") if isinstance(report.get("outcome"), dict) else {}
    emit(
        {**files, "guarantee": report.get("guarantee")},
        lambda: key_values(
            [
                ("model", model_path if model_path is not None else f"none: the job {_ended_as(report.get('status'))}"),
                ("report", report_path),
                ("guarantee", report.get("guarantee")),
                ("ε committed", _up(epsilon.get("ledger"))),
                ("δ", _up(epsilon.get("delta"))),
                *([("how it ended", outcome.get("statement"))] if outcome else []),
                ("trained", (report.get("execution") or {}).get("statement")),
            ]
        ),
    )


# ---------------------------------------------------------------------- base models

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
            ("params", b.params),
            ("input shape", b.input_shape),
            ("outputs", b.n_outputs),
            ("source", b.source),
            ("sha256", b.sha256),
            ("size (bytes)", b.size_bytes),
            ("created", b.created_at),
        ]
    )


@cli.group()
def tuning() -> None:
    """Private hyperparameter tuning: many trials, the best released, one ledger entry."""


_TUNING_SPEC = click.option(
    "--spec",
    "spec_file",
    required=True,
    type=click.Path(dir_okay=False),
    help='the tuning request as JSON or YAML: {"base": <job spec>, "search_space": {...}, "trials": {"mean": k}, '
    '"selection": {"metric": "accuracy"}} (docs/tuning.md)',
)


def _tuning_request(spec_file: str) -> dict[str, Any]:
    try:
        return load_spec_file(spec_file)
    except SpecFileError as exc:
        raise click.UsageError(str(exc)) from None


def _slots_line(schedule: dict[str, Any] | None, *, done: bool = True) -> str | None:
    """ "12 slots of 35 s (7 min of worker time), 4 at a time": the same whatever K is."""
    if not schedule:
        return None
    total = schedule["slots"] * schedule["slot_seconds"]
    line = (
        f"{schedule['slots']} slots of {schedule['slot_seconds']:g} s ({_duration(total)} of worker time), "
        f"{schedule['parallel_slots']} at a time"
    )
    return f"{schedule['slots_done']} of {line.replace(' slots of', ' slots done, each', 1)}" if done else line


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:g} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _tuning_block(t: TuningJob) -> str:
    trials = t.trials
    return key_values(
        [
            ("id", t.id),
            ("status", t.status),
            ("dataset", t.dataset_id),
            ("job", t.job_id),
            ("best job", t.best_job_id),
            ("selected", t.selected),
            (f"selected {t.selection.get('metric')} (DP)", t.selected_metric),
            ("error", t.error_code),
            ("trials", _trials_line(trials)),
            ("slots", _slots_line(t.schedule)),
            ("candidates", len(t.candidates)),
            (f"ε of the tuning at δ={_up(t.delta)}", _up(t.epsilon_reserved)),
            ("ε of one trial", _up(t.epsilon_one_trial)),
            ("ε of its trials as separate jobs", _up(t.epsilon_separate_jobs)),
            ("created", t.created_at),
        ]
    )


def _trials_line(trials: dict[str, Any]) -> str:
    maximum = trials.get("maximum")
    most = f", at most {maximum}" if maximum is not None else ""
    return f"{trials.get('distribution')}, mean {trials.get('expected'):g}{most} (the count is never shown)"


@tuning.command("estimate")
@_TUNING_SPEC
@json_flag
def tuning_estimate(spec_file: str) -> None:
    """Dry run: the tuning's one-entry charge, one trial's, and its trials' as separate jobs."""
    estimate = _state().client().estimate_tuning(_tuning_request(spec_file))
    emit(
        estimate,
        lambda: key_values(
            [
                ("ε of the tuning", _up(estimate.get("epsilon_reserved", estimate.get("epsilon_ledger")))),
                ("ε of one trial", _up(estimate["epsilon_one_trial"])),
                ("ε of its trials as separate jobs", _up(estimate["epsilon_separate_jobs"])),
                ("δ", _up(estimate["delta"])),
                ("admissible now", estimate["admissible"]),
                ("trials", _trials_line(estimate["trials"])),
                ("slots", _slots_line(estimate.get("schedule"), done=False)),
                ("candidates", len(estimate["candidates"])),
            ]
        ),
    )


@tuning.command("create")
@_TUNING_SPEC
@click.option("--idempotency-key", help="reuse to make a resubmission safe (default: a fresh one)")
@click.option("--wait", "wait_for_it", is_flag=True, help="wait until the tuning ends")
@click.option(
    "--timeout", "wait_timeout", type=click.FloatRange(min=0), default=None, help="give up waiting after this"
)
@json_flag
def tuning_create(spec_file: str, idempotency_key: str | None, wait_for_it: bool, wait_timeout: float | None) -> None:
    """Admit a tuning against the dataset's budget (one ledger entry) and queue it."""
    client = _state().client()
    created = client.create_tuning(_tuning_request(spec_file), idempotency_key=idempotency_key)
    if wait_for_it:
        created = client.wait_tuning(created.id, timeout=wait_timeout)
    emit(created, lambda: _tuning_block(created))
    if wait_for_it and created.status != "succeeded":
        click.get_current_context().exit(EXIT_API_ERROR)


@tuning.command("show")
@click.argument("tuning_id")
@json_flag
def tuning_show(tuning_id: str) -> None:
    found = _state().client().get_tuning(tuning_id)
    emit(found, lambda: _tuning_block(found))


@tuning.command("list")
@json_flag
def tuning_list() -> None:
    found = _state().client().list_tunings()
    emit(found, lambda: "\n\n".join(_tuning_block(t) for t in found) or "no tunings")


@tuning.command("cancel")
@click.argument("tuning_id")
@json_flag
def tuning_cancel(tuning_id: str) -> None:
    """A queued tuning is released; a running one stops and commits its whole charge."""
    found = _state().client().cancel_tuning(tuning_id)
    emit(found, lambda: _tuning_block(found))


@cli.group("base-models")
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
        _state()
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


@base_models.command("list")
@json_flag
def base_models_list() -> None:
    """Your base models, newest first."""
    found = _state().client().list_base_models()
    emit(found, lambda: table(found, BASE_MODEL_COLUMNS))


@base_models.command("show")
@click.argument("base_model_id")
@json_flag
def base_models_show(base_model_id: str) -> None:
    base = _state().client().get_base_model(base_model_id)
    emit(base, lambda: _base_model_block(base))


@base_models.command("delete")
@click.argument("base_model_id")
@json_flag
def base_models_delete(base_model_id: str) -> None:
    """Delete a base model (refused while a queued or running job starts from it)."""
    _state().client().delete_base_model(base_model_id)
    emit({"deleted": base_model_id}, lambda: f"deleted {base_model_id}")


# ---------------------------------------------------------------------- tokenizers

TOKENIZER_COLUMNS: list[Column[Tokenizer]] = [
    Column("ID", lambda t: t.id),
    Column("NAME", lambda t: t.name, 30),
    Column("KIND", lambda t: t.kind),
    Column("VOCAB", lambda t: t.vocab_size),
    Column("PAD", lambda t: t.pad_id),
    Column("FROM", lambda t: t.trained_from_dataset_id or t.source, 40),
]


def _tokenizer_block(t: Tokenizer) -> str:
    return key_values(
        [
            ("id", t.id),
            ("name", t.name),
            ("kind", t.kind),
            ("vocabulary size", t.vocab_size),
            ("pad id", t.pad_id),
            ("special tokens", t.raw.get("special_tokens") or None),
            ("trained from", t.trained_from_dataset_id),
            ("source", t.source),
            ("sha256", t.sha256),
            ("created", t.created_at),
        ]
    )


@cli.group("tokenizers")
def tokenizers() -> None:
    """Public tokenizers for text datasets: built-in byte, uploaded tokenizer.json, or trained on public text."""


@tokenizers.command("upload")
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--name", help="default: the file name without its suffix")
@click.option("--pad-token", help="the pad token, when the file sets no padding and has no <pad> or [PAD] token")
@click.option("--source", help="where the tokenizer came from")
@json_flag
def tokenizers_upload(path: Path, name: str | None, pad_token: str | None, source: str | None) -> None:
    """Upload a Hugging Face tokenizer.json (public: never one learned from private text)."""
    found = _state().client().upload_tokenizer(path, name=name or path.stem, pad_token=pad_token, source=source)
    emit(found, lambda: _tokenizer_block(found))


@tokenizers.command("train")
@click.argument("dataset_id")
@click.option("--vocab-size", type=click.IntRange(min=1), required=True, help="tokens to learn (at least 300)")
@click.option("--name", required=True)
@json_flag
def tokenizers_train(dataset_id: str, vocab_size: int, name: str) -> None:
    """Train a byte-level BPE tokenizer on a PUBLIC text dataset (a private one is refused)."""
    found = _state().client().train_tokenizer(dataset_id=dataset_id, vocab_size=vocab_size, name=name)
    emit(found, lambda: _tokenizer_block(found))


@tokenizers.command("list")
@json_flag
def tokenizers_list() -> None:
    """The built-in byte tokenizer, then yours, newest first."""
    found = _state().client().tokenizers()
    emit(found, lambda: table(found, TOKENIZER_COLUMNS))


@tokenizers.command("show")
@click.argument("tokenizer_id")
@json_flag
def tokenizers_show(tokenizer_id: str) -> None:
    found = _state().client().tokenizer(tokenizer_id)
    emit(found, lambda: _tokenizer_block(found))


# ---------------------------------------------------------------------- catalogues

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


@cli.command("algorithms")
@click.argument("name", required=False)
@json_flag
def algorithms(name: str | None) -> None:
    """The algorithm catalogue, or one algorithm's hyperparameters and defaults."""
    client = _state().client()
    if name is None:
        found = client.algorithms()
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


@cli.command("models")
@json_flag
def models() -> None:
    """The model catalogue, with each model's parameters and defaults."""
    found = _state().client().models()
    emit(found, lambda: table(found, MODEL_COLUMNS))


def main(argv: Sequence[str] | None = None) -> None:
    """Console-script entry point."""
    cli.main(args=list(argv) if argv is not None else None, prog_name="privtrain")


if __name__ == "__main__":
    main()
