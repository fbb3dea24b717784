"""Job specs as clients send them. Unknown fields are rejected, never ignored."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator, model_validator

from kernel.privacy.ranges import DELTA_MIN, NOISE_MULTIPLIER_MAX, NOISE_MULTIPLIER_MIN, range_text
from kernel.schemas.renamed import WithRenamedFields, deprecated_alias
from kernel.schemas.types import UtcDateTime

_SIGMA_RANGE = range_text(NOISE_MULTIPLIER_MIN, NOISE_MULTIPLIER_MAX)
_DELTA_RANGE = range_text(DELTA_MIN, 1.0, high_open=True)


def _sigma_field(description: str) -> Any:
    """σ's documented range, checked by :func:`_check_sigma` so the message states the range."""
    return Field(
        default=None,
        description=f"{description}; within {_SIGMA_RANGE}",
        json_schema_extra={"minimum": NOISE_MULTIPLIER_MIN, "maximum": NOISE_MULTIPLIER_MAX},
    )


def _check_sigma(value: float | None) -> float | None:
    if value is not None and not NOISE_MULTIPLIER_MIN <= value <= NOISE_MULTIPLIER_MAX:
        raise ValueError(f"noise_multiplier must be in {_SIGMA_RANGE}, got {value!r}")
    return value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class ModelInit(_Strict):
    """Where a job's weights start: a base model of the caller's, or a succeeded job's model the
    caller may read (docs/pretraining-and-finetuning.md). Exactly one of the two."""

    base_model_id: str | None = Field(default=None, min_length=1, max_length=64)
    job_id: str | None = Field(default=None, min_length=1, max_length=64)

    @model_validator(mode="after")
    def _exactly_one(self) -> ModelInit:
        if (self.base_model_id is None) == (self.job_id is None):
            raise ValueError("give exactly one of base_model_id and job_id")
        return self


class ModelChoice(_Strict):
    name: str = Field(min_length=1, max_length=64, examples=["mlp"])
    params: dict[str, Any] = Field(default_factory=dict)
    init: ModelInit | None = Field(
        default=None,
        description="start from these weights (treated as public) instead of a fresh initialisation; "
        "the architecture, params and input shape must match, the output layer may differ",
    )


class AlgorithmChoice(_Strict):
    name: str = Field(min_length=1, max_length=64, examples=["dp-sgd"])
    hyperparameters: dict[str, Any] = Field(default_factory=dict)


class PrivacySpec(_Strict):
    """Either a target ε (the server calibrates σ) or an explicit noise multiplier σ."""

    target_epsilon: float | None = Field(default=None, gt=0, le=100)
    noise_multiplier: float | None = _sigma_field("σ: noise std / sensitivity (the algorithm's one scalar)")
    delta: float | None = Field(
        default=None,
        description=f"defaults to the dataset's δ; within {_DELTA_RANGE}",
        json_schema_extra={"minimum": DELTA_MIN, "exclusiveMaximum": 1},
    )

    _sigma_in_range = field_validator("noise_multiplier")(_check_sigma)

    @field_validator("delta")
    @classmethod
    def _delta_in_range(cls, value: float | None) -> float | None:
        if value is not None and not DELTA_MIN <= value < 1.0:
            raise ValueError(f"delta must be in {_DELTA_RANGE}, got {value!r}")
        return value

    @model_validator(mode="after")
    def _exactly_one(self) -> PrivacySpec:
        if (self.target_epsilon is None) == (self.noise_multiplier is None):
            raise ValueError("give exactly one of target_epsilon and noise_multiplier")
        return self


class LoraSpec(_Strict):
    """LoRA adapters (``training.finetune: lora``): rank r and scale alpha, the update (alpha/r)·B·A."""

    rank: int = Field(ge=1, le=256, description="r: the adapters' inner width")
    alpha: float = Field(default=16.0, gt=0, le=1024, description="the adapters' output is scaled by alpha / rank")
    dropout: float = Field(
        default=0.0,
        description="dropout on the adapters' input: 0 only, as everywhere in a DP job's model (a random "
        "forward would give each example a gradient that differs per call, and the exact per-example "
        "engines need one)",
    )
    target_modules: list[Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")]] | None = Field(
        default=None,
        min_length=1,
        max_length=16,
        description="`hf` models only: the names of the layers that get adapters (PEFT's target_modules, "
        "matched on the last part of a module's name); default: the family's attention projections. "
        "GET /v1/models lists each family's defaults and the names it accepts (lora_targets of hf)",
    )

    @field_validator("dropout")
    @classmethod
    def _no_dropout(cls, value: float) -> float:
        if value != 0:
            raise ValueError(
                f"lora dropout must be 0, got {value}: a random forward would give each example a gradient that "
                "differs per call, and the exact per-example engines need one"
            )
        return value


