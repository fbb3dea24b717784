"""POST /v1/jobs/estimate helps choose a job: what would remain after it, the most steps at its σ,
the least σ at its steps, and why "remaining ε" and "largest admissible ε" are two numbers."""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

from privtrain.cli import CliEnvironment, cli
from tests.conftest import digits_split, dp_sgd_spec, to_csv, upload

N_DIGITS = 1437


def _estimate(client: TestClient, spec: dict[str, Any]) -> dict[str, Any]:
    response = client.post("/v1/jobs/estimate", json=spec)
    assert response.status_code == 200, response.text
    return response.json()


def _walkthrough_spec(dataset_id: str, **privacy: object) -> dict[str, Any]:
    """The README's digits job: DP-SGD, B = 128, 20 epochs (q = 0.089, T = 225)."""
    spec = dp_sgd_spec(dataset_id, **(privacy or {"target_epsilon": 4.0}))
    spec["training"] = {"epochs": 20, "batch_size": 128, "learning_rate": 2.0}
    return spec


def _with_training(spec: dict[str, Any], **training: object) -> dict[str, Any]:
    return {**spec, "training": {"batch_size": spec["training"]["batch_size"], "learning_rate": 2.0, **training}}


def test_remaining_after_is_what_the_ledger_shows_once_the_job_is_admitted(alice: TestClient, dataset_id: str) -> None:
    spec = _walkthrough_spec(dataset_id)
    estimate = _estimate(alice, spec)
    assert estimate["admissible"] is True
    assert estimate["budget_remaining_after_epsilon"] < estimate["budget_remaining_epsilon"]
    assert alice.post("/v1/jobs", json=spec).status_code == 202
    budget = alice.get(f"/v1/datasets/{dataset_id}/budget").json()
    assert budget["remaining_epsilon"] == estimate["budget_remaining_after_epsilon"]
    assert _estimate(alice, spec)["budget_remaining_epsilon"] == estimate["budget_remaining_after_epsilon"]


def test_largest_admissible_steps_fit_and_one_more_does_not(alice: TestClient, dataset_id: str) -> None:
    spec = _walkthrough_spec(dataset_id, noise_multiplier=2.0)
    alice.post("/v1/jobs", json=_walkthrough_spec(dataset_id))  # a used budget, not a fresh one
    steps = _estimate(alice, spec)["largest_admissible_steps"]
    assert isinstance(steps, int) and steps > 225
    at_most = _estimate(alice, _with_training(spec, steps=steps))
    assert at_most["admissible"] is True and at_most["steps"] == steps
    assert at_most["largest_admissible_steps"] == steps
    assert _estimate(alice, _with_training(spec, steps=steps + 1))["admissible"] is False


def test_smallest_admissible_noise_multiplier_fits_and_a_smaller_one_does_not(
    alice: TestClient, dataset_id: str
) -> None:
    spec = _with_training(_walkthrough_spec(dataset_id, noise_multiplier=5.0), steps=300)
    for _ in range(2):
        assert alice.post("/v1/jobs", json=_walkthrough_spec(dataset_id)).status_code == 202
    estimate = _estimate(alice, spec)
    sigma = estimate["smallest_admissible_noise_multiplier"]
    assert estimate["smallest_admissible_noise_multiplier_reason"] is None and 1.0 < sigma < 5.0
    fits = _estimate(alice, {**spec, "privacy": {"noise_multiplier": sigma}})
    assert fits["admissible"] is True
    assert fits["epsilon_ledger"] == pytest.approx(estimate["largest_admissible_epsilon"], rel=1e-12)
    assert _estimate(alice, {**spec, "privacy": {"noise_multiplier": sigma * (1 - 1e-5)}})["admissible"] is False


def test_a_job_too_noisy_for_one_step_says_why(alice: TestClient, dataset_id: str) -> None:
    estimate = _estimate(alice, _walkthrough_spec(dataset_id, noise_multiplier=0.05))
    assert estimate["admissible"] is False and estimate["budget_remaining_after_epsilon"] is None
    assert estimate["largest_admissible_steps"] is None
    assert estimate["largest_admissible_steps_reason"] == ("not even one step at σ = 0.05 fits the remaining budget")
    assert estimate["smallest_admissible_noise_multiplier"] > 0.05


def test_algorithms_whose_charge_does_not_grow_with_steps_say_so(alice: TestClient, dataset_id: str) -> None:
    kl = dp_sgd_spec(dataset_id)
    kl["algorithm"] = {
        "name": "kl-spider",
        "hyperparameters": {"L0": 3.0, "L1": 2.0, "gamma": 2.0, "kappa": 1.5, "F0": 1.0},
    }
    kl["training"] = {"steps": 40}
    estimate = _estimate(alice, kl)
    assert estimate["largest_admissible_steps"] is None
    assert "budget units" in estimate["largest_admissible_steps_reason"]
    assert estimate["smallest_admissible_noise_multiplier"] is not None  # σ still applies
    features, _, labels, _ = digits_split()
    regression = upload(
        alice,
        to_csv(features, labels, label="target"),
        name="digits-as-regression",
        task="regression",
        label_column="target",
    )
    assert regression.status_code == 201, regression.text
    fw = dp_sgd_spec(regression.json()["id"])
    fw["model"] = {"name": "linear-regression"}
    fw["algorithm"] = {"name": "ht-dp-fw", "hyperparameters": {"design_epsilon": 2.0}}
    fw["training"] = {"epochs": 1}
    estimate = _estimate(alice, fw)
    assert estimate["largest_admissible_steps"] is None
    assert "parallel composition" in estimate["largest_admissible_steps_reason"]


