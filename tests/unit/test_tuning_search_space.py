"""The tuning's search space: what may be searched, the pool drawn from it (a grid when small,
independent draws otherwise, integers where the field is one), and how a configuration is set."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernel.errors import InvalidInput
from kernel.schemas.tuning import SearchRange
from kernel.tuning.search_space import apply, candidate_pool, check_path
from kernel.tuning.selection import TrialResult, best_of, better, score_of


@pytest.mark.parametrize(
    "path",
    [
        "training.learning_rate",
        "training.batch_size",
        "algorithm.hyperparameters.clipping_norm",
        "model.params.hidden_sizes",
    ],
)
def test_searchable_paths(path: str) -> None:
    check_path(path)


@pytest.mark.parametrize(
    "path",
    [
        "privacy.target_epsilon",
        "dataset_id",
        "model.name",
        "algorithm.name",
        "evaluation.epsilon",
        "training.time_limit_s",
        "algorithm.hyperparameters.",
        "algorithm.hyperparameters.a.b",
    ],
)
def test_fixed_fields_are_refused(path: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        check_path(path)
    assert refused.value.slug == "invalid-search-space"


def test_a_small_grid_is_the_pool() -> None:
    pool = candidate_pool(
        {"training.learning_rate": [0.1, 1.0], "training.epochs": [1, 2, 3]}, size=16, rng=random.Random(0)
    )
    assert len(pool) == 6 and {(p["training.learning_rate"], p["training.epochs"]) for p in pool} == {
        (lr, e) for lr in (0.1, 1.0) for e in (1, 2, 3)
    }


@settings(max_examples=50, deadline=None)
@given(
    low=st.floats(min_value=1e-4, max_value=10),
    span=st.floats(min_value=1.01, max_value=1e3),
    size=st.integers(min_value=1, max_value=32),
    seed=st.integers(min_value=0, max_value=2**32 - 1),
)
def test_ranges_are_drawn_inside_and_integer_fields_are_integers(low: float, span: float, size: int, seed: int) -> None:
    space = {
        "training.learning_rate": SearchRange(low=low, high=low * span, log=True),
        "training.batch_size": SearchRange(low=1, high=512),
    }
    pool = candidate_pool(space, size=size, rng=random.Random(seed))
    assert 1 <= len(pool) <= size
    for point in pool:
        assert low * (1 - 1e-5) <= point["training.learning_rate"] <= low * span * (1 + 1e-5)
        assert isinstance(point["training.batch_size"], int) and 1 <= point["training.batch_size"] <= 512
    assert len({tuple(sorted(p.items())) for p in pool}) == len(pool)  # no duplicates


def test_apply_sets_dotted_fields_and_steps_replace_epochs() -> None:
    base = {"training": {"epochs": 3, "learning_rate": 0.1}, "algorithm": {"name": "dp-sgd"}}
    spec = apply(base, {"training.steps": 50, "algorithm.hyperparameters.clipping_norm": 2.0})
    assert spec["training"] == {"steps": 50, "learning_rate": 0.1}
    assert spec["algorithm"] == {"name": "dp-sgd", "hyperparameters": {"clipping_norm": 2.0}}
    assert base["training"] == {"epochs": 3, "learning_rate": 0.1}  # the base is not changed


def test_the_best_trial_maximises_accuracy_and_minimises_errors() -> None:
    low, high = TrialResult(0, 0, {"accuracy": 0.5}, 0.5), TrialResult(1, 1, {"accuracy": 0.9}, 0.9)
    assert better(high, low, "accuracy") and not better(low, high, "accuracy")
    assert better(low, high, "mse") and not better(high, low, "perplexity")
    assert better(low, None, "mse")
    assert not better(TrialResult(2, 0, {}, 0.9), high, "accuracy")  # a tie goes to the earlier-drawn trial …
    assert better(high, TrialResult(2, 0, {}, 0.9), "accuracy")  # … whichever finished first
    assert score_of({"perplexity": math.nan}, "perplexity") == math.inf


@settings(max_examples=200, deadline=None)
@given(
    scores=st.lists(st.sampled_from([0.1, 0.5, 0.9, -math.inf]), min_size=1, max_size=8),
    metric=st.sampled_from(["accuracy", "mse"]),
    data=st.data(),
)
def test_the_selected_trial_does_not_depend_on_the_order_the_trials_finished(
    scores: list[float], metric: str, data: st.DataObject
) -> None:
    """Workers finish trials in any order; every worker must select the same one."""
    trials = [TrialResult(seq, seq % 3, {metric: score}, score) for seq, score in enumerate(scores)]
    finished = data.draw(st.permutations(trials))
    best = best_of(finished, metric)
    assert best == best_of(trials, metric)
    assert best is not None
    target = max(scores) if metric == "accuracy" else min(scores)
    assert best.score == target and best.seq == scores.index(target)
