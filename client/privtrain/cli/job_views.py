"""How jobs, their events and estimates read in the CLI: tables and key/value blocks."""

from __future__ import annotations

from typing import Any

from privtrain.cli.figures import down, up
from privtrain.output import Column, key_values, table
from privtrain.resources import Estimate, Job, JobEvent


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
    Column("ε", lambda j: up(_job_epsilon(j)[0])),
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
                up(chain["epsilon_composed_ledger"]),
            )
        )
    return [*rows, ("init chain", chain.get("notice"))]


def estimate_block(e: Estimate) -> str:
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
    differ = down(e.budget_remaining_epsilon) != down(e.largest_admissible_epsilon)
    return key_values(
        [
            ("noise multiplier σ", e.noise_multiplier),
            ("sampling probability q", e.sampling_probability),
            ("steps", e.steps),
            ("noise std on the sum", e.noise_std_on_sum),
            ("sensitivity", e.sensitivity),
            (f"ε reserved at δ={up(e.delta)}", up(e.epsilon_reserved)),
            (f"ε (single job, {e.epsilon_single_job_method or 'tightest'})", up(e.epsilon_single_job)),
            ("ε of the evaluation", up(e.evaluation_epsilon)),
            *([("evaluation interval", e.evaluation_interval["statement"])] if e.evaluation_interval else []),
            ("admissible now", e.admissible),
            ("budget remaining ε", down(e.budget_remaining_epsilon)),
            ("budget remaining ε after this job", down(raw.get("budget_remaining_after_epsilon"))),
            ("largest admissible target ε", down(e.largest_admissible_epsilon)),
            (
                "largest admissible steps at this σ",
                _or_reason(raw.get("largest_admissible_steps"), raw.get("largest_admissible_steps_reason")),
            ),
            (
                "smallest admissible σ at these steps",
                _or_reason(
                    up(raw.get("smallest_admissible_noise_multiplier")),
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


def job_block(j: Job) -> str:
    """Key/values, then the released metrics as a table. A finished job states the ε it committed
    (a stopped-early or cancelled job committed less than it reserved), a running one its reservation."""
    epsilon, basis = _job_epsilon(j)
    label = f"ε {basis or '(ledger)'} at δ={up(j.delta)}"
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
            (label, up(epsilon)),
            *([("rest of the reservation", "released to the budget")] if released else []),
            *([("ε (single job, tightest)", up(j.epsilon_single_job))] if _single_job_is_for_epsilon(j) else []),
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
