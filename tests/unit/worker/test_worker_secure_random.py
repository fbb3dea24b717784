"""SecureRandom: every privacy-protecting draw has ≥ 128 secret OS bits, the right law, an exact
resume, and never leaves the worker."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from scipy import stats

from algorithms.dc_dpsgd.projection import PROJECTION_KEY_PURPOSE, StreamingProjection
from dp.randomness import secure_random as secure_random_module
from dp.randomness.secure_random import SecureRandom, keyed_uniform, paired_normal, paired_uniform
from kernel.config import Settings, UnsafeSettingsError
from kernel.db.engine import Database
from privtrain_common.zoo.architectures import build_model
from tests.conftest import dp_sgd_spec, make_settings, upload
from worker import model_setup
from worker.runner import JobRunner

# ----------------------------------------------------------------------------- seed bits


def test_the_old_torch_cpu_generator_ignores_the_seed_above_bit_32() -> None:
    """The audited defect, documented: mt19937 keeps the low 32 bits of manual_seed, so 2^32
    guesses rebuild a job's noise. SecureRandom does not depend on torch.Generator at all."""
    low = 0x1234_5678
    a = torch.randn(16, generator=torch.Generator().manual_seed(low))
    b = torch.randn(16, generator=torch.Generator().manual_seed(low + (0xDEAD_BEEF << 32)))
    assert torch.equal(a, b)


@pytest.mark.parametrize("shift", [32, 64, 128])
@pytest.mark.parametrize("secure", [False, True])
def test_seeds_sharing_their_low_bits_give_different_noise(shift: int, secure: bool) -> None:
    low = 0x1234_5678_9ABC_DEF0
    a = SecureRandom.from_seed(low, secure_gaussian=secure)
    b = SecureRandom.from_seed(low + (1 << shift), secure_gaussian=secure)
    assert not torch.equal(a.normal(16, std=1.0, dtype=torch.float32), b.normal(16, std=1.0, dtype=torch.float32))
    assert not torch.equal(a.uniform(16), b.uniform(16))
    assert a.derive_key(b"x") != b.derive_key(b"x")


def test_os_entropy_streams_are_independent_and_hold_at_least_128_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    requested: list[int] = []
    real = secure_random_module.os.urandom

    def recording(n: int) -> bytes:
        requested.append(n)
        return real(n)

    monkeypatch.setattr(secure_random_module.os, "urandom", recording)
    a = SecureRandom.from_os_entropy("cpu", secure_gaussian=True)
    assert sorted(requested) == [32, 32]  # 256 bits for the Philox seed, 256 for keyed sub-streams
    b = SecureRandom.from_os_entropy(torch.device("cpu"), secure_gaussian=True)
    assert not torch.equal(a.uniform(8), b.uniform(8))
    assert not torch.equal(a.normal(8, std=1.0), b.normal(8, std=1.0))
    assert a.derive_key(PROJECTION_KEY_PURPOSE) != b.derive_key(PROJECTION_KEY_PURPOSE)
    seed_sequence = a.numpy.bit_generator.seed_seq
    assert isinstance(seed_sequence, np.random.SeedSequence)
    assert seed_sequence.entropy.bit_length() > 128  # 256 random bits (fails with prob. 2^-128)
    assert isinstance(a.numpy.bit_generator, np.random.Philox)  # 128-bit key, 256-bit counter
    assert len(a.derive_key(b"anything")) == 16


def test_the_repr_shows_no_state() -> None:
    random = SecureRandom.from_seed(7)
    text = repr(random)
    assert random.get_state().numel() > 0
    assert "key" not in text and str(random.numpy.bit_generator.state["state"]["key"][0]) not in text


# ----------------------------------------------------------------------------- state


def _draws(random: SecureRandom) -> list[torch.Tensor]:
    projection = StreamingProjection(k=3, block_rows=4)
    params = {"w": torch.zeros(5, 2)}
    return [
        random.uniform(7),
        random.uniform((2, 3), dtype=torch.float32),
        random.normal(5, std=2.0, dtype=torch.float32),
        random.normal((), std=1.0),
        random.permutation(9),
        random.randint(5, (6,)),
        projection.dense_w(random.derive_key(PROJECTION_KEY_PURPOSE), 3, params),
    ]


