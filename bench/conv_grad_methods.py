"""Per-sample conv weight gradients, method against method, on the zoo's own conv layer shapes.

Why: the ghost engine's DP step on a conv net is dominated by materialising each row's conv
weight gradient G_i = Σ_t δ_it a_itᵀ. The non-private step computes the batch's weight gradient
with one cuDNN call (TF32 on the matrix units by default on Ampere and newer); the DP step must do
the same arithmetic B times smaller. Which way is fastest depends on the GPU, cuDNN and shapes, so
this measures, per conv layer of each zoo model at its benchmark batch size:

- ``unfold`` — im2col (F.unfold) + batched GEMM in float32 (what the engine does on CUDA today);
- ``unfold-tf32`` — the same GEMM with TF32 allowed;
- ``window`` / ``window-tf32`` — what the engine does now: the patch matrix as one copy of a strided
  window of the input (CUDA's F.unfold launches one kernel per row), then the same GEMM;
- ``grouped`` — one cuDNN weight-gradient convolution with the batch folded into the groups
  (``torch.nn.grad.conv2d_weight`` with groups = B·g), TF32 as cuDNN's default allows;
- ``grouped-fp32`` — the same with cuDNN's TF32 off;
- ``batch grad`` — the non-private reference: the summed weight gradient of the whole batch.

Each method's result is compared with a float64 reference (rel. diff). Timings are medians of CUDA
events; the table's ratio is to the batch gradient of the same layer.

    python -m bench.conv_grad_methods --device cuda
    python -m bench.conv_grad_methods --device cpu --models cnn2-gn --batch 32   # the plumbing
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from dp.per_example.ghost.linear_conv import _conv_per_sample_grads
from privtrain_common.zoo.architectures import build_model

ZOO = {"cnn": 1024, "wrn": 256, "resnet-gn": 256, "cnn2-gn": 512}
INPUT = {"cnn": (3, 32, 32), "wrn": (3, 32, 32), "resnet-gn": (3, 32, 32), "cnn2-gn": (1, 28, 28)}


@dataclass(frozen=True)
class Layer:
    model: str
    index: int
    conv: nn.Conv2d
    input_shape: tuple[int, ...]
    output_shape: tuple[int, ...]


def conv_layers(model_name: str) -> list[Layer]:
    """Each Conv2d call of the model on one row, with its input and output shapes (deduplicated)."""
    model = build_model(model_name, {}, input_shape=INPUT[model_name], n_outputs=10)
    seen: dict[tuple, Layer] = {}

    def hook(module: nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
        assert isinstance(module, nn.Conv2d)
        key = (tuple(module.weight.shape), module.stride, module.padding, tuple(inputs[0].shape[1:]))
        seen.setdefault(key, Layer(model_name, len(seen), module, tuple(inputs[0].shape[1:]), tuple(output.shape[1:])))

    handles = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, nn.Conv2d)]
    with torch.no_grad():
        model(torch.zeros(1, *INPUT[model_name]))
    for h in handles:
        h.remove()
    return list(seen.values())


@contextlib.contextmanager
def tf32(*, matmul: bool, cudnn: bool) -> Iterator[None]:
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def unfold_grads(conv: nn.Conv2d, a: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    batch, g = a.shape[0], conv.groups
    patches = F.unfold(a, conv.kernel_size, dilation=conv.dilation, padding=conv.padding, stride=conv.stride)
    o = conv.out_channels // g
    return torch.matmul(d.reshape(batch, g, o, -1), patches.view(batch, g, -1, patches.shape[-1]).transpose(-1, -2))


def window_grads(conv: nn.Conv2d, a: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    return _conv_per_sample_grads(conv, a, d)


def grouped_grads(conv: nn.Conv2d, a: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    batch, g = a.shape[0], conv.groups
    c_out = conv.out_channels
    x = a.reshape(1, -1, *a.shape[2:])
    dy = d.reshape(1, -1, *d.shape[2:])
    w = torch.nn.grad.conv2d_weight(
        x, (batch * c_out, *conv.weight.shape[1:]), dy, conv.stride, conv.padding, conv.dilation, batch * g
    )
    return w.view(batch, g, c_out // g, -1)


def batch_grad(conv: nn.Conv2d, a: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    return torch.nn.grad.conv2d_weight(a, conv.weight.shape, d, conv.stride, conv.padding, conv.dilation, conv.groups)


def _timed(fn: Callable[[], torch.Tensor], device: torch.device, repeats: int) -> float:
    for _ in range(2):
        fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


METHODS: dict[str, tuple[Callable[[nn.Conv2d, torch.Tensor, torch.Tensor], torch.Tensor], bool, bool]] = {
    "unfold": (unfold_grads, False, True),
    "unfold-tf32": (unfold_grads, True, True),
    "window": (window_grads, False, True),
    "window-tf32": (window_grads, True, True),
    "grouped": (grouped_grads, False, True),
    "grouped-fp32": (grouped_grads, False, False),
}
"""name: (per-sample gradient function, TF32 for matmuls, TF32 for cuDNN)."""


def measure_layer(layer: Layer, *, batch: int, device: torch.device, repeats: int) -> list[str]:
    """One table row per method for this layer on random inputs and output gradients."""
    conv = layer.conv.to(device)
    g = torch.Generator(device="cpu").manual_seed(layer.index)
    a = torch.randn((batch, *layer.input_shape), generator=g).to(device)
    d = torch.randn((batch, *layer.output_shape), generator=g).to(device)
    reference = unfold_grads(conv.double(), a.double(), d.double())
    conv.float()
    base = _timed(lambda: batch_grad(conv, a, d), device, repeats)
    kernel, shape = "×".join(map(str, conv.kernel_size)), "×".join(map(str, layer.input_shape))
    name = f"{layer.model}: {conv.in_channels}→{conv.out_channels} {kernel} /{conv.stride[0]}, {shape}"
    rows = []
    for method, (fn, on_matmul, on_cudnn) in METHODS.items():
        with tf32(matmul=on_matmul, cudnn=on_cudnn):
            try:
                got = fn(conv, a, d)
                ms = _timed(lambda fn=fn: fn(conv, a, d), device, repeats)
            except RuntimeError as exc:  # out of memory, say: recorded, not fatal
                rows.append(f"| {name} | {batch} | {base:.3f} | {method} | — | — | {str(exc)[:60]} |")
                continue
        diff = float((got.double() - reference).norm() / reference.norm())
        rows.append(f"| {name} | {batch} | {base:.3f} | {method} | {ms:.3f} | {ms / base:.2f} | {diff:.1e} |")
        del got
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--models", default=",".join(ZOO))
    parser.add_argument("--batch", type=int, default=None, help="one batch size for every model (default: per model)")
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    print("| layer (model: C_in→C_out k×k /s, input) | B | batch grad ms | method | ms | × batch grad | rel. diff |")
    print("|---|---:|---:|---|---:|---:|---:|")
    for model_name in args.models.split(","):
        batch = args.batch or ZOO[model_name]
        for layer in conv_layers(model_name):
            for row in measure_layer(layer, batch=batch, device=device, repeats=args.repeats):
                print(row, flush=True)
            if device.type == "cuda":
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
