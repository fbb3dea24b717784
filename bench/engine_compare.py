"""Per-sample-gradient engines side by side: ms per clipped-sum step, as ratios to non-private.

One "step" here is the gradient part of a training step on one batch of B rows: the summed
gradient (non-private) or the sum of per-sample clipped gradients Σ_i clip_C(g_i) (DP). Noise and
the optimizer update are the same for every engine and are left out. In one process, for every
case, interleaved in random order within each round and repeated (medians over rounds, because
the machine may be shared):

- non-private: forward + backward of the summed loss (torch.autograd.grad w.r.t. the parameters);
- vmap: dp.per_example.per_sample.clipped_grad_sum at its best chunk size (picked by a short
  calibration over a few chunk sizes);
- ghost (bk / retain / recompute): dp.per_example.ghost.ghost_clipped_grad_sum with each
  pass-2 strategy, chunk = B;
- Opacus hooks: GradSampleModule(loss_reduction="sum") forward/backward + DPOptimizer's own
  clip_and_accumulate (the clipping a PrivacyEngine step runs, without noise);
- Opacus ghost: GradSampleModuleFastGradientClipping + DPLossFastGradientClipping's double
  backward (PrivacyEngine's grad_sample_mode="ghost"), if it runs in the installed version.

Every engine's result is checked against the vmap engine (column "rel. diff"); Opacus clips with
C/(||g|| + 1e-6), so it differs at the 1e-6 level by construction.

`--precision bf16` runs the non-private step and both of our engines under bf16 autocast (ghost:
pass 2 = "bk" only, the one mode offered under bf16), leaves Opacus out, and still compares with
the float32 vmap engine, so "rel. diff" is then bf16's rounding. Compare timings only with a
float32 run on the same machine.

On a GPU PyTorch runs float32 convolutions in TF32 by default, and so does the ghost engine's
materialised per-sample conv gradients (docs/workers-and-devices.md#tf32-in-float32-jobs);
`--no-tf32` turns cuDNN's TF32 off for the whole run, non-private step included, to see what it
is worth to each side.

    .venv/bin/python -m bench.engine_compare --repeats 15
    .venv/bin/python -m bench.engine_compare --precision bf16 --device cuda
    .venv/bin/python -m bench.engine_compare --no-tf32 --device cuda --cases wrn16-4-b256
    .venv/bin/python -m bench.engine_compare --compile --skip-opacus --cases mlp-b256

`--compile` adds the non-private step with the model compiled by torch.compile (float32): what
compiling would give the baseline. No DP engine runs compiled: the ghost engine refuses a compiled
model, whose layers' calls its hooks cannot see.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import random
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from dp.losses import get_loss
from dp.per_example.ghost import check_ghost_supported, ghost_clipped_grad_sum, linear_conv
from dp.per_example.per_sample import AbadiClip, clipped_grad_sum, trainable_parameters
from dp.precision import PRECISIONS, Precision, autocast_context
from privtrain_common.zoo.architectures import build_model
from training.finetune import apply_finetune

CLIP = 1.0
Step = Callable[[], list[torch.Tensor]]


@dataclass(frozen=True)
class Case:
    label: str
    model: str
    params: dict
    input_shape: tuple[int, ...]
    n_classes: int
    batch: int
    vocab: int = 0
    """> 0: rows are token ids below it (text models), else float features."""
    loss: str = "cross_entropy"
    lora: dict | None = None
    """LoRA as a job's ``training.lora`` (PEFT's adapters on an `hf` model): only they (and a classifier's
    head) train, as ``training.finetune: lora`` makes the worker do."""


def _hf_config(model_type: str, *, width: int = 256, layers: int = 4) -> dict:
    """A BERT-small-sized config (4 layers of width 256, by default) over the benchmark's 1,024 token ids."""
    common = {"model_type": model_type, "vocab_size": 1024, "pad_token_id": 0}
    if model_type == "gpt2":
        return {**common, "n_embd": width, "n_layer": layers, "n_head": 4, "n_positions": 128}
    return {
        **common,
        "hidden_size": width,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "intermediate_size": 4 * width,
        "max_position_embeddings": 128,
    }