@pytest.mark.parametrize("secure", [False, True])
def test_get_and_set_state_continue_the_exact_stream(secure: bool) -> None:
    original = SecureRandom.from_seed(11, secure_gaussian=secure)
    _draws(original)  # move away from the start
    state = original.get_state()
    assert state.dtype == torch.uint8 and state.dim() == 1
    expected = _draws(original)
    restored = SecureRandom.from_os_entropy("cpu", secure_gaussian=secure)  # other keys entirely
    restored.set_state(state)
    for got, want in zip(_draws(restored), expected, strict=True):
        assert torch.equal(got, want)


def test_set_state_refuses_an_old_torch_generator_state_and_another_device() -> None:
    random = SecureRandom.from_seed(1)
    with pytest.raises(ValueError, match="SecureRandom"):
        random.set_state(torch.Generator().manual_seed(5).get_state())
    foreign = json.loads(bytes(random.get_state().numpy()).decode()) | {"device_type": "cuda"}
    with pytest.raises(ValueError, match="cuda"):
        random.set_state(torch.frombuffer(bytearray(json.dumps(foreign).encode()), dtype=torch.uint8))


# ----------------------------------------------------------------------------- laws


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("secure", [False, True])
def test_gaussians_have_the_requested_law(secure: bool, dtype: torch.dtype) -> None:
    std, n = 2.5, 100_000
    draws = SecureRandom.from_seed(3, secure_gaussian=secure).normal(n, std=std, dtype=dtype)
    assert draws.dtype == dtype and draws.shape == (n,)
    values = draws.double().numpy()
    assert abs(values.mean()) < 4 * std / math.sqrt(n)
    assert values.std() == pytest.approx(std, rel=0.01)
    assert stats.kstest(values, stats.norm(scale=std).cdf).pvalue > 1e-3


def test_secure_mode_is_the_sum_of_four_draws_over_two() -> None:
    """Secure mode really sums 4 independent N(0, s²) (same law, off the sampler's lattice)."""
    n, std = 1000, 1.5
    secure = SecureRandom.from_seed(9, secure_gaussian=True).normal(n, std=std)
    plain = SecureRandom.from_seed(9).numpy
    blocks = [plain.standard_normal(n) for _ in range(4)]
    expected = torch.from_numpy((((blocks[0] + blocks[1]) + blocks[2]) + blocks[3]) * (0.5 * std))
    assert torch.equal(secure, expected)
    assert not torch.equal(secure, SecureRandom.from_seed(9).normal(n, std=std))


def _chunk_stream(key: np.ndarray, j: int) -> np.random.Generator:
    return np.random.Generator(np.random.Philox(key=key, counter=np.array([0, 0, j, 0], dtype=np.uint64)))


def test_large_secure_cpu_gaussians_are_keyed_chunks_under_a_fresh_key_from_the_stream() -> None:
    """A draw of ≥ one chunk takes a 128-bit key from the job's stream; chunk j is Philox(key, j)."""
    chunk = secure_random_module.PARALLEL_NORMAL_CHUNK
    n, std = 2 * chunk + 123, 1.5
    draws = SecureRandom.from_seed(9, secure_gaussian=True).normal(n, std=std)
    key = SecureRandom.from_seed(9).numpy.bit_generator.random_raw(2).astype(np.uint64)
    for j, size in ((0, chunk), (2, 123)):
        blocks = _chunk_stream(key, j).standard_normal(4 * size)
        parts = [blocks[i * size : (i + 1) * size] for i in range(4)]
        expected = (((parts[0] + parts[1]) + parts[2]) + parts[3]) * (0.5 * std)
        assert torch.equal(draws[j * chunk : j * chunk + size], torch.from_numpy(expected))
    # Secure mode off (tests only): the main stream, unchunked.
    plain = SecureRandom.from_seed(9).normal(n, std=std)
    assert torch.equal(plain, torch.from_numpy(SecureRandom.from_seed(9).numpy.standard_normal(n) * std))


def test_large_secure_cpu_gaussians_do_not_depend_on_the_thread_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(secure_random_module, "_CHUNKS_PER_THREAD", 1)  # threads on a small draw
    threads = torch.get_num_threads()
    draws = []
    try:
        for count in (1, 3):
            torch.set_num_threads(count)
            random = SecureRandom.from_seed(5, secure_gaussian=True)
            draws.append(random.normal((3, 50_001), std=2.0, dtype=torch.float32))
    finally:
        torch.set_num_threads(threads)
    assert draws[0].shape == (3, 50_001) and draws[0].dtype == torch.float32
    assert torch.equal(draws[0], draws[1])
    assert stats.kstest(draws[0].double().flatten().numpy(), stats.norm(scale=2.0).cdf).pvalue > 1e-3


