"""The report's ``init`` section: where a fine-tuned job's weights started, and what the jobs its
weights descend from (its init chain, kernel/base_models/init_chain.py) mean for its guarantee.

* Chain jobs on this job's rows (this dataset, or a byte-identical one under the same privacy
  unit) are composed into the guarantee: the guarantee sentence and ``epsilon.composed`` state the
  composition of their committed events with this job's (docs/privacy-model.md#init-chain).
* Chain jobs on other private datasets are named with the guarantee this model keeps for each of
  those datasets (their composition): the model is post-processing of their releases.
* Public datasets and base models give no guarantee and need none.

The stored section is the full view. Who sees which link's ids, ε and hash is decided when the
report is shown (:func:`init_for_viewer`, levels from kernel/reporting/init_visibility.py): its statements are
rendered from the section's fields, so a redacted section says only what its reader may know.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal

from algorithms import UnknownAlgorithm, get_algorithm
from kernel import privacy
from kernel.base_models.init_chain import COMPOSES_WITH_THIS_DATASET
from kernel.datasets.facts import privacy_unit_text
from privtrain_common.directed_rounding import format_guarantee

Level = Literal["job", "dataset", "none"]
"""What a reader may see of a chain job: everything (it may read the job), its dataset's public
facts only (it has a role on the dataset, not on the job), or neither."""

JOB_FIELDS: Final[tuple[str, ...]] = ("job_id", "sha256", "epsilon", "delta", "epsilon_prv", "event", "algorithm")
"""Facts of a chain job shown only to a reader of that job (as ``GET /v1/jobs/{id}`` would)."""

DATASET_FIELDS: Final[tuple[str, ...]] = ("dataset_id", "classes", "n_outputs", "privacy_unit_column", "group")
"""Facts of a chain job's dataset shown only to a reader with a role on it (or on the job)."""

COMPOSED_DEFINITION: Final[str] = (
    "the composition of this job's committed event with the committed events of the jobs in its init chain "
    "that trained on the same rows under the same privacy unit: their Rényi curves summed order-wise and "
    "converted at δ/|orders| (ledger), at δ (rdp_at_delta), and the smallest valid bound of the single-job "
    "methods for the composed event (tight_upper_bound). The ledger charged each of those jobs when it ran: "
    "nothing is charged again"
)

INIT_CHAIN_CAVEAT: Final[str] = (
    "This model was fine-tuned from weights trained on the same rows by earlier jobs (see init): its "
    "guarantee is the composition of their committed events with this job's, as stated above; the ledger "
    "charged each of them when it ran. Like every per-job number, the composed bound takes the events as "
    "they were committed, although this job's spec was chosen after those models were released; the bound "
    "that holds whatever was chosen after seeing them is the dataset's budget, which the ledger's filter "
    "enforces over every job."
)

OTHER_UNIT_CAVEAT: Final[str] = (
    "A job in this model's init chain trained on the same rows under another privacy unit (see init): its "
    "guarantee is per {other}, which does not compose into a guarantee per {this}. This report's guarantee "
    "covers this job's release; what the starting weights reveal about those rows is bounded only by that "
    "job's own guarantee."
)


def _zcdp_is_gaussian(algorithms: Sequence[str]) -> bool:
    """True only when every composed job's algorithm declares its zCDP leaves Gaussian."""
    try:
        return all(get_algorithm(name).zcdp_leaves_are_gaussian for name in algorithms)
    except UnknownAlgorithm:
        return False


def _composed_json(guarantee: privacy.ComposedGuarantee) -> dict[str, Any]:
    return {
        "jobs": guarantee.events,
        "delta": guarantee.delta,
        "ledger": guarantee.ledger_epsilon,
        "rdp_at_delta": guarantee.rdp_epsilon,
        "rdp_best_order": guarantee.rdp_order,
        "tight_upper_bound": guarantee.tight.epsilon,
        "tight_method": guarantee.tight.method,
        "tight_label": guarantee.tight.detail,
        "rdp_curve": list(guarantee.curve),
    }


def _compose(
    events: Sequence[dict[str, Any]], algorithms: Sequence[str], *, delta: float, numeric: bool
) -> dict[str, Any]:
    guarantee = privacy.compose_guarantee(
        [privacy.event_from_json(event) for event in events],
        delta,
        zcdp_is_gaussian=_zcdp_is_gaussian(algorithms),
        numeric=numeric,
    )
    return _composed_json(guarantee)


