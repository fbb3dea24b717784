"""The 409 insufficient-budget problem prints the job's cost (a guarantee) rounded up and the
remaining budget rounded down, never to nearest: nearest printed a cost below the one charged."""

from __future__ import annotations

import re

from fastapi.testclient import TestClient

from tests.conftest import dp_sgd_spec

DETAIL = re.compile(
    r"^the job costs ε = (?P<cost>\S+) at δ = (?P<delta>\S+) and does not fit the dataset's "
    r"remaining budget of ε = (?P<remaining>[^;\s]+); the largest target ε this job could ask for and be admitted "
    r"now is (?P<largest>\S+)$"
)


def test_insufficient_budget_detail_rounds_the_cost_up_and_the_remaining_budget_down(
    alice: TestClient, dataset_id: str
) -> None:
    # a σ whose ε the old `.4g` rounded *down* (so the old message overstated the privacy)
    for sigma in (0.3, 0.31, 0.32, 0.33, 0.34, 0.35, 0.36, 0.37, 0.38, 0.39):
        estimate = alice.post("/v1/jobs/estimate", json=dp_sgd_spec(dataset_id, noise_multiplier=sigma)).json()
        if not estimate["admissible"] and float(f"{estimate['epsilon_ledger']:.4g}") < estimate["epsilon_ledger"]:
            break
    else:
        raise AssertionError("no candidate σ whose ε nearest rounding would understate")
    response = alice.post("/v1/jobs", json=dp_sgd_spec(dataset_id, noise_multiplier=sigma))
    assert response.status_code == 409, response.text
    problem = response.json()
    assert problem["type"] == "/problems/insufficient-privacy-budget"
    match = DETAIL.match(problem["detail"])
    assert match, problem["detail"]
    assert problem["job_epsilon"] == estimate["epsilon_ledger"]
    assert float(match["cost"]) >= problem["job_epsilon"]
    assert float(match["delta"]) >= problem["budget_delta"]
    assert float(match["remaining"]) <= problem["remaining_epsilon"]
    assert float(match["largest"]) <= problem["largest_admissible_epsilon"]  # what fits: rounded down too
