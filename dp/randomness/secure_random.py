"""The one source of every draw that protects privacy in the worker (docs/privacy-model.md §5).

Why not ``torch.Generator``: PyTorch's CPU generator (mt19937) keeps only the low 32 bits of a
``manual_seed``, so 2^32 guesses rebuild a job's noise, and CUDA's Philox has a 64-bit key.
:class:`SecureRandom` keeps at least 128 secret bits from the OS CSPRNG on every device:

- CPU: NumPy ``Generator(Philox(SeedSequence(<256 bits of os.urandom>)))``; every draw is made
  with NumPy and handed to torch with ``torch.from_numpy`` (then moved to the device/dtype).
- CUDA: two independent CUDA Philox generators, each seeded with 64 fresh OS bits, so draws stay
  on the device; predicting a draw needs BOTH keys. Combination rules:

  * Gaussian N(0, s²): (a + b)·s/√2 with a from the first and b from the second generator, both
    N(0, 1); in secure mode (a1 + a2 + b1 + b2)·s/2, two draws from each generator.
  * Uniform on [0, 1): x = w1 XOR w2 for 64-bit random words w1, w2 from each generator (XOR of
    a uniform word with an independent word is uniform), then (x >>> (64 − m))·2^−m with m = 53
    for float64 and m = 24 for float32 (exact in the dtype, never rounds up to 1).

  A third, CPU-side NumPy Philox stream (256-bit seed) serves the small exact draws
  (``randint``, ``permutation``) and :attr:`numpy`.

Large secure-mode CPU Gaussian draws (a model's noise vector, ≥ ``PARALLEL_NORMAL_CHUNK`` values;
four float64 draws per value, 50–70 ns a value on one core) take a fresh 128-bit key from the
job's stream (two raw Philox words); chunk j of ``PARALLEL_NORMAL_CHUNK`` values comes from
Philox(key, counter = (0, 0, j, 0)). Draws of at least ``_CHUNKS_PER_THREAD`` chunks per thread are
filled by up to torch's intra-op thread count of threads (NumPy releases the GIL while it fills).
The values depend on the state and the size only, never on the thread count, so a resumed job
replays them exactly; the counters are public, so such a draw is as secret as its 128-bit key.

Secure mode (Holohan & Braghin 2021, the idea behind Opacus's ``secure_mode``): each Gaussian
value is the sum of 4 independent N(0, s²) draws divided by 2 — the same law, but the output no
longer sits on the sampler's floating-point lattice. On in production (``PRIVTRAIN_SECURE_NOISE``).

Keyed sub-streams (DC-DPSGD's projections): :meth:`SecureRandom.derive_key` gives a 128-bit key
fixed for the job (derived from a 256-bit secret in the state, so a resumed job gets it back) and
:func:`keyed_uniform` a counter-based stream for a (key, counter) pair — NumPy
``Philox(key=<128 bits>, counter=(0, 0, c0, c1))`` on the CPU, two CUDA generators seeded with
BLAKE2b(counter, key=key) on CUDA.

SECRET: the state (``get_state``) determines all noise; it lives in checkpoints on worker storage
only and is never logged, reported or written to a model artifact.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import struct
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

__all__ = [
    "CUDA_SECURE_NORMAL_BLOCK",
    "PARALLEL_NORMAL_CHUNK",
    "SecureRandom",
    "keyed_uniform",
    "paired_normal",
    "paired_uniform",
]

Shape = int | Sequence[int]

_STATE_FORMAT = "privtrain-secure-random/1"
_MANTISSA_BITS = {torch.float64: 53, torch.float32: 24}
_NUMPY_FLOATS: dict[torch.dtype, type[np.float64] | type[np.float32]] = {
    torch.float64: np.float64,
    torch.float32: np.float32,
}


def _shape(shape: Shape) -> tuple[int, ...]:
    return (int(shape),) if isinstance(shape, int) else tuple(int(s) for s in shape)


def _check_std(std: float) -> float:
    if not (std >= 0 and std < math.inf):
        raise ValueError(f"noise std must be finite and >= 0, got {std}")
    return float(std)


def _mantissa_bits(dtype: torch.dtype) -> int:
    if dtype not in _MANTISSA_BITS:
        raise ValueError(f"uniform draws support float32 and float64, got {dtype}")
    return _MANTISSA_BITS[dtype]


def _philox(seed_words: np.random.SeedSequence) -> np.random.Generator:
    return np.random.Generator(np.random.Philox(seed_words))


# ----------------------------------------------------------------------------- CPU: large Gaussians

PARALLEL_NORMAL_CHUNK = 1 << 16
"""Values per keyed chunk of a large secure-mode CPU Gaussian draw (and the size from which a draw
is chunked): a chunk's generator costs nothing next to its draws, and its scratch stays in cache.
Plain draws (secure mode off, tests only) stay on the main stream: at 11 ns a value, threads
did not pay for themselves below a million values."""


_CHUNKS_PER_THREAD = 8
"""Threads only for draws of at least this many chunks per thread. The draw follows the step's
backward, whose intra-op threads still spin on the cores for a while: measured in DP-SGD steps on
2 cores, threads cost 2.8 ms at 92k values, broke even at 315k and saved 28% of the step at 1.2M."""


def _secure_sum(stream: np.random.Generator, m: int, *, std: float, scratch: np.ndarray | None = None) -> np.ndarray:
    """Secure mode's m values, float64: ((a1 + a2) + a3 + a4)·std/2 for four consecutive blocks of
    m standard normals of ``stream`` (drawn into ``scratch`` when given; the result is a view of it)."""
    draws = np.empty(4 * m) if scratch is None else scratch[: 4 * m]
    stream.standard_normal(out=draws)
    total = draws[:m]
    for part in (1, 2, 3):
        total += draws[part * m : (part + 1) * m]
    total *= 0.5 * std
    return total


def _fill_secure_normal_chunks(out: np.ndarray, key_words: np.ndarray, chunks: Sequence[int], *, std: float) -> None:
    """Chunks ``chunks`` of the flat ``out``: secure-mode values, each from chunk j's stream."""
    n = out.shape[0]
    scratch = np.empty(4 * PARALLEL_NORMAL_CHUNK)
    for j in chunks:
        start = j * PARALLEL_NORMAL_CHUNK
        m = min(PARALLEL_NORMAL_CHUNK, n - start)
        counter = np.array([0, 0, j, 0], dtype=np.uint64)
        stream = np.random.Generator(np.random.Philox(key=key_words, counter=counter))
        out[start : start + m] = _secure_sum(stream, m, std=std, scratch=scratch)