def test_large_cpu_gaussians_resume_exactly_and_never_repeat() -> None:
    random = SecureRandom.from_seed(6, secure_gaussian=True)
    n = secure_random_module.PARALLEL_NORMAL_CHUNK * 2
    state = random.get_state()
    first, second = random.normal(n, std=1.0), random.normal(n, std=1.0)
    assert not torch.equal(first, second)  # each draw has its own key
    restored = SecureRandom.from_seed(0, secure_gaussian=True)
    restored.set_state(state)
    assert torch.equal(restored.normal(n, std=1.0), first)
    assert torch.equal(restored.normal(n, std=1.0), second)


def test_noise_is_drawn_even_when_std_is_zero() -> None:
    a, b = SecureRandom.from_seed(4), SecureRandom.from_seed(4)
    assert not bool(a.normal(10, std=0.0).any())
    b.normal(10, std=1.0)
    assert torch.equal(a.uniform(5), b.uniform(5))  # both streams moved by the same draw
    with pytest.raises(ValueError):
        a.normal(3, std=float("nan"))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_uniforms_are_uniform_on_the_half_open_interval(dtype: torch.dtype) -> None:
    u = SecureRandom.from_seed(5).uniform(100_000, dtype=dtype)
    assert u.dtype == dtype and float(u.min()) >= 0.0 and float(u.max()) < 1.0
    assert stats.kstest(u.double().numpy(), stats.uniform.cdf).pvalue > 1e-3


def test_permutations_and_integers_are_uniform() -> None:
    random = SecureRandom.from_seed(6)
    first = torch.zeros(4, 4)
    for _ in range(4000):
        perm = random.permutation(4)
        assert sorted(perm.tolist()) == [0, 1, 2, 3]
        first[torch.arange(4), perm] += 1
    assert stats.chisquare(first.flatten().numpy()).pvalue > 1e-3
    counts = torch.bincount(random.randint(7, (70_000,)), minlength=7).numpy()
    assert stats.chisquare(counts).pvalue > 1e-3


# ----------------------------------------------------------------------------- the CUDA combination rules


def _cpu_pair(seed: int) -> tuple[torch.Generator, torch.Generator]:
    return torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed + 1)


@pytest.mark.parametrize("secure", [False, True])
def test_paired_gaussians_have_the_law_and_need_both_generators(secure: bool) -> None:
    """The CUDA rules, run with CPU torch generators: same law, and changing either key changes
    every draw (a draw is predictable only with both keys)."""
    cpu = torch.device("cpu")
    std = 3.0
    draws = paired_normal(_cpu_pair(1), 100_000, std=std, dtype=torch.float32, device=cpu, secure=secure)
    values = draws.double().numpy()
    assert draws.dtype == torch.float32
    assert values.std() == pytest.approx(std, rel=0.01)
    assert stats.kstest(values, stats.norm(scale=std).cdf).pvalue > 1e-3
    base = paired_normal(_cpu_pair(1), 64, std=1.0, dtype=torch.float64, device=cpu, secure=secure)
    first, second = _cpu_pair(1)
    for pair in ((torch.Generator().manual_seed(99), second), (first, torch.Generator().manual_seed(99))):
        other = paired_normal(pair, 64, std=1.0, dtype=torch.float64, device=cpu, secure=secure)
        assert bool((other != base).all())
        first, second = _cpu_pair(1)


def test_secure_paired_gaussians_are_summed_a_float64_block_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """A whole model's noise in one draw: four float64 draws summed per block of values, so the
    float64 transients stay one block; each block is a1 + a2 + b1 + b2 from the two streams."""
    monkeypatch.setattr(secure_random_module, "CUDA_SECURE_NORMAL_BLOCK", 1000)
    cpu, std = torch.device("cpu"), 2.0
    draws = paired_normal(_cpu_pair(5), (5, 500), std=std, dtype=torch.float32, device=cpu, secure=True)
    assert draws.shape == (5, 500) and draws.dtype == torch.float32
    first, second = _cpu_pair(5)
    expected = []
    for size in (1000, 1000, 500):
        a1, a2 = (torch.randn(size, generator=first, dtype=torch.float64) for _ in range(2))
        b1, b2 = (torch.randn(size, generator=second, dtype=torch.float64) for _ in range(2))
        expected.append((((a1 + a2) + b1) + b2).mul_(0.5 * std).to(torch.float32))
    assert torch.equal(draws.flatten(), torch.cat(expected))
    many = paired_normal(_cpu_pair(6), 60_000, std=std, dtype=torch.float32, device=cpu, secure=True)
    assert stats.kstest(many.double().numpy(), stats.norm(scale=std).cdf).pvalue > 1e-3


