"""``privtrain tuning``: private hyperparameter tuning, many trials and one ledger entry."""

from __future__ import annotations

from typing import Any

import click

from privtrain.cli.figures import up
from privtrain.cli.state import EXIT_API_ERROR, current_state, emit, json_flag
from privtrain.output import key_values
from privtrain.resources import TuningJob
from privtrain.specs import SpecFileError, load_spec_file


@click.group()
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
            (f"ε of the tuning at δ={up(t.delta)}", up(t.epsilon_reserved)),
            ("ε of one trial", up(t.epsilon_one_trial)),
            ("ε of its trials as separate jobs", up(t.epsilon_separate_jobs)),
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
    estimate = current_state().client().estimate_tuning(_tuning_request(spec_file))
    emit(
        estimate,
        lambda: key_values(
            [
                ("ε of the tuning", up(estimate.get("epsilon_reserved", estimate.get("epsilon_ledger")))),
                ("ε of one trial", up(estimate["epsilon_one_trial"])),
                ("ε of its trials as separate jobs", up(estimate["epsilon_separate_jobs"])),
                ("δ", up(estimate["delta"])),
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
    client = current_state().client()
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
    """One tuning: its status, slots, ε and, once it succeeded, the released trial."""
    found = current_state().client().get_tuning(tuning_id)
    emit(found, lambda: _tuning_block(found))


@tuning.command("list")
@json_flag
def tuning_list() -> None:
    """Your tunings, newest first."""
    found = current_state().client().list_tunings()
    emit(found, lambda: "\n\n".join(_tuning_block(t) for t in found) or "no tunings")


@tuning.command("cancel")
@click.argument("tuning_id")
@json_flag
def tuning_cancel(tuning_id: str) -> None:
    """A queued tuning is released; a running one stops and commits its whole charge."""
    found = current_state().client().cancel_tuning(tuning_id)
    emit(found, lambda: _tuning_block(found))
