"""Guarantees over the init chain, and who sees it (issue 35, items 2 and 3).

A model fine-tuned from a private job's model on the same rows used those rows twice: its report
states the composition of both jobs' committed events (checked here against an independent
composition of the ledger's own COMMIT curves, and against dp-accounting's PLD), while the ledger
charged each job once. A start trained on another dataset is named with that dataset's own
guarantee. A reader with no role on the starting job's dataset sees none of its ids, classes, ε
or hash, in the JSON report, the HTML report and the job view.
"""

from __future__ import annotations

import io
import json

import dp_accounting
import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from kernel import privacy
from kernel.config import Settings
from kernel.db.engine import Database
from kernel.db.orm import LedgerEntry
from privtrain_common.directed_rounding import format_guarantee
from tests.conftest import digits_split, new_key, to_csv, upload
from tests.sharing import share
from tests.tuning_run import TRIAL_TIME_LIMIT_S, run_tuning
from worker.runner import JobRunner

MLP = {"name": "mlp", "params": {"hidden_sizes": [8]}}


@pytest.fixture
def bob(database: Database) -> dict[str, str]:
    return {"Authorization": f"Bearer {new_key(database, 'bob')}"}


def _upload_as(client: TestClient, headers: dict[str, str], body: bytes, **params: object) -> dict:
    query = {"name": "theirs", "format": "csv", "label_column": "label", "epsilon": 8, "delta": 1e-5, **params}
    response = client.post("/v1/datasets", params=query, content=body, headers=headers)
    assert response.status_code == 201, response.text
    return dict(response.json())


def _spec(dataset_id: str, *, init: str | None = None, epsilon: float = 2.0) -> dict:
    return {
        "dataset_id": dataset_id,
        "model": {**MLP, **({"init": {"job_id": init}} if init else {})},
        "algorithm": {"name": "dp-sgd", "hyperparameters": {"clipping_norm": 1.0}},
        "privacy": {"target_epsilon": epsilon},
        "training": {"steps": 20, "batch_size": 64, "learning_rate": 0.5},
    }


def _run(client: TestClient, settings: Settings, database: Database, spec: dict, headers: dict | None = None) -> str:
    submitted = client.post("/v1/jobs", json=spec, headers=headers)
    assert submitted.status_code == 202, submitted.text
    job_id = str(submitted.json()["id"])
    assert JobRunner(settings, db=database).run(job_id) == "succeeded"
    return job_id


def _commit(database: Database, job_id: str) -> LedgerEntry:
    with database.read_session() as session:
        entry = session.scalar(select(LedgerEntry).where(LedgerEntry.job_id == job_id, LedgerEntry.kind == "COMMIT"))
        assert entry is not None
        session.expunge(entry)
        return entry


def _pld_epsilon(events: list[dict], delta: float) -> float:
    """dp-accounting's PLD of the composed Poisson-subsampled Gaussian steps (an independent
    accountant: connect-the-dots, pessimistic)."""
    accountant = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
    for event in events:
        for leaf in _leaves(event["event"]):
            assert leaf["kind"] == "poisson_subsampled_gaussian", leaf
            accountant.compose(
                dp_accounting.PoissonSampledDpEvent(
                    leaf["sampling_probability"], dp_accounting.GaussianDpEvent(leaf["noise_multiplier"])
                ),
                int(leaf["count"]),
            )
    return float(accountant.get_epsilon(delta))


def _leaves(event: dict) -> list[dict]:
    if event["kind"] == "composed":
        return [leaf for child in event["events"] for leaf in _leaves(child)]
    return [event]


