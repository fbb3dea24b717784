"""``privtrain jobs``: price, submit, watch, cancel and download training jobs."""

from __future__ import annotations

from pathlib import Path

import click

from privtrain.cli.figures import up
from privtrain.cli.job_views import EVENT_COLUMNS, JOB_COLUMNS, estimate_block, job_block
from privtrain.cli.spec_options import SPEC_OPTIONS, spec_from_context, with_options
from privtrain.cli.state import EXIT_API_ERROR, current_state, emit, json_flag, wants_json
from privtrain.client import ModelFormat
from privtrain.output import key_values, table, to_json
from privtrain.resources import Job
from privtrain.sse import sse_progress


@click.group()
def jobs() -> None:
    """Price, submit, watch, cancel and download training jobs."""


@jobs.command("estimate")
@with_options(SPEC_OPTIONS)
@json_flag
@click.pass_context
def jobs_estimate(ctx: click.Context) -> None:
    """Dry run: the noise, steps and ε a job would be charged, and whether it fits now."""
    estimate = current_state().client().estimate(spec_from_context(ctx))
    emit(estimate, lambda: estimate_block(estimate))


def _watch(job_id: str, *, poll_interval: float, timeout: float | None, quiet: bool, sse: bool) -> Job:
    state = current_state()
    return state.client().wait(
        job_id,
        timeout=timeout,
        poll_interval=poll_interval,
        progress=not quiet,
        progress_source=sse_progress if sse else state.environment.progress_source,
    )


def _finish_watch(job: Job) -> None:
    emit(job, lambda: job_block(job))
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
@with_options(SPEC_OPTIONS)
@click.option("--idempotency-key", help="reuse to make a resubmission safe (default: a fresh one)")
@click.option("--wait", "wait_for_it", is_flag=True, help="watch the job until it ends")
@with_options(watch_options)
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
    job = current_state().client().submit(spec_from_context(ctx), idempotency_key=idempotency_key)
    if not wait_for_it:
        emit(job, lambda: job_block(job))
        return
    if not wants_json():
        click.echo(f"submitted {job.id}", err=True)
    _finish_watch(_watch(job.id, poll_interval=poll_interval, timeout=wait_timeout, quiet=quiet, sse=sse))


@jobs.command("list")
@click.option("--dataset", "dataset_id", help="only this dataset's jobs")
@click.option("--status", type=click.Choice(["queued", "running", "succeeded", "failed", "cancelled"]))
@json_flag
def jobs_list(dataset_id: str | None, status: str | None) -> None:
    """Your jobs, newest first (filter by --dataset and --status)."""
    found = current_state().client().list_jobs(dataset_id=dataset_id, status=status)
    emit(found, lambda: table(found, JOB_COLUMNS))


@jobs.command("show")
@click.argument("job_id")
@json_flag
def jobs_show(job_id: str) -> None:
    """One job: its status, steps, noise and ε (reserved, or committed once it ended)."""
    job = current_state().client().get_job(job_id)
    emit(job, lambda: job_block(job))


@jobs.command("watch")
@click.argument("job_id")
@with_options(watch_options)
@json_flag
def jobs_watch(job_id: str, poll_interval: float, wait_timeout: float | None, quiet: bool, sse: bool) -> None:
    """Live progress (steps done / planned, ε spent) until the job ends; exit 1 unless it succeeded."""
    _finish_watch(_watch(job_id, poll_interval=poll_interval, timeout=wait_timeout, quiet=quiet, sse=sse))


@jobs.command("events")
@click.argument("job_id")
@click.option("--after", type=click.IntRange(min=0), default=0, help="only events after this seq")
@json_flag
def jobs_events(job_id: str, after: int) -> None:
    """A job's events (admitted, started, progress, ended...), oldest first, after --after."""
    found = current_state().client().list_events(job_id, after=after)
    emit(found, lambda: table(found, EVENT_COLUMNS))


@jobs.command("cancel")
@click.argument("job_id")
@json_flag
def jobs_cancel(job_id: str) -> None:
    """Cancel: a queued job is released at once, a running one stops at its next check."""
    job = current_state().client().cancel(job_id)
    emit(job, lambda: job_block(job))


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
    answer = (
        current_state().client().generate(job_id, prompt, max_tokens=max_tokens, temperature=temperature, top_k=top_k)
    )
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
    help="directory for <job>.safetensors (or <job>-hf.zip, <job>-peft.zip) and <job>.report.json",
)
@click.option(
    "--format",
    "model_format",
    type=click.Choice(["safetensors", "hf", "peft"]),
    default="safetensors",
    show_default=True,
    help="hf: a model named 'hf' as a zipped Transformers save_pretrained folder; peft: its LoRA adapter as "
    "a zipped PEFT folder (docs/hugging-face.md)",
)
@json_flag
def jobs_download(job_id: str, out_dir: Path, model_format: ModelFormat) -> None:
    """Download a job's privacy report (JSON) and, if it succeeded, its model (safetensors,
    digest-checked; or with --format hf a Transformers folder, with --format peft a LoRA job's PEFT
    adapter folder, zipped). A job cancelled or failed
    after it committed ε has a report and no model."""
    client = current_state().client()
    out_dir.mkdir(parents=True, exist_ok=True)
    report = client.get_report(job_id)
    released = report.get("status", "succeeded") == "succeeded"
    name = f"{job_id}-{model_format}.zip" if model_format != "safetensors" else f"{job_id}.safetensors"
    model_path = client.download_model(job_id, out_dir / name, format=model_format) if released else None
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
                ("ε committed", up(epsilon.get("ledger"))),
                ("δ", up(epsilon.get("delta"))),
                *([("how it ended", outcome.get("statement"))] if outcome else []),
                ("trained", (report.get("execution") or {}).get("statement")),
            ]
        ),
    )
