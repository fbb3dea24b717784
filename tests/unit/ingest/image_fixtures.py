"""Tiny image uploads written in memory: PNG/JPEG files in class-folder ZIPs, uint8 NPZs."""

from __future__ import annotations

import functools
import io
import zipfile
from pathlib import Path

import numpy as np
from PIL import Image


def png(pixels: np.ndarray, *, fmt: str = "PNG") -> bytes:
    """``pixels`` uint8 (H, W) or (H, W, 3) encoded as an image file."""
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format=fmt)
    return buffer.getvalue()


def class_images(n_per_class: int = 12, *, side: int = 8, seed: int = 0) -> dict[str, np.ndarray]:
    """Grey images of two learnable classes: "dark" (low values) and "light" (high values)."""
    rng = np.random.default_rng(seed)
    images: dict[str, np.ndarray] = {}
    for i in range(n_per_class):
        images[f"dark/{i:03d}.png"] = rng.integers(0, 80, size=(side, side), dtype=np.uint8)
        images[f"light/{i:03d}.png"] = rng.integers(170, 256, size=(side, side), dtype=np.uint8)
    return images


def zip_bytes(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def image_zip(images: dict[str, np.ndarray] | None = None) -> bytes:
    """A class-folder ZIP of PNGs (24 8×8 grey images in 2 classes by default)."""
    return zip_bytes({name: png(pixels) for name, pixels in (images or class_images()).items()})


@functools.cache
def blank_png(side: int = 4096) -> bytes:
    """A grey PNG of zeros: 4096 × 4096 (16.7 M pixels) compresses to about 16 KB."""
    buffer = io.BytesIO()
    Image.new("L", (side, side)).save(buffer, format="PNG")
    return buffer.getvalue()


def pixel_bomb_zip(n_images: int = 5, *, side: int = 4096) -> bytes:
    """A class-folder ZIP of ``n_images`` blank PNGs: a few KB each, 16.7 M pixels each declared
    (issue 36: 100 of them with image_size=8 took 41 s of server CPU to decode)."""
    return zip_bytes({f"{'ab'[i % 2]}/{i:04d}.png": blank_png(side) for i in range(n_images)})


def npz_bytes(**arrays: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)  # type: ignore[arg-type]
    return buffer.getvalue()


def write(directory: Path, data: bytes, *, name: str = "upload.bin") -> Path:
    path = directory / name
    path.write_bytes(data)
    return path
