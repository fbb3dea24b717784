"""An untouched budget shows exactly its ε: ε_G = 8 read 7.999… in the estimate, the budget, the
dashboard and the CLI (the closed form of the remaining ε landed a rounding error below ε_G and
backed off 1e-7 more). A job priced at the figure shown is admitted: admission is the truth."""

from __future__ import annotations

import json
import re
from pathlib import Path

from click.testing import CliRunner, Result
from fastapi.testclient import TestClient

from privtrain.cli import CliEnvironment, cli
from tests.client.conftest import BASE_URL, AppTransport
from tests.conftest import dp_sgd_spec
from tests.ui.html_probe import parse, text_of


def _cli(client: TestClient, *args: str) -> Result:
    key = client.headers["Authorization"].removeprefix("Bearer ")
    result = CliRunner().invoke(
        cli,
        list(args),
        obj=CliEnvironment(transport=AppTransport(client)),
        env={"PRIVTRAIN_URL": BASE_URL, "PRIVTRAIN_API_KEY": key},
    )
    assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)
    return result


def _shown(result: Result, label: str) -> str:
    (line,) = [line for line in result.stdout.splitlines() if line.startswith(label + "  ")]
    return re.split(r"\s{2,}", line, maxsplit=1)[1]


def _assert_exactly_eight_everywhere(alice: TestClient, dataset_id: str, spec_file: Path) -> None:
    budget = alice.get(f"/v1/datasets/{dataset_id}/budget").json()
    assert budget["remaining_epsilon"] == 8.0 and budget["committed_epsilon"] == budget["reserved_epsilon"] == 0.0
    estimate = alice.post("/v1/jobs/estimate", json=dp_sgd_spec(dataset_id)).json()
    assert estimate["budget_remaining_epsilon"] == 8.0
    page = parse(alice.get(f"/ui/datasets/{dataset_id}").text)
    (card,) = [e for e in page.with_attr("data-field", "remaining_epsilon")]
    assert float(card.attrs["data-value"]) == 8.0 and text_of(card) == "8"
    assert _shown(_cli(alice, "datasets", "budget", dataset_id), "remaining ε") == "8"
    spec_file.write_text(json.dumps(dp_sgd_spec(dataset_id)))
    assert _shown(_cli(alice, "jobs", "estimate", "--spec", str(spec_file)), "budget remaining ε") == "8"


def test_an_untouched_budget_shows_exactly_its_epsilon_everywhere(
    alice: TestClient, dataset_id: str, tmp_path: Path
) -> None:
    spec_file = tmp_path / "spec.json"
    _assert_exactly_eight_everywhere(alice, dataset_id, spec_file)
    # a job cancelled before it started gives its whole reservation back: untouched again
    job = alice.post("/v1/jobs", json=dp_sgd_spec(dataset_id)).json()
    assert alice.get(f"/v1/datasets/{dataset_id}/budget").json()["remaining_epsilon"] < 8.0
    assert alice.post(f"/v1/jobs/{job['id']}/cancel").status_code == 202
    _assert_exactly_eight_everywhere(alice, dataset_id, spec_file)
    # the figure shown is what the filter admits: a job calibrated to ε 8 is admitted
    admitted = alice.post("/v1/jobs", json=dp_sgd_spec(dataset_id, target_epsilon=8.0))
    assert admitted.status_code == 202, admitted.text
    assert alice.post("/v1/jobs", json=dp_sgd_spec(dataset_id, target_epsilon=8.0)).status_code == 409