@pytest.mark.parametrize(("dtype", "bits"), [(torch.float64, 53), (torch.float32, 24)])
def test_paired_uniforms_have_the_law_and_the_mantissa_grid(dtype: torch.dtype, bits: int) -> None:
    u = paired_uniform(_cpu_pair(3), 100_000, dtype=dtype, device=torch.device("cpu"))
    assert u.dtype == dtype and float(u.min()) >= 0.0 and float(u.max()) < 1.0
    assert stats.kstest(u.double().numpy(), stats.uniform.cdf).pvalue > 1e-3
    scaled = u.double() * 2.0**bits
    assert torch.equal(scaled, scaled.floor())  # exactly k·2^-m
    assert float(u.double().mul(2.0**bits).max()) > 2.0 ** (bits - 1)  # the top bit is used


def test_keyed_blocks_depend_on_the_whole_key_and_counter() -> None:
    key = SecureRandom.from_seed(8).derive_key(PROJECTION_KEY_PURPOSE)
    block = keyed_uniform(key, counter=(4, 2), shape=(3, 5))
    assert torch.equal(block, keyed_uniform(key, counter=(4, 2), shape=(3, 5)))
    assert not torch.equal(block, keyed_uniform(key, counter=(4, 3), shape=(3, 5)))
    assert not torch.equal(block, keyed_uniform(key[:15] + bytes([key[15] ^ 1]), counter=(4, 2), shape=(3, 5)))
    with pytest.raises(ValueError, match="128 bits"):
        keyed_uniform(key[:8], counter=(0, 0), shape=1)  # a 64-bit key is refused


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@cuda
@pytest.mark.parametrize("secure", [False, True])
def test_cuda_stream_law_and_exact_resume(secure: bool) -> None:
    random = SecureRandom.from_os_entropy("cuda", secure_gaussian=secure)
    draws = random.normal(200_000, std=2.0, dtype=torch.float32)
    assert draws.device.type == "cuda"
    assert stats.kstest(draws.double().cpu().numpy(), stats.norm(scale=2.0).cdf).pvalue > 1e-4
    u = random.uniform(100_000)
    assert u.device.type == "cuda" and float(u.max()) < 1.0
    state = random.get_state()
    expected = [random.uniform(9), random.normal(9, std=1.0), random.permutation(5)]
    restored = SecureRandom.from_os_entropy("cuda", secure_gaussian=secure)
    restored.set_state(state)
    for got, want in zip(
        [restored.uniform(9), restored.normal(9, std=1.0), restored.permutation(5)], expected, strict=True
    ):
        assert torch.equal(got, want)


@cuda
def test_cuda_keyed_blocks_are_reproducible_on_the_device() -> None:
    key = SecureRandom.from_seed(2).derive_key(PROJECTION_KEY_PURPOSE)
    block = keyed_uniform(key, counter=(1, 2), shape=(64, 8), dtype=torch.float32, device="cuda")
    assert block.device.type == "cuda" and float(block.max()) < 1.0
    assert torch.equal(block, keyed_uniform(key, counter=(1, 2), shape=(64, 8), dtype=torch.float32, device="cuda"))
    assert not torch.equal(block, keyed_uniform(key, counter=(1, 3), shape=(64, 8), dtype=torch.float32, device="cuda"))


# ----------------------------------------------------------------------------- settings and init