def chain_guarantees(
    init: Mapping[str, Any] | None,
    *,
    actual_event: dict[str, Any] | None,
    delta: float,
    algorithm: str,
    numeric: bool,
) -> dict[str, Any] | None:
    """The composed guarantees of a job's init chain, or None when it has no chain.

    ``this_dataset``: this job's committed ``actual_event`` (None on a public dataset) composed with
    every chain job on the same rows, at the job's ``delta``; None when no chain job used them.
    ``other_datasets``: per other private dataset (byte-identical copies together), its chain jobs'
    events composed at the δ of its latest chain job. ``numeric``: run the capped numeric
    accountants (the worker, before the commit transaction), else the closed forms (estimates)."""
    chain = None if init is None else init.get("chain")
    if not chain:
        return None
    links: list[dict[str, Any]] = chain["links"]
    same_rows = [link for link in links if link["data"] in COMPOSES_WITH_THIS_DATASET]
    missing = [link["position"] for link in same_rows if link.get("event") is None]
    this: dict[str, Any] | None = None
    if actual_event is not None and same_rows:
        known = [link for link in same_rows if link.get("event") is not None]
        this = {
            "positions": [link["position"] for link in same_rows],
            "missing_events": missing,
            **_compose(
                [actual_event, *(link["event"] for link in known)],
                [algorithm, *(link["algorithm"] for link in known)],
                delta=delta,
                numeric=numeric,
            ),
        }
    groups: dict[str, list[dict[str, Any]]] = {}
    for link in links:
        if link["dataset_public"] or link["data"] in COMPOSES_WITH_THIS_DATASET or link.get("event") is None:
            continue
        groups.setdefault(link.get("group") or link["dataset_id"], []).append(link)
    others = [
        {
            "dataset_id": members[0]["dataset_id"],
            "positions": [link["position"] for link in members],
            "privacy_unit_column": members[0]["privacy_unit_column"],
            "same_rows_other_unit": any(link["data"] == "same-content-other-unit" for link in members),
            **_compose(
                [link["event"] for link in members],
                [link["algorithm"] for link in members],
                delta=float(members[0]["delta"]),
                numeric=numeric,
            ),
        }
        for members in groups.values()
    ]
    return {"this_dataset": this, "other_datasets": others}


# ------------------------------------------------------------------------------------ statements


def _job_name(link: Mapping[str, Any], *, first: bool = False) -> str:
    if link.get("job_id") is None:
        return "another job (not visible to you)" if first else "a job not visible to you"
    sha = f" (SHA-256 {link['sha256']})" if first and link.get("sha256") else ""
    return f"job {link['job_id']}{sha}"


def _dataset_phrase(link: Mapping[str, Any], *, this_unit: str | None) -> str:
    dataset = link.get("dataset_id")
    data = link["data"]
    if data == "this-dataset":
        return "this same dataset"
    if data == "public-dataset":
        return f"public dataset {dataset}" if dataset else "a public dataset"
    named = f"dataset {dataset}" if dataset else "a private dataset you have no role on"
    if data == "same-content":
        return f"{named}, which holds the same rows under the same privacy unit"
    if data == "same-content-other-unit":
        unit = link.get("privacy_unit_column")
        other = "one row" if dataset and unit is None else f"one {unit}" if unit else "another privacy unit"
        return f"{named}, which holds the same rows under another privacy unit ({other}, here {this_unit})"
    return f"private {named}" if dataset else named


def _epsilon_phrase(block: Mapping[str, Any]) -> str:
    return (
        f"({format_guarantee(block['ledger'])}, {format_guarantee(block['delta'])}) in ledger terms, tightest ε "
        f"{format_guarantee(block['tight_upper_bound'])} ({block['tight_method']})"
    )


def _positions(positions: Sequence[int]) -> str:
    return ", ".join(f"#{p}" for p in positions)


def _origin_sentence(origin: Mapping[str, Any]) -> str:
    kind = origin.get("kind")
    if kind == "fresh":
        return "The chain began from a fresh, data-independent initialisation."
    if kind == "base-model":
        if origin.get("base_model_id") is None:
            return "The chain began from a base model (public pretrained weights) not visible to you."
        return (
            f"The chain began from base model {origin['base_model_id']} ({origin.get('name')!r}, source: "
            f"{origin.get('source') or 'not stated'}, SHA-256 {origin.get('sha256')}), public pretrained weights."
        )
    after = f" beyond job {origin['job_id']}" if origin.get("job_id") else ""
    return (
        f"The chain could not be followed{after}: what its weights started from is not known to this report, "
        "and any guarantee they carry is not stated here."
    )