_VIT_TINY = {
    "model_type": "vit",
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 256,
    "image_size": 32,
    "patch_size": 4,
    "num_channels": 3,
}
_TEXT = {"layers": 2, "dim": 256, "heads": 4, "mlp_dim": 1024, "vocab_size": 1024, "pad_id": 0}
CASES = {
    "cnn-b128": Case("cnn2-gn 1×28×28, B=128", "cnn2-gn", {}, (1, 28, 28), 10, 128),
    "cnn-b512": Case("cnn2-gn 1×28×28, B=512", "cnn2-gn", {}, (1, 28, 28), 10, 512),
    "mlp-b256": Case(
        "MLP 100→256→256→10, B=256", "mlp", {"hidden_sizes": [256, 256], "activation": "tanh"}, (100,), 10, 256
    ),
    # The zoo at GPU sizes (the GPU table of docs/benchmarks.md; too slow for a 2-core CPU).
    "cnn3-b256": Case("cnn 32-64-128 GroupNorm, 3×32×32, B=256", "cnn", {}, (3, 32, 32), 10, 256),
    "cnn3-b1024": Case("cnn 32-64-128 GroupNorm, 3×32×32, B=1024", "cnn", {}, (3, 32, 32), 10, 1024),
    "wrn16-4-b256": Case("wrn 16-4, 3×32×32, B=256", "wrn", {}, (3, 32, 32), 10, 256),
    "resnet-gn-b256": Case("resnet-gn, 3×32×32, B=256", "resnet-gn", {}, (3, 32, 32), 10, 256),
    "vit-b256": Case("vit (patch 4, dim 192, depth 6), 3×32×32, B=256", "vit", {}, (3, 32, 32), 10, 256),
    "mlp-wide-b4096": Case(
        "MLP 3072→2048→2048→10, B=4096", "mlp", {"hidden_sizes": [2048, 2048], "activation": "relu"}, (3072,), 10, 4096
    ),
    "tcls-t64-b512": Case(
        "transformer-classifier 2×256, T=64, B=512", "transformer-classifier", _TEXT, (64,), 2, 512, vocab=1024
    ),
    "tlm-t128-b128": Case(
        "transformer-lm 2×256, T=128, B=128",
        "transformer-lm",
        _TEXT,
        (128,),
        1024,
        128,
        vocab=1024,
        loss="token_cross_entropy_sum",
    ),
    "tlm-t256-b64": Case(
        "transformer-lm 2×256, T=256, B=64",
        "transformer-lm",
        _TEXT,
        (256,),
        1024,
        64,
        vocab=1024,
        loss="token_cross_entropy_sum",
    ),
    # Hugging Face models built from a config (the `hf` family): both engines take them.
    "hf-bert-t128-b64": Case(
        "hf bert 4×256, T=128, B=64, sequence classification",
        "hf",
        {"task": "sequence-classification", "config": _hf_config("bert")},
        (128,),
        2,
        64,
        vocab=1024,
    ),
    "hf-gpt2-t128-b32": Case(
        "hf gpt2 4×256, T=128, B=32, causal LM",
        "hf",
        {"task": "causal-lm", "config": _hf_config("gpt2")},
        (128,),
        1024,
        32,
        vocab=1024,
        loss="token_cross_entropy_sum",
    ),
    "hf-gpt2-lora-t128-b32": Case(
        "hf gpt2 4×256, T=128, B=32, causal LM, LoRA r=8 on c_attn",
        "hf",
        {"task": "causal-lm", "config": _hf_config("gpt2")},
        (128,),
        1024,
        32,
        vocab=1024,
        loss="token_cross_entropy_sum",
        lora={"rank": 8, "alpha": 16},
    ),
    # The same families at CPU size (the CPU step-cost table of docs/benchmarks.md).
    "hf-bert-tiny-t64-b32": Case(
        "hf bert 2×64, T=64, B=32, sequence classification",
        "hf",
        {"task": "sequence-classification", "config": _hf_config("bert", width=64, layers=2)},
        (64,),
        2,
        32,
        vocab=1024,
    ),
    "hf-gpt2-tiny-t64-b32": Case(
        "hf gpt2 2×64, T=64, B=32, causal LM",
        "hf",
        {"task": "causal-lm", "config": _hf_config("gpt2", width=64, layers=2)},
        (64,),
        1024,
        32,
        vocab=1024,
        loss="token_cross_entropy_sum",
    ),
    "hf-gpt2-tiny-lora-t64-b32": Case(
        "hf gpt2 2×64, T=64, B=32, causal LM, LoRA r=8 on c_attn",
        "hf",
        {"task": "causal-lm", "config": _hf_config("gpt2", width=64, layers=2)},
        (64,),
        1024,
        32,
        vocab=1024,
        loss="token_cross_entropy_sum",
        lora={"rank": 8, "alpha": 16},
    ),
    "hf-vit-tiny-lora-b32": Case(
        "hf vit 2×64 (patch 4), 3×32×32, B=32, LoRA r=8 on q_proj, v_proj and the head",
        "hf",
        {"task": "image-classification", "config": _VIT_TINY},
        (3, 32, 32),
        10,
        32,
        lora={"rank": 8, "alpha": 16},
    ),
    "hf-vit-tiny-b32": Case(
        "hf vit 2×64 (patch 4), 3×32×32, B=32, image classification",
        "hf",
        {"task": "image-classification", "config": _VIT_TINY},
        (3, 32, 32),
        10,
        32,
    ),
}
SMALL_CASES = ("cnn-b128", "cnn-b512", "mlp-b256")
"""What the CPU runs by default; the GPU table adds the zoo cases."""