def test_finetuning_from_an_own_private_job_on_the_same_rows_states_the_composed_bound(
    alice: TestClient, settings: Settings, database: Database
) -> None:
    X, _, y, _ = digits_split()
    dataset = upload(alice, to_csv(X, y)).json()  # type: ignore[attr-defined]
    first = _run(alice, settings, database, _spec(dataset["id"]))
    spec = _spec(dataset["id"], init=first)

    estimate = alice.post("/v1/jobs/estimate", json=spec)
    assert estimate.status_code == 200, estimate.text
    warned = estimate.json()["init_chain"]
    assert warned["reuses_this_data"] is True and warned["earlier_jobs_on_this_data"] == 1
    assert warned["epsilon_composed_ledger"] > estimate.json()["epsilon_ledger"]
    assert "use them again" in warned["notice"]

    second = _run(alice, settings, database, spec)
    report = alice.get(f"/v1/jobs/{second}/report").json()
    commits = [_commit(database, first), _commit(database, second)]
    delta = report["epsilon"]["delta"]
    # An independent composition: the ledger's own COMMIT curves, summed and converted at δ/|orders|.
    curve = privacy.add_curves(commits[0].curve, commits[1].curve)
    expected = privacy.ledger_epsilon(curve, delta)
    composed = report["epsilon"]["composed"]
    assert composed["ledger"] == pytest.approx(expected, rel=1e-12)
    assert composed["ledger"] > report["epsilon"]["ledger"] + 0.3  # both jobs' ε, not this job's alone
    assert composed["rdp_at_delta"] == pytest.approx(privacy.epsilon_from_rdp(curve, delta)[0], rel=1e-12)
    # The tight bound of the composition: a valid upper bound, so at least dp-accounting's PLD
    # (up to its discretisation), and never above the ledger-terms bound.
    pld = _pld_epsilon([commits[0].event, commits[1].event], delta)
    assert pld - 0.02 <= composed["tight_upper_bound"] <= composed["ledger"]
    assert composed["tight_upper_bound"] > report["epsilon"]["prv_upper_bound"]
    assert warned["epsilon_composed_ledger"] == pytest.approx(composed["ledger"], rel=1e-9)

    assert report["guarantee"].startswith(f"({format_guarantee(expected)}, {format_guarantee(delta)})-differential")
    assert "earlier job in its init chain" in report["guarantee"]
    assert report["caveats"][0].startswith("This model was fine-tuned from weights trained on the same rows")
    assert report["init"]["treated_as"] == "composed" and report["init"]["data"] == "this-dataset"
    assert [link["job_id"] for link in report["init"]["chain"]] == [first]
    assert report["init"]["origin"]["kind"] == "fresh"
    # The ledger charged each job once, when it ran: this job's charge is its own event's.
    assert report["epsilon"]["ledger"] == pytest.approx(privacy.ledger_epsilon(commits[1].curve, delta), rel=1e-12)
    assert report["ledger"]["charge"]["epsilon_committed"] == report["epsilon"]["ledger"]
    html = alice.get(f"/v1/jobs/{second}/report", params={"format": "html"}).text
    assert 'id="epsilon-composed"' in html and format_guarantee(expected) in html


def test_a_chain_of_three_composes_every_job_on_these_rows_and_names_the_other_dataset(
    alice: TestClient, settings: Settings, database: Database
) -> None:
    X, X_other, y, y_other = digits_split()
    here = upload(alice, to_csv(X, y)).json()  # type: ignore[attr-defined]
    there = upload(alice, to_csv(X_other, y_other), name="other").json()  # type: ignore[attr-defined]
    first = _run(alice, settings, database, _spec(here["id"], epsilon=1.0))
    middle = _run(alice, settings, database, _spec(there["id"], init=first, epsilon=1.5))
    last = _run(alice, settings, database, _spec(here["id"], init=middle, epsilon=2.0))

    # The middle job started from a job on another dataset: its guarantee is its own, and the
    # start is named with the guarantee its model keeps for that dataset.
    middle_report = alice.get(f"/v1/jobs/{middle}/report").json()
    assert "composed" not in middle_report["epsilon"]
    [other] = middle_report["init"]["other_datasets"]
    assert other["dataset_id"] == here["id"] and other["positions"] == [1]
    assert other["ledger"] == pytest.approx(privacy.ledger_epsilon(_commit(database, first).curve, other["delta"]))
    assert f"For dataset {here['id']} (#1)" in middle_report["init"]["statement"]
    assert middle_report["init"]["treated_as"] == "public"

    report = alice.get(f"/v1/jobs/{last}/report").json()
    delta = report["epsilon"]["delta"]
    curve = privacy.add_curves(_commit(database, last).curve, _commit(database, first).curve)
    assert report["epsilon"]["composed"]["positions"] == [2]
    assert report["epsilon"]["composed"]["ledger"] == pytest.approx(privacy.ledger_epsilon(curve, delta), rel=1e-12)
    [other] = report["init"]["other_datasets"]
    assert other["dataset_id"] == there["id"] and other["positions"] == [1]
    assert other["ledger"] == pytest.approx(
        privacy.ledger_epsilon(_commit(database, middle).curve, other["delta"]), rel=1e-12
    )
    assert [link["data"] for link in report["init"]["chain"]] == ["other-dataset", "this-dataset"]


