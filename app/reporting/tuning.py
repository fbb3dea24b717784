"""The report's section on a private hyperparameter tuning: what was searched, what was released."""

from __future__ import annotations

from typing import Any

TUNING_CAVEAT = (
    "This job is a private hyperparameter tuning: it ran a secret random number of trials, each a "
    "configuration drawn at random from the public pool below, and released only the best trial's "
    "model, configuration and DP hold-out metric. Its charge (the ledger ε above) covers all of them "
    "together (Papernot and Steinke's bound for the number-of-trials distribution stated below), "
    "provided the number of trials stays secret: the service never shows it, though the tuning's "
    "running time grows with it."
)


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
            "count": "not shown: the guarantee holds for the released trial only while it stays secret",
        },
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
