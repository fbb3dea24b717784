"""The report's section on a private hyperparameter tuning: what was searched, what was released."""

from __future__ import annotations

from typing import Any

TUNING_CAVEAT = (
    "This job is a private hyperparameter tuning: it ran a secret random number of trials, each a "
    "configuration drawn at random from the public pool below, and released only the best trial's "
    "model, configuration and DP hold-out metric. Its charge (the ledger ε above) covers all of them "
    "together (Papernot and Steinke's bound for the number-of-trials distribution stated below, "
    "conditioned on its public maximum), provided the number of trials stays secret: the service never "
    "shows it, and the tuning ran in one slot of fixed length per possible trial, so that neither its "
    "running time nor anyone's view of the workers depends on it."
)


def tuning_execution(device: str) -> dict[str, Any]:
    """The report's execution section of a tuning: the device of the released trial only (its
    duration, steps and throughput, or the tuning's, could count trials)."""
    return {
        "device": device,
        "statement": f"the released trial ran on {device}; durations, steps and throughput are not shown: "
        "they could tell how many trials the tuning ran",
    }


def tuning_section(tuning: dict[str, Any], *, metrics: dict[str, Any] | None) -> dict[str, Any]:
    """Public facts only: the pool, the distribution of the number of trials (never the number),
    the selected configuration and its released metric, and the cost compared with separate jobs."""
    selection = tuning["selection"]
    return {
        "search_space": tuning["search_space"],
        "trials": {
            "distribution": tuning["trials"]["distribution"],
            "parameters": tuning["trials"]["parameters"],
            "expected": tuning["trials"]["mean"],
            "maximum": tuning["trials"].get("maximum"),
            "count": "not shown: the guarantee holds for the released trial only while it stays secret",
        },
        "schedule": tuning.get("schedule"),
        "candidates": [
            {"assignment": c["assignment"], "epsilon_ledger": c["epsilon_ledger"], "steps": c["steps"]}
            for c in tuning["candidates"]
        ],
        "selection": selection,
        "selected": tuning.get("selected"),
        "selected_metric": None if metrics is None else metrics.get(selection["metric"]),
        "epsilon_one_trial": tuning["epsilon_one_trial"],
        "epsilon_separate_jobs": tuning["epsilon_separate_jobs"],
        "comparison": (
            "epsilon_separate_jobs is what running the expected number of trials (rounded up) of the costliest "
            "configuration as ordinary jobs would have charged; epsilon_one_trial is one such job"
        ),
    }
