"""An image dataset's data path: memory held and time per step, memory-mapped against in memory.

The worker reads an image dataset from its stored uint8 (n, H, W, C) array. This benchmark builds
such an array on disk (random pixels: only sizes matter here) and, in one process, runs DP-SGD
steps (ghost engine, a small `cnn`) with the rows placed three ways:

- mapped: dp.data.rows.MappedImageRows — each step reads only its Poisson batch from the
  memory map (what a CPU worker does, and a GPU worker when the dataset does not fit the device);
- device: DeviceImageRows — the uint8 array copied once to the training device (on a GPU worker);
- float: the whole dataset converted once to a float32 tensor (what the worker did before).

It reports the anonymous resident memory each placement holds for the whole job (RssAnon from /proc/self/status,
which leaves out file pages the kernel can drop: the memory map's pages are not the process's to
keep), measured when the placement is made, and the median seconds per step over interleaved
rounds. Linux only.

    .venv/bin/python -m bench.image_data_path --rows 60000 --size 32 --rounds 5 --steps 6
"""

from __future__ import annotations

import argparse
import datetime
import gc
import platform
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from dp.data.images import ImageRows
from dp.data.rows import DeviceImageRows, MappedImageRows, Rows, TensorRows, materialise
from dp.loop.batch_loop import DPSGDConfig, train_dp_sgd
from dp.loop.state import TrainingHooks
from dp.randomness.secure_random import SecureRandom
from privtrain_common.zoo.architectures import build_model


def rss_anon_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no RssAnon in /proc/self/status")


def write_images(path: Path, *, rows: int, size: int) -> None:
    array = np.lib.format.open_memmap(path, mode="w+", dtype=np.uint8, shape=(rows, size, size, 3))
    rng = np.random.default_rng(0)
    for start in range(0, rows, 4096):
        stop = min(rows, start + 4096)
        array[start:stop] = rng.integers(0, 256, size=(stop - start, size, size, 3), dtype=np.uint8)
    array.flush()
    del array


def seconds_per_step(rows: Rows, y: torch.Tensor, *, steps: int, batch: int, device: torch.device) -> float:
    model = build_model(
        "cnn", {"channels": [16, 32], "groups": 4}, input_shape=rows.row_shape, n_outputs=10,
        generator=torch.Generator().manual_seed(0),
    )  # fmt: skip
    config = DPSGDConfig(
        steps=steps,
        sampling_probability=batch / rows.n_rows,
        noise_multiplier=1.0,
        clipping_norm=1.0,
        learning_rate=0.1,
        max_physical_batch_size=batch * 2,
    )
    times: list[float] = []
    last = [time.perf_counter()]

    def on_step_end(_step: int) -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        now = time.perf_counter()
        times.append(now - last[0])
        last[0] = now

    train_dp_sgd(
        model,
        rows,
        y,
        config=config,
        generator=SecureRandom.from_os_entropy(device, secure_gaussian=False),
        hooks=TrainingHooks(on_step_end=on_step_end),
        device=device,
    )
    return statistics.median(times[1:])  # the first step pays one-off costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=60_000)
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=6, help="steps per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "images.npy"
        write_images(path, rows=args.rows, size=args.size)
        images = ImageRows(path, shape=(3, args.size, args.size))
        y = torch.from_numpy(np.arange(args.rows) % 10).to(device)
        placements: dict[str, Callable[[], Rows]] = {
            "mapped": lambda: MappedImageRows(images, device=device),
            "device": lambda: DeviceImageRows.copy_of(images, device),
            "float": lambda: TensorRows(materialise(MappedImageRows(images)), device=device),
        }
        print(f"# {datetime.date.today()} · {platform.processor() or platform.machine()} · torch {torch.__version__}")
        print(f"# {args.rows} images {args.size}×{args.size}×3 = {images.nbytes / 2**20:.0f} MiB uint8 on disk")
        print(f"# device {device}, batch {args.batch}, {args.rounds} rounds × {args.steps} steps, cnn [16, 32]")
        held: dict[str, Rows] = {}
        added: dict[str, float] = {}
        for name, make in placements.items():  # the memory each placement holds for the whole job
            gc.collect()
            before = rss_anon_bytes()
            held[name] = make()
            added[name] = (rss_anon_bytes() - before) / 2**20
        times: dict[str, list[float]] = {name: [] for name in held}
        order = list(held)
        for round_ in range(args.rounds):  # interleaved, so a busy moment hurts every placement alike
            random.Random(round_).shuffle(order)
            for name in order:
                times[name].append(seconds_per_step(held[name], y, steps=args.steps, batch=args.batch, device=device))
        mapped = statistics.median(times["mapped"])
        print("| placement | memory it holds (MiB, anonymous) | s / step (median of rounds) | × mapped |")
        print("|---|---:|---:|---:|")
        for name in held:
            step = statistics.median(times[name])
            print(f"| {name} | {added[name]:,.0f} | {step:.4f} | {step / mapped:.2f} |")


if __name__ == "__main__":
    main()
