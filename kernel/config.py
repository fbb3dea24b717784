"""Service settings, read from the environment (prefix ``PRIVTRAIN_``).

The embedded defaults (SQLite + filesystem broker under the data dir) let a fresh clone run with no
other servers; ``Settings.check_safe`` refuses the development conveniences outside development.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class UnsafeSettingsError(RuntimeError):
    """Raised at start when a production deployment uses a development-only default."""


class Settings(BaseSettings):
    """All configuration of the API and the worker; both read the same variables."""

    model_config = SettingsConfigDict(env_prefix="PRIVTRAIN_", extra="ignore")

    environment: Literal["development", "test", "production"] = Field(
        default="development",
        description="production refuses SQLite, the filesystem broker, a missing dashboard session "
        "secret and PRIVTRAIN_SECURE_NOISE=false",
    )
    data_dir: Path = Field(
        default=Path(".privtrain"),
        description="blobs (datasets, models, reports), the SQLite file, broker folders, checkpoints",
    )
    database_url: str | None = Field(default=None, description="SQLAlchemy URL; default: SQLite file in the data dir")
    storage_url: str | None = Field(
        default=None,
        description="where blobs live: file:///path, or s3://bucket/prefix for any S3-compatible store "
        "(endpoint and credentials from AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY); "
        "default: the blobs folder of the data dir",
    )
    download_mode: Literal["stream", "presigned"] = Field(
        default="stream",
        description="how models are downloaded: streamed by the API, or (with an s3:// store) a 307 redirect to "
        "a short-lived pre-signed URL of the object store, after the same tenant checks",
    )
    presigned_url_ttl_s: int = Field(
        default=300, ge=10, le=3600, description="how long a pre-signed download URL stays valid"
    )
    blob_cache_max_bytes: int = Field(
        default=20 * 1024**3,
        gt=0,
        description="with an object store: local copies of blobs (datasets, models) kept on this host's disk, "
        "least recently used evicted first",
    )
    broker_url: str | None = Field(
        default=None, description="Celery broker; default: kombu filesystem:// in the data dir"
    )
    bootstrap_api_key: str | None = Field(
        default=None,
        description="if set (at least 24 characters), registered for the 'default' tenant at start; never echoed",
    )
    max_upload_bytes: int = Field(default=512 * 1024 * 1024, gt=0, description="larger uploads are refused (413)")
    max_rows: int = Field(default=1_000_000, gt=0, description="most rows a dataset may have")
    max_features: int = Field(default=100_000, gt=0, description="most features a dataset may have")
    max_steps: int = Field(default=1_000_000, gt=0, description="the most optimizer steps a job may plan")
    task_queue: str = Field(default="gpu", description="the queue of jobs whose model needs a GPU")
    cpu_queue: str = Field(default="cpu", description="the queue of jobs small enough for a CPU worker")
    cpu_job_max_parameters: int = Field(
        default=1_000_000,
        ge=0,
        description="a job whose model has at most this many trainable parameters goes to the CPU queue "
        "(unless its spec names a queue), so small jobs never wait behind GPU jobs",
    )
    queues: str = Field(
        default="gpu,cpu",
        description="comma-separated queues a job may name in resources.queue (e.g. gpu-h100,gpu,cpu)",
    )
    worker_queues: str | None = Field(
        default=None,
        description="comma-separated queues this worker takes jobs from (e.g. gpu-h100,gpu or cpu); "
        "default: every queue in PRIVTRAIN_QUEUES",
    )
    heartbeat_interval_s: float = Field(
        default=5.0, gt=0, description="how often a worker reports progress and checks for a cancel"
    )
    checkpoint_every_steps: int = Field(
        default=200,
        ge=0,
        description="training checkpoints every this many steps, kept on worker storage only (0: off)",
    )
    max_attempts: int = Field(
        default=3,
        ge=1,
        le=20,
        description="attempts of a job whose worker vanished, all inside one reservation",
    )
    job_time_limit_s: float = Field(
        default=24 * 3600.0, gt=0, description="a job running longer is stopped; its reservation is committed"
    )
    redis_visibility_timeout_s: float = Field(
        default=90_000.0,
        gt=0,
        description="Redis redelivers an unacknowledged job message after this long; every job "
        "time limit must stay below it, or a long job would be handed to a second worker",
    )
    stale_after_s: float = Field(
        default=60.0, gt=0, description="a running job without a heartbeat for this long is lost"
    )
    redispatch_after_s: float = Field(default=120.0, gt=0, description="re-send a queued job's message after this long")
    dispatch_per_tenant: int = Field(
        default=4,
        ge=1,
        le=10_000,
        description="at most this many of a tenant's jobs wait in the broker at a time; the rest wait in the "
        "database and are sent round robin over tenants as workers take jobs (fair sharing)",
    )
    tuning_parallel_trials: int = Field(
        default=4,
        ge=1,
        le=256,
        description="a tuning has at most this many of its slots waiting in the broker or running at a time, "
        "on as many free workers (1: one after another); other tenants' jobs take their turns between them",
    )
    tuning_max_trials: int = Field(
        default=100,
        ge=1,
        le=10_000,
        description="the largest public maximum number of trials (trials.maximum) a tuning may name: each "
        "possible trial is a slot of worker time that is used whether or not the trial was drawn",
    )
    tuning_slot_margin_s: float = Field(
        default=30.0,
        gt=0,
        le=86_400,
        description="added to a tuning's per-trial time limit to make its slot length: the time one slot "
        "takes for evaluating the trial and storing its model; a slot that runs past it fails the tuning",
    )
    reconcile_interval_s: float = Field(
        default=15.0, gt=0, description="how often the reconciler loop runs inside the API process"
    )
    worker_sweep_interval_s: float = Field(
        default=60.0,
        gt=0,
        description="how often each worker host deletes what settled jobs left on it (checkpoints, hold-out "
        "splits) and its cached copies of blobs erased since (a deleted dataset's upload and arrays)",
    )
    rate_limit_per_minute: float = Field(
        default=1200.0,
        ge=0,
        le=1e7,
        description="requests per minute per API key and API process (0: no limit)",
    )
    rate_limit_burst: int = Field(
        default=200, ge=1, le=1_000_000, description="the token bucket's size: requests one key may burst"
    )
    generation_per_minute: float = Field(
        default=10.0,
        gt=0,
        le=1e6,
        description="text generation requests per minute per API key and API process (each runs a model)",
    )
    generation_burst: int = Field(default=5, ge=1, le=10_000, description="text generation requests one key may burst")
    generation_max_concurrent: int = Field(
        default=2, ge=1, le=1_000, description="text generation processes in flight per API process"
    )
    generation_timeout_s: float = Field(
        default=60.0, gt=0, le=3600, description="wall-clock limit of one text generation process"
    )
    max_active_jobs_per_tenant: int = Field(
        default=50, ge=1, le=1_000_000, description="queued + running jobs a tenant may have at once"
    )
    sse_poll_interval_s: float = Field(
        default=0.5, gt=0, le=60, description="how often an event stream checks for new job events"
    )
    sse_keepalive_s: float = Field(
        default=15.0, gt=0, le=300, description="idle time before an event stream sends a keep-alive"
    )
    sse_max_stream_s: float = Field(
        default=300.0,
        gt=0,
        le=86_400,
        description="an event stream ends after this long; clients resume with Last-Event-ID",
    )
    sse_max_streams_per_key: int = Field(
        default=8,
        ge=1,
        le=100_000,
        description="open event streams one API key may hold per API process (Bearer and dashboard "
        "together); past it a new stream is a 429 too-many-streams",
    )
    sse_max_streams_total: int = Field(
        default=256,
        ge=1,
        le=1_000_000,
        description="open event streams per API process, all keys together; past it a 429",
    )
    run_reconciler: bool = Field(default=True, description="run the reconciler loop inside the API process")
    max_physical_batch_size: int = Field(
        default=256,
        gt=0,
        description="rows per per-sample-gradient chunk (bounds memory, never changes results)",
    )
    gpu_max_physical_batch_size: int = Field(
        default=2048,
        gt=0,
        description="on a GPU worker, rows per per-sample-gradient chunk (max_physical_batch_size is "
        "the CPU's): a GPU needs large chunks to stay busy, since each chunk costs the host a fixed "
        "time to launch its kernels; memory stays bounded by gpu_activation_memory_fraction",
    )
    gpu_activation_memory_fraction: float = Field(
        default=0.4,
        gt=0,
        le=0.9,
        description="on a GPU worker, the float32 memory one per-sample-gradient chunk may take, as a "
        "fraction of the device's memory (never less than max_activation_bytes)",
    )
    data_on_device_max_fraction: float = Field(
        default=0.3,
        ge=0,
        le=0.9,
        description="on a GPU worker, an image dataset's uint8 array is copied to the device when it "
        "takes at most this fraction of the device's memory (sampling and augmentation then stay on "
        "the device); larger ones are memory-mapped and read batch by batch. 0: always memory-mapped",
    )
    max_model_parameters: int = Field(
        default=50_000_000,
        gt=0,
        description="a job whose model (with its params, on the dataset's feature shape) has more "
        "trainable parameters is refused at estimate and submission (422 model-incompatible)",
    )
    max_activation_bytes: int = Field(
        default=8 * 1024**3,
        gt=0,
        description="float32 memory one per-sample-gradient chunk may take for its activations and "
        "per-sample gradients: a job's chunks are max_physical_batch_size rows or fewer to fit it, "
        "and a model whose single row needs more is refused",
    )
    max_decompressed_bytes: int = Field(
        default=1024**3,
        gt=0,
        description="an NPZ upload whose members declare more uncompressed bytes is refused before "
        "anything is decompressed (parsing needs about twice this in API memory)",
    )
    max_compression_ratio: int = Field(
        default=200,
        gt=0,
        description="an NPZ upload may decompress to at most this many times its size on disk "
        "(beyond the first 64 MiB)",
    )
    max_image_files: int = Field(
        default=200_000,
        gt=0,
        description="a ZIP image upload with more image files is refused (422 invalid-dataset, "
        "too-many-files) from its directory, before any image is decoded",
    )
    max_image_pixels: int = Field(
        default=16_777_216,
        gt=0,
        description="width × height of one uploaded image (PNG/JPEG in a ZIP); a larger one is refused "
        "from its header (image-too-large) before it is decoded, and Pillow's decompression-bomb guard "
        "enforces the same bound while decoding. The decoded uint8 array of the whole dataset is bounded "
        "by PRIVTRAIN_MAX_DECOMPRESSED_BYTES",
    )
    max_image_decode_bytes: int = Field(
        default=4 * 1024**3,
        gt=0,
        description="what all images of one ZIP upload may decode to, summed: width × height × channels "
        "of each, read from its header before any image is decoded (uint8: one byte a value, before any "
        "resizing to image_size=). More is refused (422 invalid-dataset, too-many-pixels)",
    )
    max_image_decode_ratio: int = Field(
        default=200,
        gt=0,
        description="what the images of a ZIP upload may decode to (as for PRIVTRAIN_MAX_IMAGE_DECODE_BYTES), "
        "as a multiple of the upload's size, beyond the first 64 MiB: a few KB of PNG can declare a "
        "16-megapixel canvas. More is refused (422 invalid-dataset, pixel-amplification) before decoding",
    )
    max_tokenizer_bytes: int = Field(
        default=64 * 1024**2,
        gt=0,
        description="size of an uploaded tokenizer.json (POST /v1/tokenizers); a larger one is refused (413) "
        "before it is read",
    )
    upload_parse_deadline_s: float = Field(
        default=600.0,
        gt=0,
        le=86_400,
        description="the longest an upload's parsing and validation may take once its body has arrived; "
        "past it the upload is refused (413 parse-deadline-exceeded) and nothing is stored. Parsing also "
        "stops, and the upload slot is freed, as soon as the client disconnects",
    )
    max_text_records: int = Field(
        default=1_000_000,
        gt=0,
        description="records (non-blank lines) one JSON Lines text upload may hold; more are refused "
        "(422 jsonl-too-many-records)",
    )
    max_text_line_bytes: int = Field(
        default=1_048_576,
        gt=0,
        description="bytes in one line of a JSON Lines text upload; a longer line is refused "
        "(422 jsonl-line-too-long) before it is parsed",
    )
    max_text_length: int = Field(
        default=4096,
        gt=0,
        description="the largest max_length (tokens kept per text row) a text upload may declare",
    )
    max_tokenizer_vocab: int = Field(
        default=262_144,
        gt=0,
        description="tokens a tokenizer may have, uploaded (POST /v1/tokenizers) or trained",
    )
    max_concurrent_uploads: int = Field(
        default=4, gt=0, description="uploads the API process parses at once, all tenants together"
    )
    max_concurrent_uploads_per_tenant: int = Field(
        default=2, gt=0, description="uploads one tenant may have in flight at once per API process"
    )
    max_concurrent_plans: int = Field(
        default=2,
        gt=0,
        description="privacy computations (estimates, submissions) in flight per API process; pricing is "
        "pure-Python CPU work serialised by the interpreter lock, so more slots add contention, not throughput",
    )
    max_concurrent_plans_per_key: int = Field(
        default=1, gt=0, description="privacy computations one API key may have in flight per API process"
    )
    max_concurrent_requests: int = Field(
        default=32,
        ge=1,
        le=100_000,
        description="requests in flight per API process, all callers together (health probes not counted); past it "
        "a 429 too-many-concurrent-requests. The thread pool of sync routes is sized to this plus 8, so an "
        "admitted request never waits for a thread",
    )
    max_concurrent_requests_per_tenant: int = Field(
        default=8,
        ge=1,
        le=100_000,
        description="requests in flight per API process for one tenant, all its API keys and dashboard sessions "
        "together; past it a 429 too-many-concurrent-requests",
    )
    max_concurrent_requests_per_key: int = Field(
        default=6,
        ge=1,
        le=100_000,
        description="requests in flight per API process for one API key (Bearer and dashboard together); past it "
        "a 429 too-many-concurrent-requests",
    )
    max_concurrent_requests_per_address: int = Field(
        default=8,
        ge=1,
        le=100_000,
        description="requests in flight per API process from one client address without a valid API key "
        "(anonymous, unknown or revoked key); past it a 429 too-many-concurrent-requests",
    )
    max_concurrent_unverified_requests: int = Field(
        default=16,
        ge=1,
        le=100_000,
        description="requests in flight per API process without a valid API key, all addresses together, so that "
        "they never take the slots of verified callers; past it a 429 too-many-concurrent-requests",
    )
    upload_idle_timeout_s: float = Field(
        default=30.0, gt=0, le=3600, description="an upload that sends nothing for this long is refused (408)"
    )
    upload_min_rate_bytes_per_s: float = Field(
        default=16_384.0,
        gt=0,
        description="after the grace period, an upload slower than this on average is refused (408)",
    )
    upload_rate_grace_s: float = Field(
        default=10.0, ge=0, le=3600, description="seconds before the minimum upload rate is enforced"
    )
    secure_noise: bool = Field(
        default=True,
        description="Gaussian noise in secure mode (each value the sum of 4 draws / 2, against "
        "floating-point attacks on the sampler; Holohan & Braghin 2021); can only be turned off "
        "outside production (benchmarks, tests)",
    )
    ui_session_secret: SecretStr | None = Field(
        default=None,
        description="signs the dashboard's session cookies (at least 32 characters); required in "
        "production; elsewhere a random key kept in the data dir is used",
    )
    ui_session_max_age_s: float = Field(
        default=8 * 3600.0, gt=0, le=30 * 86_400, description="a dashboard login lasts this long"
    )
    metrics_token: SecretStr | None = Field(
        default=None,
        description="if set, /metrics requires 'Authorization: Bearer <token>' and adds the "
        "per-dataset ε gauges (labelled by dataset id); unset, /metrics is open and aggregate only",
    )
    log_level: str = Field(
        default="INFO", description="JSON logs on stderr at this level; they never contain private values"
    )
    host: str = Field(
        default="127.0.0.1",
        min_length=1,
        description="the address `privtrain-admin serve` listens on (0.0.0.0: every interface; "
        "`serve --host` overrides it)",
    )
    port: int = Field(
        default=8000,
        ge=1,
        le=65535,
        description="the port `privtrain-admin serve` listens on (`serve --port` overrides it)",
    )

    @field_validator("bootstrap_api_key")
    @classmethod
    def _key_long_enough(cls, value: str | None) -> str | None:
        if value is not None and len(value) < 24:
            raise ValueError("PRIVTRAIN_BOOTSTRAP_API_KEY must be at least 24 characters")
        return value

    @field_validator("ui_session_secret")
    @classmethod
    def _secret_long_enough(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value()) < 32:
            raise ValueError("PRIVTRAIN_UI_SESSION_SECRET must be at least 32 characters")
        return value

    @model_validator(mode="after")
    def _time_limit_below_visibility_timeout(self) -> Settings:
        if not self.uses_filesystem_broker and self.job_time_limit_s >= self.redis_visibility_timeout_s:
            raise ValueError(
                f"PRIVTRAIN_JOB_TIME_LIMIT_S ({self.job_time_limit_s:g}) must be below "
                f"PRIVTRAIN_REDIS_VISIBILITY_TIMEOUT_S ({self.redis_visibility_timeout_s:g}) with a "
                "Redis broker"
            )
        return self

    @property
    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'privtrain.db').resolve()}"

    @property
    def resolved_broker_url(self) -> str:
        return self.broker_url or "filesystem://"

    @property
    def uses_filesystem_broker(self) -> bool:
        return self.resolved_broker_url.startswith("filesystem://")

    @property
    def broker_dir(self) -> Path:
        return self.data_dir / "broker"

    @property
    def blob_dir(self) -> Path:
        return self.data_dir / "blobs"

    @property
    def queue_names(self) -> tuple[str, ...]:
        return tuple(name.strip() for name in self.queues.split(",") if name.strip())

    @property
    def consumed_queues(self) -> str:
        """The worker's -Q argument."""
        names = self.worker_queues.split(",") if self.worker_queues else self.queue_names
        return ",".join(name.strip() for name in names if name.strip())

    @property
    def blob_cache_dir(self) -> Path:
        return self.data_dir / "blob-cache"

    @field_validator("storage_url")
    @classmethod
    def _known_storage_scheme(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("file://", "s3://")):
            raise ValueError("storage_url must start with file:// or s3://")
        return value

    @property
    def tmp_dir(self) -> Path:
        return self.data_dir / "tmp"

    @property
    def checkpoint_dir(self) -> Path:
        return self.data_dir / "checkpoints"

    def check_safe(self) -> None:
        """Refuse development conveniences in production (design: unsafe defaults refused)."""
        if self.environment != "production":
            return
        problems: list[str] = []
        if not self.database_url or self.database_url.startswith("sqlite"):
            problems.append("PRIVTRAIN_DATABASE_URL must point to PostgreSQL in production")
        if self.uses_filesystem_broker:
            problems.append("PRIVTRAIN_BROKER_URL must point to Redis in production")
        if self.ui_session_secret is None:
            problems.append("PRIVTRAIN_UI_SESSION_SECRET must be set in production")
        if not self.secure_noise:
            problems.append("PRIVTRAIN_SECURE_NOISE cannot be turned off in production")
        if problems:
            raise UnsafeSettingsError("; ".join(problems))


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """Process-wide settings; tests build their own ``Settings`` and pass them explicitly."""
    return Settings()