def test_secure_noise_is_on_by_default_and_cannot_be_off_in_production(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert Settings().secure_noise is True
    monkeypatch.setenv("PRIVTRAIN_SECURE_NOISE", "false")
    assert Settings().secure_noise is False
    monkeypatch.delenv("PRIVTRAIN_SECURE_NOISE")
    production = {
        "environment": "production",
        "database_url": "postgresql://x/y",
        "broker_url": "redis://x",
        "ui_session_secret": "s" * 32,
    }
    make_settings(tmp_path, **production).check_safe()
    with pytest.raises(UnsafeSettingsError, match="PRIVTRAIN_SECURE_NOISE"):
        make_settings(tmp_path, secure_noise=False, **production).check_safe()
    make_settings(tmp_path, secure_noise=False).check_safe()  # development: allowed


def test_model_init_never_takes_the_noise_stream() -> None:
    with pytest.raises(TypeError, match="noise stream"):
        build_model("logistic-regression", {}, input_shape=(3,), n_outputs=2, generator=SecureRandom.from_seed(0))
    assert isinstance(model_setup._init_generator(), torch.Generator)


# ----------------------------------------------------------------------------- nothing leaves the worker


def _secret_needles(random: SecureRandom) -> list[bytes]:
    state = json.loads(bytes(random.get_state().numpy()).decode())
    key_words = [int(w) for w in state["numpy"]["state"]["key"]]
    master = bytes.fromhex(state["master_key"])
    needles = [
        master,
        master.hex().encode(),
        np.array(key_words, dtype="<u8").tobytes(),
        random.derive_key(PROJECTION_KEY_PURPOSE),
        random.derive_key(PROJECTION_KEY_PURPOSE).hex().encode(),
    ]
    needles += [str(w).encode() for w in key_words] + [f"{w:016x}".encode() for w in key_words]
    return needles


def _leaks(blob: bytes, needles: list[bytes]) -> list[bytes]:
    return [needle for needle in needles if needle in blob]


def test_a_real_job_releases_nothing_of_its_stream(
    alice: TestClient,
    settings: Settings,
    database: Database,
    digits_csv: bytes,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Run a job through JobRunner (checkpoints and DP evaluation on), then search everything the
    service keeps or serves — the database, every blob (model, report), the API's responses and
    the logs — for the job stream's keys in every encoding we can think of."""
    created: list[SecureRandom] = []
    original = SecureRandom.from_os_entropy.__func__  # type: ignore[attr-defined]

    def capture(cls: type[SecureRandom], device: torch.device | str, *, secure_gaussian: bool) -> SecureRandom:
        random = original(cls, device, secure_gaussian=secure_gaussian)
        created.append(random)
        return random

    monkeypatch.setattr(SecureRandom, "from_os_entropy", classmethod(capture))
    settings = settings.model_copy(update={"checkpoint_every_steps": 2})
    dataset = upload(alice, digits_csv).json()
    spec = dp_sgd_spec(dataset["id"])
    spec["evaluation"] = {"holdout_fraction": 0.2, "mechanism": "laplace", "epsilon": 0.5}
    job = alice.post("/v1/jobs", json=spec)
    assert job.status_code == 202, job.text
    job_id = job.json()["id"]
    with caplog.at_level(logging.DEBUG):
        assert JobRunner(settings, db=database).run(job_id) == "succeeded"
    assert created and all(r.secure_gaussian for r in created)  # the production default
    training = created[0]
    needles = _secret_needles(training)
    assert _leaks(json.dumps(json.loads(bytes(training.get_state().numpy()).decode())).encode(), needles)

    served = b"".join(
        alice.get(path).content
        for path in (
            f"/v1/jobs/{job_id}",
            f"/v1/jobs/{job_id}/report",
            f"/v1/jobs/{job_id}/model",
            f"/v1/datasets/{dataset['id']}/ledger",
        )
    )
    assert _leaks(served, needles) == []
    stored = [p for p in settings.data_dir.rglob("*") if p.is_file()]
    assert not list(settings.checkpoint_dir.glob("*"))  # the checkpoint was deleted when settled
    for path in stored:
        assert _leaks(path.read_bytes(), needles) == [], path
    logged = "\n".join(f"{r.getMessage()} {r.__dict__}" for r in caplog.records).encode()
    assert _leaks(logged, needles) == []


def test_a_checkpoint_from_the_old_generator_is_restarted_not_failed(tmp_path: Path) -> None:
    """A retried attempt whose checkpoint holds an mt19937 state (written before the noise source
    changed) starts over inside its reservation instead of failing; a SecureRandom one resumes."""
    from dp.loop.state import TrainingState
    from training.artifacts import save_training_state

    def checkpoint(name: str, generator_state: torch.Tensor) -> Path:
        path = tmp_path / name
        save_training_state(
            path,
            TrainingState(
                step=3, model_state={"w": torch.zeros(2)}, optimizer_state={}, generator_state=generator_state
            ),
        )
        return path

    old = checkpoint("old.safetensors", torch.Generator().manual_seed(1).get_state())
    assert not SecureRandom.can_restore(torch.Generator().get_state(), "cpu")
    assert model_setup.resumable("job_old", old, torch.device("cpu")) is None
    assert not old.exists()  # discarded, so the next attempt does not trip on it again
    current = checkpoint("new.safetensors", SecureRandom.from_seed(5).get_state())
    resumed = model_setup.resumable("job_new", current, torch.device("cpu"))
    assert resumed is not None and resumed.step == 3