def _link_sentence(link: Mapping[str, Any], *, this_unit: str | None) -> str:
    said = f"#{link['position']} {_job_name(link)} on {_dataset_phrase(link, this_unit=this_unit)}"
    if link.get("epsilon") is not None:
        said += f" (committed ε {format_guarantee(link['epsilon'])} at δ {format_guarantee(link['delta'])})"
    return said


def render_statement(section: Mapping[str, Any]) -> str:
    """The section's statement, from its (possibly redacted) fields only."""
    links: list[Mapping[str, Any]] = section.get("chain") or []
    this_unit = section.get("this_privacy_unit")
    start = links[0]
    said = [
        f"Training started from the model of {_job_name(start, first=True)}, trained on "
        f"{_dataset_phrase(start, this_unit=this_unit)}."
    ]
    if len(links) > 1:
        said.append(
            f"Its weights descend from {len(links)} jobs (its init chain, latest first): "
            + "; ".join(_link_sentence(link, this_unit=this_unit) for link in links)
            + "."
        )
    said.append(_origin_sentence(section.get("origin") or {}))
    this = section.get("this_dataset")
    if this is not None:
        many = len(this["positions"]) != 1
        said.append(
            f"The chain's job{'s' if many else ''} {_positions(this['positions'])} trained on the same rows as this "
            f"job: {'their' if many else 'its'} committed event{'s are' if many else ' is'} composed with this job's "
            f"into the guarantee above, {_epsilon_phrase(this)}; the ledger charged each job when it ran and "
            "charges nothing again."
        )
        if this.get("missing_events"):
            said.append(
                f"The committed events of {_positions(this['missing_events'])} could not be found: the composition "
                "above leaves them out, so it understates what this model reveals about these rows."
            )
    elif not section.get("public_dataset"):
        said.append(
            "No job in the chain trained on this dataset's rows: for them the starting weights are independent of "
            "the data, and are treated as public."
        )
    for other in section.get("other_datasets") or []:
        if other.get("ledger") is None:
            said.append(
                f"For the private dataset of {_positions(other['positions'])}, which you have no role on, this model "
                "keeps the guarantee of those jobs' releases (post-processing); it is shown to their readers only."
            )
            continue
        named = f"dataset {other['dataset_id']}" if other.get("dataset_id") else "their private dataset"
        said.append(
            f"For {named} ({_positions(other['positions'])}) this model is post-processing of those jobs' releases "
            f"and keeps their composed guarantee, {_epsilon_phrase(other)}, per "
            f"{privacy_unit_text(other.get('privacy_unit_column'))}."
        )
    for link in links:
        if link["data"] == "same-content-other-unit":
            said.append(
                f"#{link['position']} used this job's rows under another privacy unit: its guarantee does not "
                "compose into this one, and this report does not bound what the starting weights reveal about "
                "these rows beyond that job's own guarantee."
            )
    if section.get("new_head"):
        said.append(
            "Its classifier head was not reused: the start's outputs mean other classes (or another number of "
            "them), so the head started fresh."
        )
    return " ".join(said)


def _base_model_statement(provenance: Mapping[str, Any]) -> str:
    statement = (
        f"Training started from base model {provenance['base_model_id']} ({provenance['name']!r}, "
        f"source: {provenance.get('source') or 'not stated'}, SHA-256 {provenance['sha256']}), uploaded "
        "as public pretrained weights: they are treated as public, and this report covers nothing "
        "about the data they were trained on."
    )
    if provenance.get("archive_sha256"):
        statement += f" It was uploaded as a Transformers checkpoint ZIP with SHA-256 {provenance['archive_sha256']}."
    cast_from = [dtype for dtype in provenance.get("stored_dtypes") or [] if dtype != "F32"]
    if cast_from:
        statement += f" Its tensors were stored in {', '.join(cast_from)} and cast to F32 when loaded."
    if provenance.get("new_head"):
        statement += (
            " Its classifier head was not reused: the start's outputs mean other classes (or another number"
            " of them), so the head started fresh."
        )
    return statement


def _legacy_statement(provenance: Mapping[str, Any]) -> str:
    """A job's provenance stored before init chains were resolved (no ``chain``)."""
    where = "public" if provenance.get("dataset_public") else "private"
    who = (
        f"job {provenance['job_id']} (SHA-256 {provenance['sha256']}), trained on {where} dataset "
        f"{provenance['dataset_id']}"
        if provenance.get("job_id")
        else f"another job (not visible to you), trained on a {where} dataset"
    )
    statement = (
        f"Training started from the model of {who}: its weights are treated as public, and this report's "
        "guarantee covers this job's own release on its dataset (this job was submitted before init chains "
        "were composed into guarantees)."
    )
    if provenance.get("new_head"):
        statement += (
            " Its classifier head was not reused: the start's outputs mean other classes (or another number"
            " of them), so the head started fresh."
        )
    return statement


