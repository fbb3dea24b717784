"""A typed view of a job's stored spec: what the service wrote into ``Job.spec``, parsed.

Why models apart from the request's (kernel/schemas/jobs.py): a stored spec is a record, not a
request. It holds what admission added (the normalised parameters, the starting weights'
provenance ``init``, a tuning's ``tuning`` section, the released trial's ``selected``), and rows
written by earlier releases lack newer fields and may hold values outside today's request ranges.
So these models check shapes and types, never ranges or cross-field rules (the worker re-validates
what it runs with the request models), and every field added after the first release has a
default: an older row still parses. A row's keys are kept: :meth:`StoredModel.to_json` gives back
exactly the dict that was stored, and is the one way a spec change is written back.

Read a job's spec with :func:`stored_spec`; nothing outside kernel/schemas indexes ``spec["…"]``
(tests/unit/test_stored_spec_reads.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Final, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from kernel.schemas.jobs import EvaluationSpec, JobCreate, TrainingSpec

DataRelation = Literal["this-dataset", "same-content", "same-content-other-unit", "other-dataset", "public-dataset"]
"""How an init-chain job's training data relates to the new job's dataset."""


class StoredModel(BaseModel):
    """A part of a stored spec: unknown keys are refused (a row the service never wrote), values
    are not re-checked against today's request ranges."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    def to_json(self, *, exclude: set[str] | None = None) -> dict[str, Any]:
        """The stored dict: the keys it was parsed from (or built with), nothing added."""
        return self.model_dump(exclude_unset=True, exclude=exclude)


# ---------------------------------------------------------------------------- the request's parts


class StoredModelInit(StoredModel):
    """``model.init`` as requested (since model.init existed)."""

    base_model_id: str | None = None
    job_id: str | None = None


class StoredModelChoice(StoredModel):
    name: str
    params: dict[str, Any]
    """The architecture's parameters as the planner normalised them (defaults filled in)."""
    init: StoredModelInit | None = None
    """Absent in rows written before model.init existed."""


class StoredAlgorithm(StoredModel):
    name: str
    hyperparameters: dict[str, Any]
    """As the algorithm validated them (defaults filled in)."""


class StoredPrivacy(StoredModel):
    target_epsilon: float | None
    noise_multiplier: float | None
    delta: float | None
    """The δ the job was priced at (the planner fills in the dataset's)."""


class StoredLora(StoredModel):
    rank: int
    alpha: float
    dropout: float = 0.0
    target_modules: list[str] | None = None
    """`hf` models: the layers PEFT puts adapters on (None: the family's default)."""


class StoredTraining(StoredModel):
    """``training`` as the algorithm validated it; fields after ``learning_rate`` came later."""

    epochs: float | None
    steps: int | None
    batch_size: int | None
    learning_rate: float | None
    finetune: Literal["full", "head", "last_k_blocks", "lora"] | None = None
    finetune_k: int | None = None
    lora: StoredLora | None = None
    token_loss: Literal["mean", "sum"] | None = None
    ema_decay: float | None = None
    augmult: int | None = None
    rows_per_unit: int | None = None
    precision: Literal["fp32", "bf16"] | None = None
    time_limit_s: float | None = None

    def validated(self) -> TrainingSpec:
        """The request model, re-validated (the worker trusts no stored value it runs with)."""
        return TrainingSpec.model_validate(self.to_json())


class StoredEvaluation(StoredModel):
    holdout_fraction: float
    mechanism: Literal["laplace", "gaussian"]
    epsilon: float | None
    noise_multiplier: float | None
    error_clip: float | None
    loss_clip: float | None = None
    """Absent in rows written before text datasets."""

    def validated(self) -> EvaluationSpec:
        """The request model, re-validated (as :meth:`StoredTraining.validated`)."""
        return EvaluationSpec.model_validate(self.to_json())


class StoredResources(StoredModel):
    queue: str | None


# ---------------------------------------------------------------------------- where weights start