def _hiv_csv(X: np.ndarray, y: np.ndarray) -> bytes:
    buffer = io.StringIO()
    buffer.write(",".join(f"x{i}" for i in range(X.shape[1])) + ",status\n")
    for row, label in zip(X, y, strict=True):
        buffer.write(",".join(repr(float(v)) for v in row) + (",hiv-positive\n" if label >= 5 else ",hiv-negative\n"))
    return buffer.getvalue().encode()


def test_a_reader_without_a_role_on_the_start_sees_no_foreign_id_class_epsilon_or_hash(
    alice: TestClient, bob: dict[str, str], settings: Settings, database: Database
) -> None:
    X, X_other, y, y_other = digits_split()
    hiv = upload(alice, _hiv_csv(X, y), name="hiv", label_column="status", classes="hiv-negative,hiv-positive").json()  # type: ignore[attr-defined]
    bobs = _upload_as(alice, bob, to_csv(X_other, y_other))
    share(alice, dataset_id=bobs["id"], owner=bob, grantee_name="alice", grantee=dict(alice.headers))
    start = _run(alice, settings, database, _spec(hiv["id"], epsilon=1.5))
    start_epsilon = alice.get(f"/v1/jobs/{start}").json()["epsilon"]
    start_sha = alice.get(f"/v1/jobs/{start}/model").headers["X-Content-SHA256"]
    finetuned = _run(alice, settings, database, _spec(bobs["id"], init=start))
    secrets = [hiv["id"], "hiv-negative", "hiv-positive", start, start_sha, repr(start_epsilon)]

    # Bob owns the dataset the fine-tuning ran on, and has no role on the start's dataset.
    assert alice.get(f"/v1/datasets/{hiv['id']}", headers=bob).status_code == 404
    seen = {
        "report": alice.get(f"/v1/jobs/{finetuned}/report", headers=bob),
        "html": alice.get(f"/v1/jobs/{finetuned}/report", headers=bob, params={"format": "html"}),
        "job": alice.get(f"/v1/jobs/{finetuned}", headers=bob),
        "jobs": alice.get("/v1/jobs", headers=bob, params={"dataset_id": bobs["id"]}),
    }
    for name, response in seen.items():
        assert response.status_code == 200, (name, response.text)
        for secret in secrets:
            assert secret not in response.text, (name, secret)
    section = seen["report"].json()["init"]
    assert section["visible"] == "none" and section["job_id"] is None and section["dataset_id"] is None
    assert section["classes"] is None and section["epsilon"] is None and section["sha256"] is None
    assert section["data"] == "other-dataset" and section["dataset_public"] is False
    assert "another job (not visible to you)" in section["statement"]
    [other] = section["other_datasets"]
    assert other["ledger"] is None and other["dataset_id"] is None
    assert seen["job"].json()["spec"]["init"]["chain"]["links"][0]["event"] is None

    # Alice ran both jobs: she sees every link in full.
    mine = alice.get(f"/v1/jobs/{finetuned}/report").json()["init"]
    assert (
        mine["job_id"] == start
        and mine["dataset_id"] == hiv["id"]
        and mine["classes"] == ["hiv-negative", "hiv-positive"]
    )
    assert mine["other_datasets"][0]["ledger"] is not None
    assert json.dumps(alice.get(f"/v1/jobs/{finetuned}").json()).count(hiv["id"]) >= 1