def init_section(
    provenance: Mapping[str, Any] | None,
    *,
    guarantees: Mapping[str, Any] | None = None,
    privacy_unit_column: str | None = None,
    public_dataset: bool = False,
) -> dict[str, Any] | None:
    """The stored (full) ``init`` section of a job whose spec holds ``provenance``.

    ``guarantees``: :func:`chain_guarantees` of its chain. ``privacy_unit_column``: this job's
    dataset's (its unit, in the statements); ``public_dataset``: this job's dataset is public."""
    if provenance is None:
        return None
    if provenance["kind"] == "base-model":
        return {**provenance, "treated_as": "public", "statement": _base_model_statement(provenance)}
    fields = {key: value for key, value in provenance.items() if key != "chain"}
    chain = provenance.get("chain")
    if chain is None:
        return {**fields, "treated_as": "public", "statement": _legacy_statement(provenance)}
    links = [dict(link, visible="job") for link in chain["links"]]
    this = None if guarantees is None else guarantees.get("this_dataset")
    section: dict[str, Any] = {
        **fields,
        "data": links[0]["data"],
        "treated_as": "composed" if links[0]["data"] in COMPOSES_WITH_THIS_DATASET else "public",
        "public_dataset": public_dataset,
        "this_privacy_unit": privacy_unit_text(privacy_unit_column),
        "chain": links,
        "origin": dict(chain["origin"]),
        "this_dataset": this,
        "other_datasets": [] if guarantees is None else [dict(o) for o in guarantees["other_datasets"]],
        "visible": "job",
    }
    section["statement"] = render_statement(section)
    return section


def apply_init_chain(report: dict[str, Any], section: dict[str, Any] | None, *, guarantee_unit: str) -> None:
    """Put ``section`` in ``report`` as ``init``; when the chain composed with this job's rows, the
    guarantee sentence, ``epsilon.composed`` and the caveats state the composed bound.

    The job's own numbers (``epsilon.ledger``, the ledger block) stay what it committed: the ledger
    charged every chain job when it ran, so its before/after and this job's charge are unchanged."""
    report["init"] = section
    if section is None:
        return
    this = section.get("this_dataset")
    if this is not None and "epsilon" in report:
        report["epsilon"]["composed"] = {**this, "definition": COMPOSED_DEFINITION}
        earlier = len(this["positions"])
        report["guarantee"] = (
            f"({format_guarantee(this['ledger'])}, {format_guarantee(this['delta'])})-differential privacy for "
            f"{guarantee_unit}: the composition of this job with the {earlier} earlier job"
            f"{'s' if earlier != 1 else ''} in its init chain that trained on the same rows (see init), their "
            f"committed events' Rényi curves summed order-wise; the tightest bound of the composition is ε "
            f"{format_guarantee(this['tight_upper_bound'])} ({this['tight_method']}). This job alone: "
            + report["guarantee"]
        )
        report["caveats"].insert(0, INIT_CHAIN_CAVEAT)
    for link in section.get("chain") or []:
        if link["data"] == "same-content-other-unit" and "caveats" in report:
            other = link.get("privacy_unit_column")
            report["caveats"].append(
                OTHER_UNIT_CAVEAT.format(other="one row" if other is None else f"one {other}", this=guarantee_unit)
            )