class ChainLink(StoredModel):
    """One job of an init chain (kernel/base_models/init_chain.py), as resolved at submission."""

    position: int
    job_id: str
    dataset_id: str
    dataset_public: bool
    data: DataRelation
    privacy_unit_column: str | None
    algorithm: str
    sha256: str | None
    classes: list[str] | None
    epsilon: float | None
    delta: float | None
    epsilon_prv: float | None
    event: dict[str, Any] | None
    """The committed event (privacy event JSON); None on a public dataset."""
    group: str | None
    """The id naming the rows the link trained on (None on a public dataset)."""


class ChainOrigin(StoredModel):
    """Where the deepest chain job's weights started."""

    kind: Literal["fresh", "base-model", "unavailable"]
    base_model_id: str | None = None
    name: str | None = None
    source: str | None = None
    sha256: str | None = None
    job_id: str | None = None
    """``unavailable``: the job the walk could not follow."""


class InitChain(StoredModel):
    links: list[ChainLink]
    origin: ChainOrigin


class BaseModelStart(StoredModel):
    """``init`` of a job that starts from a base model (public pretrained weights)."""

    kind: Literal["base-model"]
    base_model_id: str
    name: str
    source: str | None
    sha256: str
    architecture: str
    n_outputs: int
    stored_dtypes: list[str] | None = None
    """The dtypes the file was uploaded in; absent in older rows."""
    new_head: bool | None = None
    """Whether the head started fresh; absent in rows written before heads were reused."""
    archive_sha256: str | None = None
    """format=hf: SHA-256 of the ZIP as uploaded (``sha256`` is the stored weights file's)."""


class JobStart(StoredModel):
    """``init`` of a job that starts from a succeeded job's model."""

    kind: Literal["job"]
    job_id: str
    dataset_id: str
    dataset_public: bool
    sha256: str
    architecture: str
    n_outputs: int
    epsilon: float | None
    delta: float | None
    classes: list[str] | None = None
    """The start dataset's class list; absent in rows written before heads were reused."""
    chain: InitChain | None = None
    """Absent in rows written before init chains were resolved."""
    new_head: bool | None = None


StartProvenance = Annotated[BaseModelStart | JobStart, Field(discriminator="kind")]
"""The stored ``init``: where a job's weights started, as its report states it."""


# ---------------------------------------------------------------------------- a tuning's section


class StoredSearchRange(StoredModel):
    low: float
    high: float
    log: bool


class StoredTrials(StoredModel):
    """The public distribution of the number of trials (never the number)."""

    distribution: Literal["truncated-negative-binomial", "poisson"]
    parameters: dict[str, float]
    maximum: int | None = None
    """Absent in tunings admitted before maximums existed."""
    mean: float


class StoredSchedule(StoredModel):
    """A tuning's public slots, fixed at admission."""

    slots: int
    trial_time_limit_s: float
    slot_seconds: float
    parallel_slots: int


class StoredSelection(StoredModel):
    metric: Literal["accuracy", "mse", "perplexity"]
    goal: Literal["max", "min"]


class StoredCandidate(StoredModel):
    """One configuration of a tuning's pool, planned as a job."""

    assignment: dict[str, Any]
    spec: StoredJobSpec
    noise_multiplier: float
    sampling_probability: float
    steps: int
    epsilon_ledger: float


PUBLIC_CANDIDATE_EXCLUDES: Final[set[str]] = {"spec"}
"""What a tuning's view leaves out of each candidate."""


class StoredTuning(StoredModel):
    search_space: dict[str, list[Any] | StoredSearchRange]
    trials: StoredTrials
    schedule: StoredSchedule | None = None
    """Absent in tunings admitted before slots existed (the worker refuses them)."""
    selection: StoredSelection
    epsilon_one_trial: float
    epsilon_separate_jobs: float
    candidates: list[StoredCandidate]
    selected: dict[str, Any] | None = None
    """The released trial's assignment: set when the tuning succeeds."""

    def search_space_json(self) -> dict[str, Any]:
        return {
            path: values if isinstance(values, list) else values.to_json() for path, values in self.search_space.items()
        }

    def public_candidates(self) -> list[dict[str, Any]]:
        """The pool as a tuning's view shows it: each configuration without its spec."""
        return [candidate.to_json(exclude=PUBLIC_CANDIDATE_EXCLUDES) for candidate in self.candidates]