# --- remaining ε versus largest admissible ε: two numbers, and why -------------------------------

# The worked example of docs/epsilon.md#two-numbers-for-what-is-left: after three jobs of target ε 4
# (ε_G = 8, δ = 1e-5) a fourth does not fit, and the two numbers differ.
GOLDEN_REMAINING = 3.1638254198627545
GOLDEN_LARGEST_FOR_DP_SGD = 3.2998589478494984


@pytest.fixture
def three_jobs_in(alice: TestClient, digits_csv: bytes) -> str:
    dataset_id = upload(alice, digits_csv).json()["id"]
    for _ in range(3):
        assert alice.post("/v1/jobs", json=_walkthrough_spec(dataset_id)).status_code == 202
    return dataset_id


def test_remaining_and_largest_admissible_epsilon_differ_by_curve_shape(alice: TestClient, three_jobs_in: str) -> None:
    """budget_remaining_epsilon is the ε a plain Gaussian (RDP ρ·α) job could still get;
    largest_admissible_epsilon is what THIS spec's curve fits into the same room."""
    dp_sgd = _estimate(alice, _walkthrough_spec(three_jobs_in))
    assert dp_sgd["admissible"] is False
    assert dp_sgd["budget_remaining_epsilon"] == pytest.approx(GOLDEN_REMAINING, rel=1e-9)
    assert dp_sgd["largest_admissible_epsilon"] == pytest.approx(GOLDEN_LARGEST_FOR_DP_SGD, rel=1e-6)
    # A Gaussian-shaped job (full batch: q = 1, T Gaussians) gets exactly the remaining ε …
    full_batch = _walkthrough_spec(three_jobs_in)
    full_batch["training"] = {"steps": 50, "batch_size": N_DIGITS, "learning_rate": 2.0}
    gaussian = _estimate(alice, full_batch)
    assert gaussian["sampling_probability"] == 1.0
    assert gaussian["budget_remaining_epsilon"] == dp_sgd["budget_remaining_epsilon"]
    assert gaussian["largest_admissible_epsilon"] == pytest.approx(GOLDEN_REMAINING, rel=1e-5)
    # … while subsampled jobs fit more, and the smaller q, the more.
    small_batch = _walkthrough_spec(three_jobs_in)
    small_batch["training"] = {"epochs": 20, "batch_size": 16, "learning_rate": 2.0}
    smaller_q = _estimate(alice, small_batch)["largest_admissible_epsilon"]
    assert GOLDEN_REMAINING + 0.1 < dp_sgd["largest_admissible_epsilon"] < smaller_q
    # and the larger number is real: the DP-SGD job calibrated just under it is admitted
    fits = dict(_walkthrough_spec(three_jobs_in, target_epsilon=GOLDEN_LARGEST_FOR_DP_SGD * 0.9999))
    assert alice.post("/v1/jobs", json=fits).status_code == 202


ESTIMATE = {
    "noise_multiplier": 2.0,
    "sampling_probability": 0.089,
    "steps": 225,
    "delta": 1e-05,
    "epsilon_ledger": 4.10001,
    "epsilon_prv": 3.5,
    "epsilon_prv_method": "rdp-single-job",
    "noise_std_on_sum": 2.0,
    "sensitivity": 1.0,
    "admissible": False,
    "witness_order": None,
    "budget_remaining_epsilon": GOLDEN_REMAINING,
    "budget_remaining_after_epsilon": None,
    "largest_admissible_epsilon": GOLDEN_LARGEST_FOR_DP_SGD,
    "smallest_admissible_noise_multiplier": 2.30617790282592,
    "smallest_admissible_noise_multiplier_reason": None,
    "largest_admissible_steps": None,
    "largest_admissible_steps_reason": "not even one step at σ = 0.05 fits the remaining budget",
    "evaluation_epsilon": None,
}


def _cli_estimate(estimate: dict[str, Any]) -> dict[str, str]:
    """``privtrain jobs estimate`` against a server that answers ``estimate``: label → value."""
    transport = httpx.MockTransport(lambda request: httpx.Response(200, json=estimate))
    result = CliRunner().invoke(
        cli,
        [
            "--url",
            "http://privtrain.test",
            "--api-key",
            "pt_test",
            "jobs",
            "estimate",
            "--dataset",
            "ds_1",
            "--model",
            "m",
            "--algorithm",
            "a",
        ],
        obj=CliEnvironment(transport=transport),
    )
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return dict(re.split(r"\s{2,}", line, maxsplit=1) for line in result.stdout.splitlines())


def test_cli_estimate_prints_the_choices_and_the_two_numbers_explained() -> None:
    shown = _cli_estimate(ESTIMATE)
    assert shown["budget remaining ε"] == "3.163" and shown["largest admissible target ε"] == "3.299"
    assert shown["budget remaining ε after this job"] == "-"
    assert shown["smallest admissible σ at these steps"] == "2.307"  # rounded up: it still fits
    assert shown["largest admissible steps at this σ"] == ESTIMATE["largest_admissible_steps_reason"]
    assert "plain Gaussian" in shown["remaining ε vs largest target ε"]
    same = _cli_estimate({**ESTIMATE, "largest_admissible_epsilon": GOLDEN_REMAINING + 1e-9})
    assert "remaining ε vs largest target ε" not in same  # nothing to explain when they agree
    assert "evaluation interval" not in shown
    sized = _cli_estimate({**ESTIMATE, "evaluation_interval": {"statement": "about [0.42, 0.58] (width 0.16)"}})
    assert sized["evaluation interval"] == "about [0.42, 0.58] (width 0.16)"
