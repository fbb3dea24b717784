"""The privacy report of a finished job (privacy.md §5): everything an auditor needs."""

from __future__ import annotations

import datetime as dt
from typing import Any

from app import privacy
from app.models import Dataset, Job, LedgerEntry

REPORT_VERSION = 1

CAVEATS = (
    "The guarantee covers the released model only, for one row of this dataset under add/remove "
    "neighbours; it does not cover choices made outside the service (for example hyperparameters "
    "tuned on the same data in earlier jobs are covered only insofar as those jobs were also "
    "charged to this ledger).",
    "The ledger ε is derived from the Rényi-DP curve on a fixed order grid and is what the budget "
    "is charged; the PRV ε is a tighter single-job upper bound for this job alone and is not "
    "used by the ledger, because PRV/PLD bounds of adaptively composed jobs are not a valid filter.",
    "The row count n of the dataset is public; dataset facts (n, feature shape, classes) are "
    "treated as public by design.",
    "Noise was drawn from generators seeded per job from the operating system's CSPRNG (the "
    "streams themselves are PyTorch's and NumPy's generators); floating-point effects of sampled "
    "noise are not accounted for.",
)


NORMALISATION = {
    "poisson": "divided by the public expected batch size q·n",
    "full-batch": "divided by the public registered number of training rows n",
    "disjoint-blocks": "per block, divided by the public expected block size",
}
"""How each sampling scheme's releases are normalised (privacy.md §2: public constants only)."""


def _sensitivity_fields(sensitivity: float, norm: str, noise_multiplier: float) -> dict[str, Any]:
    """Gaussian sums report Δ₂ and the noise std σ·Δ₂ they drew; other mechanisms (exponential
    mechanism scores, Laplace/Peeling in ℓ∞) report Δ with its norm, their noise is in the notes."""
    if norm == "l2":
        return {"l2_sensitivity": sensitivity, "noise_std_on_sum": noise_multiplier * sensitivity}
    return {"sensitivity": sensitivity, "sensitivity_norm": norm}


def build_report(
    *,
    job: Job,
    dataset: Dataset,
    sensitivity: float,
    expected_batch_size: float,
    sampling: str,
    sensitivity_norm: str,
    actual_event: dict[str, Any],
    budget_before: dict[str, Any],
    budget_after: dict[str, Any],
    commit_entry: LedgerEntry,
    adjustments: list[dict[str, Any]],
    metrics: dict[str, Any] | None,
    algorithm_notes: dict[str, Any],
    model_sha256: str,
) -> dict[str, Any]:
    event = privacy.event_from_json(actual_event)
    caveats = list(CAVEATS)
    if adjustments:
        caveats.insert(
            0,
            f"The owner raised this dataset's budget {len(adjustments)} time(s) (ADJUST entries "
            f"{', '.join(str(a['seq']) for a in adjustments)}): the total guarantee of all releases "
            "from this dataset is the budget in force now, not the one it was registered with.",
        )
    if metrics is not None:
        caveats.append(
            "The released evaluation metric is noisy by design (its mechanism is stated); the "
            "hold-out rows were chosen by independent per-row coins and not used for training."
        )
    curve = privacy.rdp_curve(event)
    eps_rdp, order = privacy.epsilon_from_rdp(curve, job.delta)
    return {
        "report_version": REPORT_VERSION,
        "generated_at": dt.datetime.now(dt.UTC).isoformat(),
        "job_id": job.id,
        "status": "succeeded",
        "dataset": {
            "id": dataset.id,
            "name": dataset.name,
            "sha256": dataset.sha256,
            "n_rows": dataset.n_rows,
            "feature_shape": dataset.feature_shape,
            "task": dataset.task,
            "n_classes": dataset.n_classes,
        },
        "privacy_unit": "one row of the uploaded dataset",
        "neighbouring_relation": "add/remove one row",
        "guarantee": (
            f"({job.epsilon_ledger:.4g}, {job.delta:.3g})-differential privacy for one row, "
            "as charged to the dataset's ledger"
        ),
        "model": {"name": job.model_name, "params": job.spec["model"]["params"], "sha256": model_sha256},
        "algorithm": {
            "name": job.algorithm,
            "hyperparameters": job.spec["algorithm"]["hyperparameters"],
            "training": job.spec["training"],
            "notes": algorithm_notes,
        },
        "mechanism": {
            "sampling": sampling,
            "sampling_probability": job.sampling_probability,
            "expected_batch_size": expected_batch_size,
            "noise_multiplier": job.noise_multiplier,
            **_sensitivity_fields(sensitivity, sensitivity_norm, job.noise_multiplier),
            "normalisation": NORMALISATION.get(sampling, "by public constants only (see the algorithm's notes)"),
            "steps_planned": job.steps_planned,
            "steps_run": job.steps_run,
        },
        "event": actual_event,
        "reserved_event": job.event,
        "epsilon": {
            "delta": job.delta,
            "ledger": privacy.ledger_epsilon(curve, job.delta),
            "ledger_definition": "RDP curve converted at δ/|orders| (the ledger's currency)",
            "rdp_at_delta": eps_rdp,
            "rdp_best_order": order,
            "prv_upper_bound": privacy.prv_epsilon(event, job.delta),
            "prv_label": "tight single-job upper bound (prv-accountant); not used by the ledger",
        },
        "rdp_curve": {"orders": list(privacy.ORDERS), "values": list(curve), "orders_version": privacy.ORDERS_VERSION},
        "accountant": {"name": privacy.ACCOUNTANT_NAME, "version": privacy.ACCOUNTANT_VERSION},
        "released_metrics": metrics,
        "ledger": {
            "before": budget_before,
            "after": budget_after,
            "commit_entry_seq": commit_entry.seq,
            "commit_entry_hash": commit_entry.hash,
            "budget_adjustments": adjustments,
        },
        "caveats": caveats,
    }