def _chunked_secure_normal(
    key_words: np.ndarray, n: int, *, std: float, dtype: type[np.float32] | type[np.float64], threads: int
) -> np.ndarray:
    """n values of the keyed chunked secure Gaussian stream (module docstring), on ``threads``
    threads; the same values whatever ``threads`` is."""
    out = np.empty(n, dtype=dtype)
    chunks = range(-(-n // PARALLEL_NORMAL_CHUNK))
    workers = max(1, min(threads, len(chunks) // _CHUNKS_PER_THREAD))
    if workers == 1:
        _fill_secure_normal_chunks(out, key_words, chunks, std=std)
        return out
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="privtrain-noise") as pool:
        shares = [chunks[w::workers] for w in range(workers)]
        for done in [pool.submit(_fill_secure_normal_chunks, out, key_words, share, std=std) for share in shares]:
            done.result()
    return out


# ----------------------------------------------------------------------------- CUDA: two Philox keys

CUDA_SECURE_NORMAL_BLOCK = 1 << 24
"""Values per float64 block of a secure CUDA Gaussian draw: at most 256 MiB of float64 transients,
and few enough blocks that a model's noise stays a handful of kernels."""


def _words(generator: torch.Generator, shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """Uniform 64-bit words (int64 bit patterns): from = int64 min, to = None is the full range."""
    return torch.empty(shape, dtype=torch.int64, device=device).random_(-(2**63), None, generator=generator)


def paired_uniform(
    pair: tuple[torch.Generator, torch.Generator],
    shape: Shape,
    *,
    dtype: torch.dtype,
    device: torch.device,
) -> torch.Tensor:
    """U[0, 1) from XOR of one 64-bit word of each generator, top m bits scaled by 2^−m."""
    bits = _mantissa_bits(dtype)
    size = _shape(shape)
    x = _words(pair[0], size, device).bitwise_xor_(_words(pair[1], size, device))
    x = x.bitwise_right_shift_(64 - bits).bitwise_and_((1 << bits) - 1)  # logical shift
    return x.to(dtype).mul_(2.0**-bits)


def paired_normal(
    pair: tuple[torch.Generator, torch.Generator],
    shape: Shape,
    *,
    std: float,
    dtype: torch.dtype,
    device: torch.device,
    secure: bool,
) -> torch.Tensor:
    """(a + b)·s/√2, or (a1 + a2 + b1 + b2)·s/2 in secure mode; a from pair[0], b from pair[1].

    Secure mode sums in float64 a block of ``CUDA_SECURE_NORMAL_BLOCK`` values at a time, so a
    model's whole noise vector, drawn at once, never needs two float64 copies of itself."""
    size = _shape(shape)
    first, second = pair
    if secure:
        n = math.prod(size)
        out = torch.empty(n, dtype=dtype, device=device)
        for start in range(0, n, CUDA_SECURE_NORMAL_BLOCK):
            m = min(CUDA_SECURE_NORMAL_BLOCK, n - start)
            total = torch.randn(m, generator=first, device=device, dtype=torch.float64)
            total.add_(torch.randn(m, generator=first, device=device, dtype=torch.float64))
            total.add_(torch.randn(m, generator=second, device=device, dtype=torch.float64))
            total.add_(torch.randn(m, generator=second, device=device, dtype=torch.float64))
            out[start : start + m] = total.mul_(0.5 * std)
        return out.view(size)
    total = torch.randn(size, generator=first, device=device, dtype=dtype)
    total.add_(torch.randn(size, generator=second, device=device, dtype=dtype))
    return total.mul_(std / math.sqrt(2.0))


# ----------------------------------------------------------------------------- keyed sub-streams


def _cuda_pair_seeds(key: bytes, counter: tuple[int, int]) -> tuple[int, int]:
    """Two independent 64-bit seeds for (key, counter), BLAKE2b keyed by the job key."""
    seeds = []
    for index in (0, 1):
        payload = struct.pack("<QQB", counter[0], counter[1], index)
        digest = hashlib.blake2b(payload, key=key, digest_size=8, person=b"privtrain-pair").digest()
        seeds.append(int.from_bytes(digest, "little"))
    return seeds[0], seeds[1]


def keyed_uniform(
    key: bytes,
    *,
    counter: tuple[int, int],
    shape: Shape,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """U[0, 1) that depends only on (key, counter): a counter-based stream, random access.

    CPU: NumPy Philox4x64 with the 128-bit ``key`` and counter words (0, 0, c0, c1) — each
    (c0, c1) owns 2^128 blocks of the counter space, so distinct counters never overlap.
    CUDA: two CUDA generators seeded with BLAKE2b((c0, c1, i), key=key), combined as
    :func:`paired_uniform` (so the draw depends on the whole key, not on 64 bits of it).
    """
    if not isinstance(key, bytes) or len(key) != 16:
        raise ValueError("key must be 16 bytes (128 bits)")
    c0, c1 = counter
    for value in (c0, c1):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**64:
            raise ValueError(f"counter words must be integers in [0, 2^64), got {counter!r}")
    device = torch.device(device)
    size = _shape(shape)
    _mantissa_bits(dtype)
    if device.type == "cuda":
        pair = tuple(torch.Generator(device=device) for _ in range(2))
        for generator, seed in zip(pair, _cuda_pair_seeds(key, (c0, c1)), strict=True):
            generator.manual_seed(seed)
        return paired_uniform((pair[0], pair[1]), size, dtype=dtype, device=device)
    key_words = np.frombuffer(key, dtype="<u8").astype(np.uint64)
    bit_generator = np.random.Philox(key=key_words, counter=np.array([0, 0, c0, c1], dtype=np.uint64))
    values = np.random.Generator(bit_generator).random(size, dtype=_NUMPY_FLOATS[dtype])
    return torch.from_numpy(np.asarray(values)).to(device=device)


# ----------------------------------------------------------------------------- state encoding


def _to_json(value: object) -> object:
    if isinstance(value, np.ndarray):
        return [int(v) for v in value.tolist()]
    if isinstance(value, dict):
        return {k: _to_json(v) for k, v in value.items()}
    if isinstance(value, (np.integer,)):
        return int(value)
    return value


def _philox_state(raw: dict[str, Any]) -> dict[str, Any]:
    """The JSON form of a Philox state back into NumPy's (uint64 arrays where it has them)."""
    if raw.get("bit_generator") != "Philox":
        raise ValueError("generator state does not hold a Philox stream")
    inner = raw["state"]
    return {
        "bit_generator": "Philox",
        "state": {
            "counter": np.array(inner["counter"], dtype=np.uint64),
            "key": np.array(inner["key"], dtype=np.uint64),
        },
        "buffer": np.array(raw["buffer"], dtype=np.uint64),
        "buffer_pos": int(raw["buffer_pos"]),
        "has_uint32": int(raw["has_uint32"]),
        "uinteger": int(raw["uinteger"]),
    }


# ----------------------------------------------------------------------------- the job's source


class SecureRandom:
    """A job's secret random stream on one device; see the module docstring for the rules."""

    def __init__(
        self,
        *,
        device: torch.device,
        numpy_stream: np.random.Generator,
        master_key: bytes,
        pair: tuple[torch.Generator, torch.Generator] | None,
        secure_gaussian: bool,
    ) -> None:
        """Use :meth:`from_os_entropy` (production) or :meth:`from_seed` (tests)."""
        if device.type == "cuda" and pair is None:
            raise ValueError("a CUDA SecureRandom needs its two CUDA generators")
        if len(master_key) != 32:
            raise ValueError("master_key must be 32 bytes")
        self._device = device
        self._numpy = numpy_stream
        self._master_key = master_key
        self._pair = pair if device.type == "cuda" else None
        self._secure_gaussian = bool(secure_gaussian)

    @classmethod
    def from_os_entropy(cls, device: torch.device | str, *, secure_gaussian: bool) -> SecureRandom:
        """A fresh job stream: 256 OS bits for NumPy, 256 for keys, 2×64 for the CUDA pair."""
        device = torch.device(device)
        numpy_stream = _philox(np.random.SeedSequence(int.from_bytes(os.urandom(32), "little")))
        pair = None
        if device.type == "cuda":
            pair = (torch.Generator(device=device), torch.Generator(device=device))
            for generator in pair:
                generator.manual_seed(int.from_bytes(os.urandom(8), "little"))
        return cls(
            device=device,
            numpy_stream=numpy_stream,
            master_key=os.urandom(32),
            pair=pair,
            secure_gaussian=secure_gaussian,
        )

    @classmethod
    def from_seed(cls, seed: int, device: torch.device | str = "cpu", *, secure_gaussian: bool = False) -> SecureRandom:
        """A reproducible stream for TESTS and benchmarks only: a fixed seed is public, so noise
        drawn from it protects nothing. Every bit of ``seed`` matters (SeedSequence hashes it)."""
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
        device = torch.device(device)
        numpy_seed, key_seed, pair_seed = np.random.SeedSequence(seed).spawn(3)
        pair = None
        if device.type == "cuda":
            pair = (torch.Generator(device=device), torch.Generator(device=device))
            for generator, word in zip(pair, pair_seed.generate_state(2, np.uint64), strict=True):
                generator.manual_seed(int(word))
        return cls(
            device=device,
            numpy_stream=_philox(numpy_seed),
            master_key=key_seed.generate_state(8, np.uint32).tobytes(),
            pair=pair,
            secure_gaussian=secure_gaussian,
        )

    def __repr__(self) -> str:  # never the state
        return f"SecureRandom(device={self._device}, secure_gaussian={self._secure_gaussian})"

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def secure_gaussian(self) -> bool:
        return self._secure_gaussian

    @property
    def numpy(self) -> np.random.Generator:
        """The CPU-side NumPy stream, for small exact samplers (a third stream on CUDA)."""
        return self._numpy

    def _target(self, device: torch.device | str | None) -> torch.device:
        return self._device if device is None else torch.device(device)

    # ------------------------------------------------------------------ draws

    def uniform(
        self, shape: Shape, *, dtype: torch.dtype = torch.float64, device: torch.device | str | None = None
    ) -> torch.Tensor:
        """I.i.d. U[0, 1) with the dtype's full mantissa (53 or 24 bits); never 1."""
        target = self._target(device)
        if self._pair is not None:
            return paired_uniform(self._pair, shape, dtype=dtype, device=self._device).to(target)
        _mantissa_bits(dtype)
        values = self._numpy.random(_shape(shape), dtype=_NUMPY_FLOATS[dtype])
        return torch.from_numpy(np.asarray(values)).to(target)

    def normal(
        self, shape: Shape, *, std: float, dtype: torch.dtype = torch.float64, device: torch.device | str | None = None
    ) -> torch.Tensor:
        """I.i.d. N(0, std²), always drawn (even for std = 0) so the stream ignores the config."""
        std = _check_std(std)
        target = self._target(device)
        if self._pair is not None:
            return paired_normal(
                self._pair, shape, std=std, dtype=dtype, device=self._device, secure=self._secure_gaussian
            ).to(target)
        size = _shape(shape)
        draw_dtype = np.float32 if dtype == torch.float32 else np.float64
        if self._secure_gaussian and math.prod(size) >= PARALLEL_NORMAL_CHUNK:
            key_words = self._numpy.bit_generator.random_raw(2).astype(np.uint64)  # 128 fresh bits
            flat = _chunked_secure_normal(
                key_words, math.prod(size), std=std, dtype=draw_dtype, threads=torch.get_num_threads()
            )
            return torch.from_numpy(flat.reshape(size)).to(device=target, dtype=dtype)
        if self._secure_gaussian:
            total = _secure_sum(self._numpy, math.prod(size), std=std).reshape(size)
            return torch.from_numpy(total).to(device=target, dtype=dtype)
        values = torch.from_numpy(np.asarray(self._numpy.standard_normal(size, dtype=draw_dtype)))
        return values.to(dtype=dtype).mul_(std).to(target)

    def randint(self, high: int, shape: Shape) -> torch.Tensor:
        """I.i.d. uniform integers in [0, high) (int64, on this stream's device; exact)."""
        if isinstance(high, bool) or not isinstance(high, int) or high < 1:
            raise ValueError(f"high must be an integer >= 1, got {high!r}")
        values = self._numpy.integers(0, high, size=_shape(shape), dtype=np.int64)
        return torch.from_numpy(np.asarray(values)).to(self._device)

    def permutation(self, n: int) -> torch.Tensor:
        """A uniformly random permutation of range(n) (int64, on this stream's device)."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"n must be an integer >= 0, got {n!r}")
        return torch.from_numpy(self._numpy.permutation(n).astype(np.int64)).to(self._device)

    def derive_key(self, purpose: bytes) -> bytes:
        """A 128-bit key for a keyed sub-stream, fixed for this job and ``purpose`` (no draw:
        BLAKE2b of the purpose keyed by the 256-bit secret held in the state)."""
        return hashlib.blake2b(purpose, key=self._master_key, digest_size=16, person=b"privtrain-key").digest()

    # ------------------------------------------------------------------ state (SECRET)

    def get_state(self) -> torch.Tensor:
        """The whole secret state as a uint8 tensor (UTF-8 JSON), for checkpoints only."""
        state = {
            "format": _STATE_FORMAT,
            "device_type": self._device.type,
            "master_key": self._master_key.hex(),
            "numpy": _to_json(self._numpy.bit_generator.state),
            "pair": None if self._pair is None else [g.get_state().numpy().tobytes().hex() for g in self._pair],
        }
        raw = json.dumps(state, sort_keys=True).encode()
        return torch.frombuffer(bytearray(raw), dtype=torch.uint8).clone()

    @classmethod
    def can_restore(cls, state: torch.Tensor, device: torch.device | str) -> bool:
        """Whether ``set_state`` on a stream for ``device`` would accept ``state`` (checked on a
        throwaway stream; nothing is drawn)."""
        try:
            cls.from_seed(0, device).set_state(state)
        except ValueError:
            return False
        return True

    def set_state(self, state: torch.Tensor) -> None:
        """Continue exactly where ``get_state`` was taken (same device type)."""
        if not isinstance(state, torch.Tensor) or state.dtype != torch.uint8:
            raise ValueError("generator state must be a uint8 tensor")
        try:
            decoded = json.loads(bytes(state.cpu().numpy().tobytes()).decode())
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError("generator state is not a SecureRandom state (older checkpoint?)") from exc
        if not isinstance(decoded, dict) or decoded.get("format") != _STATE_FORMAT:
            raise ValueError("generator state is not a SecureRandom state")
        if decoded["device_type"] != self._device.type:
            raise ValueError(f"generator state is for {decoded['device_type']}, this stream is on {self._device.type}")
        master_key = bytes.fromhex(decoded["master_key"])
        if len(master_key) != 32:
            raise ValueError("generator state has a malformed key")
        self._numpy.bit_generator.state = _philox_state(decoded["numpy"])
        self._master_key = master_key
        if self._pair is not None:
            saved = decoded["pair"]
            if not isinstance(saved, list) or len(saved) != 2:
                raise ValueError("generator state lacks the CUDA generators")
            for generator, hex_state in zip(self._pair, saved, strict=True):
                generator.set_state(torch.frombuffer(bytearray.fromhex(hex_state), dtype=torch.uint8).clone())