class TrainingSpec(_Strict):
    """How long to train and, for the algorithms that read them, the batch size and step size.

    ``batch_size`` and ``learning_rate`` are required by the algorithms that use them and refused
    by the others (full-batch and single-pass ones; ``GET /v1/algorithms/{name}`` lists each
    algorithm's ``training_fields``)."""

    epochs: float | None = Field(default=None, gt=0, le=10_000)
    steps: int | None = Field(default=None, ge=1)
    batch_size: int | None = Field(
        default=None,
        ge=1,
        description="expected batch size q·n of Poisson sampling; only for algorithms that "
        "sample batches (full-batch ones record n themselves)",
    )
    learning_rate: float | None = Field(
        default=None,
        gt=0,
        le=1000,
        description="step size; only for algorithms that take one (others set their own steps)",
    )
    finetune: Literal["full", "head", "last_k_blocks", "lora"] | None = Field(
        default=None,
        description="with model.init: which parameters train. full (the default): all; head: only the "
        "last parameterised module (the classifier); last_k_blocks: the last finetune_k of the model's "
        "fine-tuning blocks (GET /v1/models lists them); lora: low-rank adapters on the attention and "
        "MLP Linear layers of a transformer (training.lora). The others are frozen",
    )
    finetune_k: int | None = Field(
        default=None, ge=1, le=1000, description="k of last_k_blocks (required there; at most the model's block count)"
    )
    lora: LoraSpec | None = Field(
        default=None,
        description="rank and alpha of the adapters of finetune lora (required there, and only there); the "
        "released model holds the merged weights W + (alpha/rank)·B·A in the plain architecture",
    )
    token_loss: Literal["mean", "sum"] | None = Field(
        default=None,
        description="language-model datasets only: a row's loss is the mean (the default) or the sum of its "
        "next-token losses over its non-padding tokens; either way one row is one privacy unit",
    )
    ema_decay: float | None = Field(
        default=None,
        gt=0,
        lt=1,
        description="release an exponential moving average of the iterates, w̄ ← d·w̄ + (1 − d)·w after "
        "every step starting from the initial weights (e.g. 0.999), instead of the last iterate: "
        "post-processing, no privacy cost; only for the per-step algorithms that list it",
    )
    augmult: int | None = Field(
        default=None,
        ge=1,
        le=32,
        description="augmentation multiplicity K, image datasets only: each sampled image is seen as K "
        "random crops (zero padding) with random horizontal flips, and its gradient is the mean over "
        "the K views before clipping, so the privacy charge is the same for every K (K times the "
        "compute); only for the algorithms that list it",
    )
    rows_per_unit: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description="datasets with a privacy unit column only: how many of a sampled unit's rows make its "
        "gradient (default 4). The worker picks them at random (all of a unit's rows, repeated evenly, when "
        "it has fewer), and the unit's gradient is their mean, clipped as one: the privacy charge is the same "
        "for every value (it times the compute); only for the algorithms that train per unit",
    )
    precision: Literal["fp32", "bf16"] | None = Field(
        default=None,
        description="arithmetic of the model's forward and backward: fp32 (the default) or bf16 mixed "
        "precision (autocast; parameters, per-sample norms, clipping and noise stay float32, so the "
        "privacy charge is the same); faster on GPUs with bf16 tensor cores, slower on CPUs; only for "
        "the algorithms that list it",
    )
    time_limit_s: float | None = Field(
        default=None,
        gt=0,
        le=30 * 86_400,
        description="stop the job after this long (its reservation is then committed); at most "
        "the service's PRIVTRAIN_JOB_TIME_LIMIT_S, which is also the default",
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> TrainingSpec:
        if (self.epochs is None) == (self.steps is None):
            raise ValueError("give exactly one of epochs and steps")
        if (self.finetune == "last_k_blocks") != (self.finetune_k is not None):
            raise ValueError("finetune_k is required with finetune last_k_blocks, and only there")
        if (self.finetune == "lora") != (self.lora is not None):
            raise ValueError("lora (rank and alpha) is required with finetune lora, and only there")
        return self


class EvaluationSpec(_Strict):
    """A DP evaluation on a held-out part of the rows, released through a charged mechanism.

    Rows are held out by independent per-row coin flips (probability ``holdout_fraction``) and
    never used for training. The released value is (sum over held-out rows + noise) divided by
    the public expected hold-out size f·n: the number of correct predictions (classification,
    sensitivity 1), the sum of squared errors clipped to [0, ``error_clip``] (regression,
    sensitivity ``error_clip``) or the sum of each row's mean token loss clipped to
    [0, ``loss_clip``] (language model, released as perplexity, sensitivity ``loss_clip``).
    """

    holdout_fraction: float = Field(gt=0, le=0.5)
    mechanism: Literal["laplace", "gaussian"] = "laplace"
    epsilon: float | None = Field(default=None, gt=0, le=10, description="Laplace: pure ε of the released metric")
    noise_multiplier: float | None = _sigma_field("Gaussian: noise std / sensitivity")
    error_clip: float | None = Field(
        default=None, gt=0, le=1e12, description="regression: public bound on a squared error"
    )
    loss_clip: float | None = Field(
        default=None,
        gt=0,
        le=100,
        description="language model: public bound, in nats, on one row's mean token loss; default 2·ln(vocab_size)",
    )

    _sigma_in_range = field_validator("noise_multiplier")(_check_sigma)

    @model_validator(mode="after")
    def _mechanism_parameter(self) -> EvaluationSpec:
        if self.mechanism == "laplace" and (self.epsilon is None or self.noise_multiplier is not None):
            raise ValueError("the laplace mechanism takes epsilon (and no noise_multiplier)")
        if self.mechanism == "gaussian" and (self.noise_multiplier is None or self.epsilon is not None):
            raise ValueError("the gaussian mechanism takes noise_multiplier (and no epsilon)")
        return self


class JobResources(_Strict):
    queue: str | None = Field(
        default=None,
        pattern=r"^[a-z0-9][a-z0-9-]{0,39}$",
        description="the worker queue to run on (one of the service's PRIVTRAIN_QUEUES, e.g. gpu-h100); "
        "by default the model's size decides: small models on the CPU queue, the others on the GPU queue",
    )


class JobCreate(_Strict):
    dataset_id: str = Field(min_length=1, max_length=64)
    model: ModelChoice
    algorithm: AlgorithmChoice
    privacy: PrivacySpec | None = Field(
        default=None,
        description="required by every DP algorithm; left out for the non-private optimizers "
        "(sgd, adam), which run on public datasets only",
    )
    training: TrainingSpec
    evaluation: EvaluationSpec | None = None
    resources: JobResources | None = None


class InitChainEstimate(BaseModel):
    """The estimate's warning that a fine-tuning job would use the same rows again."""

    reuses_this_data: bool = Field(
        description="true when a job in the init chain trained on this dataset's rows (this dataset, or one "
        "with the same content and privacy unit): this job would use them again"
    )
    earlier_jobs_on_this_data: int = Field(description="how many chain jobs trained on these rows")
    epsilon_composed_ledger: float | None = Field(
        description="the ε (at this job's δ, ledger terms) of the released model's guarantee for this dataset: "
        "this job's planned event composed with those jobs' committed events; null when none reuses the data. "
        "The ledger charges only epsilon_ledger: it charged the earlier jobs when they ran"
    )
    epsilon_composed_tight: float | None = Field(
        description="the tightest bound of that composition the closed forms give (the report may improve it "
        "with the numeric accountants)"
    )
    epsilon_composed_tight_method: str | None = None
    other_private_datasets: int = Field(
        description="how many other private datasets the starting weights were trained on: the released model "
        "keeps their own guarantees (named in the report to those who may see them)"
    )
    same_rows_other_unit: bool = Field(
        description="true when a chain job trained on these rows under another privacy unit: its guarantee does "
        "not compose into this one"
    )
    notice: str


class PrivacyEstimate(WithRenamedFields):
    noise_multiplier: float
    sampling_probability: float
    steps: int
    delta: float
    epsilon_reserved: float = Field(
        description="ε at δ of the planned run from its RDP curve (the ledger's currency): what admission reserves, "
        "the most the job can commit"
    )
    epsilon_single_job: float | None = Field(
        description="the tightest valid single-job ε upper bound the service computes for the planned run "
        "alone (PRV, PLD, exact Gaussian-DP, optimal pure-DP composition or RDP; epsilon_single_job_method says "
        "which; never below a valid bound, never above epsilon_reserved); not used by the ledger"
    )
    epsilon_single_job_method: str | None = Field(
        default=None,
        description="which method produced epsilon_single_job: prv, pld, gaussian-dp, pure-dp-optimal, "
        "rdp-single-job or rdp (the ledger's own number)",
    )
    epsilon_ledger: float = deprecated_alias("epsilon_ledger")
    epsilon_prv: float | None = deprecated_alias("epsilon_prv")
    epsilon_prv_method: str | None = deprecated_alias("epsilon_prv_method")
    noise_std_on_sum: float
    sensitivity: float
    admissible: bool
    witness_order: float | None
    public_dataset: bool = Field(
        default=False,
        description="true when the dataset was declared public by its owner: it has no budget, the "
        "job is charged nothing and every epsilon field here is 0 or null",
    )
    budget_remaining_epsilon: float | None = Field(
        description="null on a public dataset (it has no budget). The dataset's unused budget as "
        "one number: the largest ε a job shaped like a "
        "plain Gaussian mechanism (RDP ρ·α) could be calibrated to and still fit now. It is the "
        "same for every spec, so it compares datasets and moments; what THIS spec can still get "
        "is largest_admissible_epsilon, which differs because the filter's capacity is a curve "
        "over Rényi orders and a job uses it by its own curve's shape (DP-SGD's subsampled "
        "Gaussian fits more ε into the same room; see docs/epsilon.md#two-numbers-for-what-is-left)"
    )
    budget_remaining_after_epsilon: float | None = Field(
        default=None,
        description="budget_remaining_epsilon as the ledger would show it right after admitting "
        "this job (its curve added to committed + reserved); null when the job is not admissible",
    )
    largest_admissible_epsilon: float | None = Field(
        description="null on a public dataset. The largest target ε this spec (same steps, sampling and "
        "evaluation) could be given and still be admitted now: the ledger ε of smallest_admissible_noise_multiplier. "
        "Measured with this spec's own curve, so it may exceed budget_remaining_epsilon"
    )
    smallest_admissible_noise_multiplier: float | None = Field(
        default=None,
        description="the smallest σ (within relative 1e-6, admitted side) that admits this spec's "
        "steps now, in the accepted range of privacy.noise_multiplier; null with "
        "smallest_admissible_noise_multiplier_reason when none does",
    )
    smallest_admissible_noise_multiplier_reason: str | None = Field(
        default=None, description="why smallest_admissible_noise_multiplier is null"
    )
    largest_admissible_steps: int | None = Field(
        default=None,
        description="the most training.steps this spec could run at its σ (noise_multiplier) and "
        "still be admitted now, at most the service's step limit (as epochs: steps × "
        "sampling_probability); null with largest_admissible_steps_reason when the algorithm's "
        "charge does not grow with steps or not even one step fits",
    )
    largest_admissible_steps_reason: str | None = Field(
        default=None, description="why largest_admissible_steps is null"
    )
    evaluation_epsilon: float | None = Field(
        default=None, description="ledger ε of the DP evaluation alone (part of epsilon_reserved)"
    )
    evaluation_interval: dict[str, Any] | None = Field(
        default=None,
        description="with an evaluation block: how wide the released metric's 95% interval will be (the noise's "
        "half-width on the metric; for accuracy and MSE the whole interval at the middle of the metric's range, "
        "for perplexity the factor the noise alone spans), computed from public values before anything is spent",
    )
    init_chain: InitChainEstimate | None = Field(
        default=None,
        description="with model.init naming a job: what the jobs the starting weights descend from mean for "
        "the guarantee of the model this job would release (docs/pretraining-and-finetuning.md#the-init-chain)",
    )


class JobOut(WithRenamedFields):
    id: str
    dataset_id: str
    status: str
    algorithm: str
    model: str
    queue: str | None = Field(default=None, description="the worker queue the job runs on")
    spec: dict[str, Any]
    privacy: PrivacyEstimate | None = None
    noise_multiplier: float
    steps_planned: int
    steps_run: int
    delta: float
    epsilon: float = Field(
        description="the job's ε at delta: epsilon_committed once it has ended (succeeded, failed "
        "or cancelled), epsilon_reserved while it is queued or running; epsilon_basis says which"
    )
    epsilon_basis: Literal["reserved", "committed"] = Field(
        description="'committed': what the job spent; 'reserved': what the ledger holds for it now"
    )
    epsilon_reserved: float = Field(
        description="the reservation: ledger ε of the planned run, held while the job runs. "
        "A job that stops early or is cancelled commits less and the rest is released"
    )
    epsilon_committed: float | None = Field(
        default=None,
        description="ledger ε of what the job actually spent (its COMMIT entry; 0 when its whole "
        "reservation was released); null until the job ends",
    )
    epsilon_single_job: float | None = Field(
        description="the tightest valid single-job ε (never above the ledger ε) of what epsilon counts, on "
        "the same basis: the run it committed once it has ended (the steps a cancelled job ran, the whole "
        "reservation a failed one committed, 0 when it spent nothing), the planned run while it is queued "
        "or running. Null on a public dataset, and for a job that ended without succeeding before this "
        "number was computed for what it committed. The job's report names the method"
    )
    epsilon_ledger: float = deprecated_alias("epsilon_ledger")
    epsilon_prv: float | None = deprecated_alias("epsilon_prv")
    attempt: int
    cancel_requested: bool
    error_code: str | None
    metrics: dict[str, Any] | None = Field(
        default=None, description="DP-released evaluation metrics, with their mechanism"
    )
    created_at: UtcDateTime
    started_at: UtcDateTime | None
    finished_at: UtcDateTime | None
    links: dict[str, str]


class JobList(BaseModel):
    items: list[JobOut]
    next_cursor: str | None


class JobEventOut(BaseModel):
    seq: int
    kind: str
    payload: dict[str, Any]
    created_at: UtcDateTime
