"""The init chain's report section without a server (kernel/base_models/init_chain.py,
kernel/reporting/init_report.py): which links compose with this dataset, the guarantees of the
others, and what each kind of reader sees of a link."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kernel import privacy
from kernel.base_models.init_chain import data_relation
from kernel.db.orm import Dataset
from kernel.reporting.init_report import (
    apply_init_chain,
    chain_guarantees,
    init_for_viewer,
    init_section,
    provenance_for_viewer,
)


def _dataset(id_: str, *, sha: str = "a" * 64, unit: str | None = None, public: bool = False) -> Dataset:
    return Dataset(id=id_, sha256=sha, privacy_unit_column=unit, public=public)


def test_the_data_relation_of_a_chain_job() -> None:
    here = _dataset("ds_here", unit="patient")
    assert data_relation(_dataset("ds_here", unit="patient"), here) == "this-dataset"
    assert data_relation(_dataset("ds_copy", unit="patient"), here) == "same-content"
    assert data_relation(_dataset("ds_rows"), here) == "same-content-other-unit"
    assert data_relation(_dataset("ds_other", sha="b" * 64, unit="patient"), here) == "other-dataset"
    assert data_relation(_dataset("ds_pub", public=True), here) == "public-dataset"
    assert data_relation(_dataset("ds_copy"), _dataset("ds_pub_here", public=True)) == "other-dataset"


def _event(sigma: float, steps: int = 50) -> dict[str, Any]:
    return privacy.event_to_json(
        privacy.PoissonSampledGaussianEvent(sampling_probability=0.02, noise_multiplier=sigma, count=steps)
    )


def _link(position: int, data: str, *, dataset: str, sigma: float | None = 1.0, **extra: Any) -> dict[str, Any]:
    public = data == "public-dataset"
    return {
        "position": position,
        "job_id": f"job_{position}",
        "dataset_id": dataset,
        "dataset_public": public,
        "data": data,
        "privacy_unit_column": extra.get("unit"),
        "algorithm": "dp-sgd",
        "sha256": f"{position}" * 64,
        "classes": ["hiv-negative", "hiv-positive"] if dataset == "ds_hiv" else ["neg", "pos"],
        "epsilon": None if public else 1.5,
        "delta": None if public else 1e-6,
        "epsilon_prv": None,
        "event": None if public or sigma is None else _event(sigma),
        "group": extra.get("group", None if public else dataset),
    }


def _provenance(links: list[dict[str, Any]], origin: dict[str, Any] | None = None) -> dict[str, Any]:
    start = links[0]
    return {
        "kind": "job",
        "job_id": start["job_id"],
        "dataset_id": start["dataset_id"],
        "dataset_public": start["dataset_public"],
        "sha256": start["sha256"],
        "architecture": "mlp",
        "n_outputs": 2,
        "epsilon": start["epsilon"],
        "delta": start["delta"],
        "classes": start["classes"],
        "new_head": False,
        "chain": {"links": links, "origin": origin or {"kind": "fresh"}},
    }


def test_links_on_the_same_rows_compose_and_copies_of_other_rows_are_grouped() -> None:
    links = [
        _link(1, "other-dataset", dataset="ds_a", sigma=2.0),
        _link(2, "same-content", dataset="ds_copy", sigma=1.5, group="ds_here"),
        _link(3, "other-dataset", dataset="ds_a_copy", sigma=3.0, group="ds_a"),
        _link(4, "public-dataset", dataset="ds_pub"),
        _link(5, "this-dataset", dataset="ds_here", sigma=1.2, group="ds_here"),
    ]
    own = _event(1.0)
    found = chain_guarantees(_provenance(links), actual_event=own, delta=1e-5, algorithm="dp-sgd", numeric=False)
    assert found is not None
    this = found["this_dataset"]
    assert this["positions"] == [2, 5] and this["missing_events"] == []
    expected = privacy.summed_curve([privacy.event_from_json(e) for e in (own, links[1]["event"], links[4]["event"])])
    assert this["rdp_curve"] == list(expected)
    assert this["ledger"] == privacy.ledger_epsilon(expected, 1e-5)
    [other] = found["other_datasets"]  # ds_a and its byte-identical copy: the same rows, composed
    assert other["dataset_id"] == "ds_a" and other["positions"] == [1, 3] and other["delta"] == 1e-6
    both = privacy.summed_curve(
        [privacy.event_from_json(links[0]["event"]), privacy.event_from_json(links[2]["event"])]
    )
    assert other["ledger"] == privacy.ledger_epsilon(both, 1e-6)


def test_a_link_without_its_committed_event_is_said_to_be_missing() -> None:
    links = [_link(1, "this-dataset", dataset="ds_here", sigma=None, group="ds_here")]
    found = chain_guarantees(
        _provenance(links), actual_event=_event(1.0), delta=1e-5, algorithm="dp-sgd", numeric=False
    )
    assert found is not None and found["this_dataset"]["missing_events"] == [1]
    section = init_section(_provenance(links), guarantees=found)
    assert section is not None and "could not be found" in section["statement"]


def test_the_same_rows_under_another_unit_do_not_compose_and_the_report_says_so() -> None:
    links = [_link(1, "same-content-other-unit", dataset="ds_rows", sigma=1.0, unit=None)]
    provenance = _provenance(links)
    found = chain_guarantees(provenance, actual_event=_event(1.0), delta=1e-5, algorithm="dp-sgd", numeric=False)
    assert found is not None and found["this_dataset"] is None
    assert found["other_datasets"][0]["positions"] == [1] and found["other_datasets"][0]["same_rows_other_unit"]
    section = init_section(provenance, guarantees=found, privacy_unit_column="patient")
    assert section is not None and section["treated_as"] == "public"
    report: dict[str, Any] = {
        "guarantee": "(1, 1e-05)-differential privacy for one patient",
        "caveats": [],
        "epsilon": {},
    }
    apply_init_chain(report, section, guarantee_unit="one patient (all of their rows together)")
    assert "composed" not in report["epsilon"] and report["guarantee"].startswith("(1, 1e-05)")
    assert "does not compose into a guarantee per one patient" in report["caveats"][-1]
    assert "another privacy unit (one row, here one patient and all its rows)" in section["statement"]


def _full_section() -> dict[str, Any]:
    links = [
        _link(1, "other-dataset", dataset="ds_hiv", sigma=2.0),
        _link(2, "this-dataset", dataset="ds_here", sigma=1.5, group="ds_here"),
    ]
    origin = {"kind": "base-model", "base_model_id": "bm_x", "name": "pre", "source": "web", "sha256": "f" * 64}
    provenance = _provenance(links, origin)
    found = chain_guarantees(provenance, actual_event=_event(1.0), delta=1e-5, algorithm="dp-sgd", numeric=False)
    section = init_section(provenance, guarantees=found)
    assert section is not None
    return section


HIDDEN_FROM_STRANGERS = ("job_1", "ds_hiv", "hiv-negative", "1" * 64, "bm_x", "f" * 64, "'pre'")


def test_a_reader_of_every_link_sees_the_section_as_stored() -> None:
    section = _full_section()
    assert init_for_viewer(section, {1: "job", 2: "job"}) == section
    for secret in HIDDEN_FROM_STRANGERS:
        assert secret in json.dumps(section, ensure_ascii=False)


def test_a_reader_with_a_role_on_the_dataset_only_sees_its_public_facts() -> None:
    shown = init_for_viewer(_full_section(), {1: "dataset", 2: "job"})
    assert shown is not None and shown["visible"] == "dataset"
    assert shown["dataset_id"] == "ds_hiv" and shown["classes"] == ["hiv-negative", "hiv-positive"]
    assert shown["job_id"] is None and shown["sha256"] is None and shown["epsilon"] is None
    assert shown["chain"][0]["event"] is None and shown["chain"][1]["job_id"] == "job_2"
    [other] = shown["other_datasets"]
    assert other["dataset_id"] == "ds_hiv" and other["ledger"] is None
    text = json.dumps(shown, ensure_ascii=False)
    for secret in ("job_1", "1" * 64):
        assert secret not in text
    assert "another job (not visible to you)" in shown["statement"]


@pytest.mark.parametrize("levels", [{}, {2: "job"}, {1: "none", 2: "dataset"}])
def test_a_stranger_sees_where_the_weights_came_from_and_nothing_that_identifies_it(levels: dict) -> None:
    section = _full_section()
    shown = init_for_viewer(section, levels)
    assert shown is not None
    text = json.dumps(shown, ensure_ascii=False)
    # The base model the deepest job started from is shown to that job's readers only.
    deepest_visible = levels.get(2) == "job"
    for secret in HIDDEN_FROM_STRANGERS[:4] if deepest_visible else HIDDEN_FROM_STRANGERS:
        assert secret not in text, secret
    assert shown["data"] == "other-dataset" and shown["dataset_public"] is False
    assert shown["this_dataset"] == section["this_dataset"]  # this dataset's guarantee stays whole
    assert "a private dataset you have no role on" in shown["statement"]
    assert ("base model bm_x" in shown["statement"]) is deepest_visible
    assert ("base model (public pretrained weights) not visible to you" in shown["statement"]) is not deepest_visible
    assert section["job_id"] == "job_1"  # the stored section is never modified


def test_a_specs_provenance_is_redacted_alike() -> None:
    links = [_link(1, "other-dataset", dataset="ds_hiv", sigma=2.0)]
    provenance = _provenance(links)
    assert provenance_for_viewer(provenance, {1: "job"}) == provenance
    shown = provenance_for_viewer(provenance, {1: "none"})
    assert shown is not None
    text = json.dumps(shown)
    for secret in ("job_1", "ds_hiv", "hiv-negative", "1" * 64):
        assert secret not in text
    assert shown["chain"]["links"][0]["data"] == "other-dataset"


def test_a_section_stored_before_chains_is_redacted_too() -> None:
    legacy = {
        "kind": "job",
        "job_id": "job_1",
        "dataset_id": "ds_hiv",
        "dataset_public": False,
        "sha256": "1" * 64,
        "architecture": "mlp",
        "n_outputs": 2,
        "epsilon": 1.5,
        "delta": 1e-6,
        "classes": ["hiv-negative", "hiv-positive"],
        "treated_as": "public",
        "statement": "Training started from the model of job job_1 (SHA-256 111…), trained on private dataset ds_hiv",
    }
    shown = init_for_viewer(legacy, {})
    assert shown is not None
    text = json.dumps(shown)
    for secret in ("job_1", "ds_hiv", "hiv-negative", "1" * 64):
        assert secret not in text
    assert "another job (not visible to you)" in shown["statement"]


def test_a_public_datasets_job_names_the_private_start_with_its_guarantee() -> None:
    """Fine-tuning on a public dataset gives no guarantee for it, but the model keeps the start's."""
    provenance = _provenance([_link(1, "other-dataset", dataset="ds_private", sigma=1.0)])
    found = chain_guarantees(provenance, actual_event=None, delta=1e-5, algorithm="dp-sgd", numeric=False)
    assert found is not None and found["this_dataset"] is None
    section = init_section(provenance, guarantees=found, public_dataset=True)
    assert section is not None and section["other_datasets"][0]["dataset_id"] == "ds_private"
    assert "For dataset ds_private (#1) this model is post-processing" in section["statement"]
    assert "No job in the chain trained on this dataset" not in section["statement"]