# ---------------------------------------------------------------------------- the whole spec


class StoredJobSpec(StoredModel):
    """``Job.spec``: the request as admitted, with what admission added."""

    dataset_id: str
    model: StoredModelChoice
    algorithm: StoredAlgorithm
    privacy: StoredPrivacy | None
    """None for the non-private optimizers."""
    training: StoredTraining
    evaluation: StoredEvaluation | None = None
    """Absent in rows written before DP evaluation existed."""
    resources: StoredResources | None = None
    """Absent in rows written before queues existed."""
    init: StartProvenance | None = None
    """Where the weights started (absent for a fresh initialisation)."""
    tuning: StoredTuning | None = None
    """A tuning's section (absent for a plain job and a tuning's candidates)."""

    @property
    def is_tuning(self) -> bool:
        return self.tuning is not None

    def with_tuning(self, tuning: StoredTuning) -> StoredJobSpec:
        """A tuning's carrier spec: this (its first candidate's) spec with the tuning's section."""
        return self.model_copy(update={"tuning": tuning})

    def released_trial(self, candidate: StoredCandidate) -> StoredJobSpec:
        """A succeeded tuning's spec: the released candidate's, with this tuning's section and the
        candidate's assignment as ``selected``."""
        if self.tuning is None:
            raise ValueError("only a tuning releases a trial")
        selected = self.tuning.model_copy(update={"selected": candidate.assignment})
        return candidate.spec.model_copy(update={"tuning": selected})


StoredCandidate.model_rebuild()


def parse_stored_spec(raw: Mapping[str, Any]) -> StoredJobSpec:
    """A stored spec dict (``Job.spec``, or a column selected on its own), validated."""
    return StoredJobSpec.model_validate(raw)


class HasSpec(Protocol):
    """A job row, a job plan: anything that carries a stored spec dict."""

    @property
    def spec(self) -> dict[str, Any]: ...


_CACHE_KEY: Final[str] = "_stored_spec_view"


def stored_spec(holder: HasSpec) -> StoredJobSpec:
    """The typed view of ``holder.spec``, parsed once per object and spec dict.

    Cached in the object's ``__dict__`` (job rows, frozen plans alike) beside the dict it was
    parsed from: a spec assigned anew (a tuning that succeeds) is parsed again. A spec dict is never
    changed in place (write a change with :meth:`StoredModel.to_json`)."""
    raw = holder.spec
    slots = getattr(holder, "__dict__", None)
    cached = None if slots is None else slots.get(_CACHE_KEY)
    if cached is not None and cached[0] is raw:
        parsed: StoredJobSpec = cached[1]
        return parsed
    parsed = parse_stored_spec(raw)
    if slots is not None:
        slots[_CACHE_KEY] = (raw, parsed)
    return parsed


def admitted_spec(
    request: JobCreate,
    *,
    params: dict[str, Any],
    hyperparameters: dict[str, Any],
    training: TrainingSpec,
    delta: float,
    init: Mapping[str, Any] | None,
) -> StoredJobSpec:
    """The spec an admitted job stores: the request with the model's normalised ``params``, the
    algorithm's validated ``hyperparameters`` and ``training``, the δ it is priced at, and where
    its weights start (``init``, the provenance its report states)."""
    stored = request.model_dump(mode="json")
    stored["model"]["params"] = params
    stored["algorithm"]["hyperparameters"] = hyperparameters
    stored["training"] = training.model_dump(mode="json")
    if stored["privacy"] is not None:
        stored["privacy"]["delta"] = delta
    if init is not None:
        stored["init"] = dict(init)
    return parse_stored_spec(stored)