def _model(case: Case, device: torch.device) -> nn.Module:
    model = build_model(
        case.model,
        case.params,
        input_shape=case.input_shape,
        n_outputs=case.n_classes,
        generator=torch.Generator().manual_seed(0),
    ).to(device)
    if case.lora is not None:  # PEFT draws the adapters' A from the global generator: the same A for every engine
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(0)
            apply_finetune(model, mode="lora", lora=case.lora)
    return model


def _batch(case: Case, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    if case.vocab > 0:  # token ids, no padding: every position counts
        X = torch.randint(1, case.vocab, (case.batch, *case.input_shape), generator=g)
        y = X if case.loss.startswith("token_") else torch.randint(0, case.n_classes, (case.batch,), generator=g)
        return X.to(device), y.to(device)
    X = torch.randn((case.batch, *case.input_shape), generator=g)
    y = torch.randint(0, case.n_classes, (case.batch,), generator=g)
    return X.to(device), y.to(device)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


# ----------------------------------------------------------------------------- steppers


def nonprivate(case: Case, device: torch.device, precision: Precision = "fp32", *, compiled: bool = False) -> Step:
    """Forward + backward of the summed loss. `compiled`: the model compiled (`nn.Module.compile()`,
    torch.compile's defaults) and warmed up here, so that compiling is not timed; for comparison
    only, as the ghost engine refuses a compiled model (its hooks do not see the layers' calls)."""
    model, (X, y) = _model(case, device), _batch(case, device)
    params = list(trainable_parameters(model).values())
    fn = get_loss(case.loss).fn

    def step() -> list[torch.Tensor]:
        with autocast_context(precision, device_type=device.type):
            out = model(X)
        return list(torch.autograd.grad(fn(out.float(), y).sum(), params))

    if compiled:
        model.compile()  # lazy: the warm-up calls compile it
        for _ in range(3):
            step()
    return step


def vmap_engine(case: Case, device: torch.device, chunk: int, precision: Precision = "fp32") -> Step:
    model, (X, y) = _model(case, device), _batch(case, device)

    def step() -> list[torch.Tensor]:
        out = clipped_grad_sum(
            model,
            X,
            y,
            loss=case.loss,
            per_sample_map=AbadiClip(CLIP),
            max_physical_batch_size=chunk,
            precision=precision,
        )
        return list(out.values())

    return step


def ghost_engine(case: Case, device: torch.device, pass2: str, chunk: int, precision: Precision = "fp32") -> Step:
    model, (X, y) = _model(case, device), _batch(case, device)

    def step() -> list[torch.Tensor]:
        out = ghost_clipped_grad_sum(
            model,
            X,
            y,
            loss=case.loss,
            per_sample_map=AbadiClip(CLIP),
            max_physical_batch_size=chunk,
            pass2=pass2,  # type: ignore[arg-type]
            precision=precision,
        )
        return list(out.values())

    return step


def opacus_hooks(case: Case, device: torch.device) -> Step:
    from opacus import GradSampleModule
    from opacus.optimizers import DPOptimizer

    model, (X, y) = _model(case, device), _batch(case, device)
    gsm = GradSampleModule(model, loss_reduction="sum")
    opt = DPOptimizer(
        torch.optim.SGD(gsm.parameters(), lr=0.0),
        noise_multiplier=0.0,
        max_grad_norm=CLIP,
        expected_batch_size=case.batch,
        loss_reduction="sum",
    )
    params = [p for p in gsm.parameters() if p.requires_grad]

    def step() -> list[torch.Tensor]:
        opt.zero_grad(set_to_none=True)
        get_loss(case.loss).fn(gsm(X), y).backward()
        opt.clip_and_accumulate()
        return [p.summed_grad for p in params]

    return step


def opacus_ghost(case: Case, device: torch.device) -> Step:
    from opacus.grad_sample import GradSampleModuleFastGradientClipping
    from opacus.optimizers import DPOptimizerFastGradientClipping
    from opacus.utils.fast_gradient_clipping_utils import DPLossFastGradientClipping

    model, (X, y) = _model(case, device), _batch(case, device)
    gsm = GradSampleModuleFastGradientClipping(model, max_grad_norm=CLIP, use_ghost_clipping=True, loss_reduction="sum")
    opt = DPOptimizerFastGradientClipping(
        torch.optim.SGD(gsm.parameters(), lr=0.0),
        noise_multiplier=0.0,
        max_grad_norm=CLIP,
        expected_batch_size=case.batch,
        loss_reduction="sum",
    )
    criterion = DPLossFastGradientClipping(gsm, opt, nn.CrossEntropyLoss(reduction="sum"), loss_reduction="sum")
    params = [p for p in gsm.parameters() if p.requires_grad]

    def step() -> list[torch.Tensor]:
        opt.zero_grad(set_to_none=True)
        criterion(gsm(X), y).backward()
        return [p.grad.detach().clone() for p in params]

    return step


# ----------------------------------------------------------------------------- timing


def _time_once(step: Step, inner: int, device: torch.device) -> float:
    _sync(device)
    start = time.perf_counter()
    for _ in range(inner):
        step()
    _sync(device)
    return (time.perf_counter() - start) / inner * 1e3


def _inner_for(step: Step, device: torch.device, target_ms: float) -> int:
    for _ in range(2):
        step()
    one = _time_once(step, 1, device)
    return max(1, int(target_ms / max(one, 1e-3)))


def _best_chunk(
    make: Callable[[int], Step], chunks: list[int], device: torch.device, rounds: int, target_ms: float
) -> int:
    steps: dict[int, Step] = {}
    inner: dict[int, int] = {}
    for c in chunks:  # a chunk whose per-sample gradients do not fit the device is left out
        try:
            steps[c] = make(c)
            inner[c] = _inner_for(steps[c], device, target_ms)
        except torch.OutOfMemoryError:
            steps.pop(c, None)
            if device.type == "cuda":
                torch.cuda.empty_cache()
    chunks = list(steps)
    times: dict[int, list[float]] = {c: [] for c in chunks}
    for _ in range(rounds):
        for c in random.sample(chunks, len(chunks)):
            times[c].append(_time_once(steps[c], inner[c], device))
    return min(chunks, key=lambda c: statistics.median(times[c]))


def _rel_diff(got: list[torch.Tensor], ref: list[torch.Tensor]) -> float:
    num = sum(float((g.double() - r.double()).pow(2).sum()) for g, r in zip(got, ref, strict=True))
    den = sum(float(r.double().pow(2).sum()) for r in ref)
    return (num / den) ** 0.5


def run_case(
    case: Case,
    device: torch.device,
    repeats: int,
    target_ms: float,
    skip_opacus: bool,
    precision: Precision = "fp32",
    *,
    compiled: bool = False,
) -> list[tuple[str, float, float, str]]:
    candidates = sorted({c for c in (16, 32, 64, 128, 256, case.batch) if c <= case.batch})
    vmap_chunk = _best_chunk(
        lambda c: vmap_engine(case, device, c, precision), candidates, device, rounds=3, target_ms=target_ms
    )
    steppers: dict[str, Step] = {
        "non-private (forward + backward)": nonprivate(case, device, precision),
        f"vmap engine (chunk {vmap_chunk})": vmap_engine(case, device, vmap_chunk, precision),
    }
    notes: dict[str, str] = {}
    try:
        check_ghost_supported(_model(case, torch.device("cpu")))
        ghost = True
    except ValueError as exc:
        notes["ghost engine"] = f"not run: {exc}"[:120]
        ghost = False
    if ghost:
        steppers["ghost, pass 2 = bk (default)"] = ghost_engine(case, device, "bk", case.batch, precision)
    if ghost and precision == "fp32":  # the second-backward modes are refused under bf16
        steppers["ghost, pass 2 = retain"] = ghost_engine(case, device, "retain", case.batch)
        steppers["ghost, pass 2 = recompute"] = ghost_engine(case, device, "recompute", case.batch)
    if compiled and precision == "fp32":
        steppers["non-private, torch.compile"] = nonprivate(case, device, compiled=True)
    if ghost and case.batch > 256:  # the trainers' default max_physical_batch_size
        steppers["ghost, pass 2 = bk, chunk 256"] = ghost_engine(case, device, "bk", 256, precision)
    if not skip_opacus and precision == "fp32":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for label, make in (
                ("Opacus hooks + clip_and_accumulate", opacus_hooks),
                ('Opacus grad_sample_mode="ghost"', opacus_ghost),
            ):
                try:
                    s = make(case, device)
                    s()
                    steppers[label] = s
                except Exception as exc:  # noqa: BLE001 - report, do not abort the benchmark
                    notes[label] = f"failed: {type(exc).__name__}: {exc}"[:120]

    reference = vmap_engine(case, device, vmap_chunk)()
    diffs: dict[str, str] = {}
    for label, s in steppers.items():
        diffs[label] = "—" if label.startswith("non-private") else f"{_rel_diff(s(), reference):.1e}"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        inner = {label: _inner_for(s, device, target_ms) for label, s in steppers.items()}
        times: dict[str, list[float]] = {label: [] for label in steppers}
        labels = list(steppers)
        for _ in range(repeats):
            for label in random.sample(labels, len(labels)):
                times[label].append(_time_once(steppers[label], inner[label], device))
    peaks = {label: _peak_bytes(s, device) for label, s in steppers.items()}
    base = statistics.median(times[labels[0]])
    base_peak = peaks[labels[0]]
    rows = []
    for label in labels:
        med = statistics.median(times[label])
        q = statistics.quantiles(times[label], n=4) if len(times[label]) >= 4 else [med, med, med]
        peak = peaks[label]
        memory = "— | —" if base_peak is None or peak is None else f"{peak / 2**20:.0f} | {peak / base_peak:.2f}"
        rows.append((label, med, med / base, f"{diffs[label]} | {q[0]:.2f}–{q[2]:.2f} | {memory}"))
    for label, note in notes.items():
        rows.append((label, float("nan"), float("nan"), note))
    return rows


def _peak_bytes(step: Step, device: torch.device) -> float | None:
    """GPU memory one step allocates above what was allocated before it (models, batch): the
    step's own peak (torch.cuda.max_memory_allocated). None on a CPU, whose allocator keeps no
    such counter (bench.step_time measures a CPU step's resident set in a fresh process)."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    result = step()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - before
    del result
    return float(max(peak, 1))


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--cases",
        default=None,
        help=f"comma-separated, from {list(CASES)}; default: all on a GPU, {', '.join(SMALL_CASES)} on a CPU",
    )
    parser.add_argument("--repeats", type=int, default=15, help="timed rounds per engine (median)")
    parser.add_argument(
        "--target-ms", type=float, default=60.0, help="approximate duration of one timed round per engine"
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    parser.add_argument("--skip-opacus", action="store_true")
    parser.add_argument(
        "--precision", choices=PRECISIONS, default="fp32", help="bf16: autocast forward, float32 norms and sums"
    )
    parser.add_argument(
        "--no-tf32",
        action="store_true",
        help="turn cuDNN's TF32 off for the whole run: every engine and the non-private step in full float32",
    )
    parser.add_argument(
        "--compile",
        action="store_true",
        help="add the non-private step with the model compiled (torch.compile), float32 only",
    )
    parser.add_argument(
        "--patch-block-elements",
        type=int,
        default=None,
        help="the ghost engine's conv patch block (values built at once; default 2^22): an A/B of its launches",
    )
    args = parser.parse_args(argv)
    if args.patch_block_elements is not None:
        linear_conv.PATCH_BLOCK_ELEMENTS = args.patch_block_elements
    if args.no_tf32:
        torch.backends.cudnn.allow_tf32 = False
    warnings.filterwarnings("ignore", message="Full backward hook is firing")
    warnings.filterwarnings("ignore", message=".*Secure RNG turned off")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    random.seed(0)
    device = torch.device(args.device)

    import opacus

    machine = (
        torch.cuda.get_device_name(device) if device.type == "cuda" else f"{_cpu_name()}, {os.cpu_count()} logical CPUs"
    )
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    print(f"- machine: {machine}; device {device}; torch threads {torch.get_num_threads()}")
    print(f"- torch {torch.__version__}, opacus {opacus.__version__}, Python {platform.python_version()}")
    print(f"- date: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M UTC}")
    print(
        f"- command: `.venv/bin/python -m bench.engine_compare {' '.join(argv if argv is not None else sys.argv[1:])}`"
    )
    print(f"- load average at start: {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} (1/5/15 min)")
    numerics = "float32" if args.precision == "fp32" else "bf16 autocast, float32 norms and sums"
    numerics += "; cuDNN TF32 off" if args.no_tf32 else "; cuDNN TF32 as PyTorch sets it (on a GPU: on)"
    print(f"- medians of {args.repeats} interleaved rounds; clipping norm C = {CLIP}; {numerics}\n")
    print(
        "| case | engine | ms / step (median) | × non-private | rel. diff vs vmap | IQR ms "
        "| peak MiB (GPU) | × non-private memory |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    keys = args.cases.split(",") if args.cases else list(CASES if device.type == "cuda" else SMALL_CASES)
    for key in keys:
        case = CASES[key]
        rows = run_case(
            case, device, args.repeats, args.target_ms, args.skip_opacus, args.precision, compiled=args.compile
        )
        for label, ms, ratio, extra in rows:
            if ms != ms:  # nan: the engine did not run
                print(f"| {case.label} | {label} | — | — | {extra} | | | |")
            else:
                print(f"| {case.label} | {label} | {ms:.2f} | {ratio:.2f} | {extra} |", flush=True)
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    print(f"\n- load average at end: {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}")


if __name__ == "__main__":
    main()