def test_only_a_job_whose_model_the_submitter_may_download_can_be_a_start(
    alice: TestClient, bob: dict[str, str], settings: Settings, database: Database
) -> None:
    X, X_other, y, y_other = digits_split()
    mine = upload(alice, to_csv(X, y)).json()  # type: ignore[attr-defined]
    start = _run(alice, settings, database, _spec(mine["id"]))
    bobs = _upload_as(alice, bob, to_csv(X_other, y_other))
    # Bob may not download alice's model, so he may not start from it: 404, as for no such job.
    assert alice.get(f"/v1/jobs/{start}/model", headers=bob).status_code == 404
    refused = alice.post("/v1/jobs", json=_spec(bobs["id"], init=start), headers=bob)
    unknown = alice.post("/v1/jobs", json=_spec(bobs["id"], init="job_000000000000000000000000"), headers=bob)
    assert refused.status_code == unknown.status_code == 404
    assert refused.json() == unknown.json()  # alike: nobody learns that another tenant's job exists
    assert refused.json()["detail"].startswith("model.init.job_id: no job whose model you may download")
    assert alice.post("/v1/jobs/estimate", json=_spec(bobs["id"], init=start), headers=bob).status_code == 404
    # Even as an analyst on alice's dataset he may not: another tenant's job there is not his to read.
    share(alice, dataset_id=mine["id"], grantee_name="bob", grantee=bob)
    assert alice.get(f"/v1/jobs/{start}/model", headers=bob).status_code == 404
    assert alice.post("/v1/jobs", json=_spec(mine["id"], init=start), headers=bob).status_code == 404


def test_a_tuning_that_starts_from_a_job_on_the_same_rows_warns_and_reports_the_composed_bound(
    alice: TestClient, settings: Settings, database: Database
) -> None:
    """The same for a private tuning: its estimate warns with the composed ε, and the report of the
    trial it releases composes the start's committed event with the tuning's whole event."""
    X, _, y, _ = digits_split()
    dataset = upload(alice, to_csv(X, y)).json()  # type: ignore[attr-defined]
    first = _run(alice, settings, database, _spec(dataset["id"]))
    base = _spec(dataset["id"], init=first, epsilon=1.0)
    # Five steps and twice the usual trial limit: this trial also loads its start's weights, and a
    # busy CI machine once pushed it past the shared 3 s limit.
    base["training"].update(steps=5, time_limit_s=2 * TRIAL_TIME_LIMIT_S)
    base["evaluation"] = {"holdout_fraction": 0.2, "mechanism": "laplace", "epsilon": 0.5}
    request = {
        "base": base,
        "search_space": {"training.learning_rate": [0.1, 0.5]},
        "trials": {"mean": 1.5, "maximum": 3},
        "selection": {"metric": "accuracy"},
    }
    estimate = alice.post("/v1/tuning-jobs/estimate", json=request).json()
    warned = estimate["init_chain"]
    assert warned["reuses_this_data"] is True and warned["epsilon_composed_ledger"] > estimate["epsilon_reserved"]
    tuning = alice.post("/v1/tuning-jobs", json=request).json()
    assert run_tuning(settings, database, tuning["job_id"]) == "succeeded"
    report = alice.get(f"/v1/jobs/{tuning['job_id']}/report").json()
    commits = [_commit(database, first), _commit(database, tuning["job_id"])]
    curve = privacy.add_curves(commits[0].curve, commits[1].curve)
    expected = privacy.ledger_epsilon(curve, report["epsilon"]["delta"])
    assert report["epsilon"]["composed"]["ledger"] == pytest.approx(expected, rel=1e-12)
    assert warned["epsilon_composed_ledger"] == pytest.approx(expected, rel=1e-9)
    assert report["caveats"][0].startswith("This job is a private hyperparameter tuning")
    assert report["init"]["treated_as"] == "composed"