def estimate_notice(guarantees: Mapping[str, Any] | None, links: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The estimate's ``init_chain`` block (kernel.schemas.jobs.InitChainEstimate) of a planned job."""
    if guarantees is None:
        return None
    this = guarantees.get("this_dataset")
    others = guarantees.get("other_datasets") or []
    other_unit = any(link["data"] == "same-content-other-unit" for link in links)
    if this is not None:
        count = len(this["positions"])
        notice = (
            f"This job starts from weights trained on these same rows by {count} earlier job"
            f"{'s' if count != 1 else ''} in its init chain: it would use them again. The model it releases would be "
            f"({format_guarantee(this['ledger'])}, {format_guarantee(this['delta'])})-differentially private for "
            f"this dataset (this job's planned event composed with their committed events; tightest ε "
            f"{format_guarantee(this['tight_upper_bound'])}), and its report states that composed guarantee. The "
            "ledger charges only this job's epsilon_ledger: it charged the earlier jobs when they ran."
        )
    else:
        notice = (
            "No job in the init chain trained on this dataset's rows: the starting weights are independent of them."
        )
    if others:
        notice += (
            f" The starting weights were also trained on {len(others)} other private dataset"
            f"{'s' if len(others) != 1 else ''}: the released model keeps their own guarantees."
        )
    if other_unit:
        notice += (
            " A chain job trained on these rows under another privacy unit: its guarantee does not compose into "
            "this one."
        )
    return {
        "reuses_this_data": this is not None,
        "earlier_jobs_on_this_data": 0 if this is None else len(this["positions"]),
        "epsilon_composed_ledger": None if this is None else this["ledger"],
        "epsilon_composed_tight": None if this is None else this["tight_upper_bound"],
        "epsilon_composed_tight_method": None if this is None else this["tight_method"],
        "other_private_datasets": len(others),
        "same_rows_other_unit": other_unit,
        "notice": notice,
    }


# ------------------------------------------------------------------------------------ redaction


def _redact_link(link: dict[str, Any], level: Level) -> None:
    hidden = () if level == "job" else JOB_FIELDS if level == "dataset" else (*JOB_FIELDS, *DATASET_FIELDS)
    for field in hidden:
        if field in link:
            link[field] = None
    link["visible"] = level


def _redacted_origin(origin: Mapping[str, Any]) -> dict[str, Any]:
    """The chain's origin without the base model's (or the unfollowed job's) identity."""
    if origin.get("kind") == "base-model":
        return {"kind": "base-model", "base_model_id": None, "name": None, "source": None, "sha256": None}
    if origin.get("kind") == "unavailable":
        return {"kind": "unavailable", "job_id": None}
    return dict(origin)


def chain_positions(init: Mapping[str, Any] | None) -> dict[int, tuple[str | None, str | None]]:
    """(job id, dataset id) of each chain position of a job's provenance or report section."""
    if init is None or init.get("kind") != "job":
        return {}
    chain = init.get("chain")
    links = chain.get("links") if isinstance(chain, Mapping) else chain
    if not links:
        return {1: (init.get("job_id"), init.get("dataset_id"))}
    return {int(link["position"]): (link.get("job_id"), link.get("dataset_id")) for link in links}


def provenance_for_viewer(provenance: Mapping[str, Any] | None, levels: Mapping[int, Level]) -> dict[str, Any] | None:
    """A job spec's ``init`` (its provenance, with the chain) as a reader with ``levels`` may see it."""
    if provenance is None:
        return None
    shown = copy.deepcopy(dict(provenance))
    positions = chain_positions(shown)
    if all(levels.get(position, "none") == "job" for position in positions):
        return shown
    _redact_link(shown, levels.get(1, "none"))
    chain = shown.get("chain")
    if chain:
        for link in chain["links"]:
            _redact_link(link, levels.get(link["position"], "none"))
        if chain["links"] and levels.get(chain["links"][-1]["position"], "none") != "job":
            chain["origin"] = _redacted_origin(chain.get("origin") or {})
    return shown


def init_for_viewer(section: Mapping[str, Any] | None, levels: Mapping[int, Level]) -> dict[str, Any] | None:
    """``section`` as a reader with ``levels`` (per chain position; missing: "none") may see it.

    The start's own fields (the section's top level) are position 1. Statements are re-rendered
    from what is left, so no hidden id, class, ε or hash survives in the text."""
    if section is None or section.get("kind") != "job":
        return None if section is None else dict(section)
    shown = copy.deepcopy(dict(section))
    if all(levels.get(link["position"], "none") == "job" for link in shown.get("chain") or [{"position": 1}]):
        return shown
    start: Level = levels.get(1, "none")
    _redact_link(shown, start)
    if "chain" not in shown:  # stored before chains: its statement named the start
        shown["statement"] = _legacy_statement(shown)
        return shown
    by_position: dict[int, Level] = {}
    for link in shown["chain"]:
        by_position[link["position"]] = levels.get(link["position"], "none")
        _redact_link(link, by_position[link["position"]])
    if by_position.get(shown["chain"][-1]["position"] if shown["chain"] else 1, "none") != "job":
        shown["origin"] = _redacted_origin(shown.get("origin") or {})
    for other in shown.get("other_datasets") or []:
        level = min((by_position.get(p, "none") for p in other["positions"]), key=("none", "dataset", "job").index)
        if level != "job":
            for field in ("ledger", "rdp_at_delta", "rdp_best_order", "tight_upper_bound", "tight_method"):
                other[field] = None
            other["tight_label"] = None
            other["rdp_curve"] = None
            other["delta"] = None
        if level == "none":
            other["dataset_id"] = None
            other["privacy_unit_column"] = None
    shown["visible"] = start
    shown["statement"] = render_statement(shown)
    return shown
