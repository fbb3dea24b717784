"""Image ZIP decode amplification (issue 36, item 2): the pixels every member declares in its
header are summed and bounded, absolutely and relative to the upload's size, before any image is
decoded; and every reader stops between units of work when its parse is cancelled or late.

Decoding is counted at Pillow's ``ImageFile.load`` (what ``convert``, ``resize`` and
``np.asarray`` all go through), so "refused before any decode" is asserted without timing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from PIL import ImageFile

from kernel.ingest import DatasetValidationError, ImageOptions, IngestLimits, parse_dataset, parse_images
from kernel.ingest.jsonl import JsonlFields, read_records
from kernel.ingest.limits import RATIO_FREE_BYTES
from kernel.ingest.parse_control import ParseCancelled, ParseControl, ParseDeadlineExceeded, checkpoint
from tests.conftest import to_csv
from tests.unit.ingest.image_fixtures import (
    blank_png,
    class_images,
    image_zip,
    npz_bytes,
    pixel_bomb_zip,
    png,
    write,
    zip_bytes,
)

SIDE = 4096
BOMB_VALUES = SIDE * SIDE  # one grey 4096 × 4096 image


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every image Pillow decodes during the test (one entry per load of pixel data)."""
    loaded: list[str] = []
    real_load = ImageFile.ImageFile.load

    def counting_load(image: ImageFile.ImageFile) -> object:
        if image.tile:  # the encoded tiles still to decode: a first load; later calls find none
            loaded.append(str(image.format))
        return real_load(image)

    monkeypatch.setattr(ImageFile.ImageFile, "load", counting_load)
    return loaded


def _parse_zip(path: Path, *, limits: IngestLimits | None = None, size: tuple[int, int] | None = None) -> object:
    return parse_images(
        path, fmt="zip", task=None, classes=None, limits=limits or IngestLimits(), options=ImageOptions(size=size)
    )


def test_a_pixel_bomb_zip_is_refused_from_its_headers_before_any_decode(tmp_path: Path, decodes: list[str]) -> None:
    """The issue's shape: blank 4096 × 4096 PNGs (16 KB each, deflated to a few hundred bytes in
    the ZIP) resized to 8 × 8. Each is within the per-image limit; together they declare over
    64 MiB of pixels from a ~1 KB upload."""
    body = pixel_bomb_zip(5)
    assert 5 * BOMB_VALUES > RATIO_FREE_BYTES and len(body) < 5 * len(blank_png())
    with pytest.raises(DatasetValidationError) as caught:
        _parse_zip(write(tmp_path, body), size=(8, 8))
    assert caught.value.reason == "pixel-amplification"
    assert f"declare {5 * BOMB_VALUES} pixel values" in caught.value.detail
    assert f"for an upload of {len(body)} bytes" in caught.value.detail
    assert decodes == []  # not one image decoded


def test_the_decode_budget_grows_with_the_upload_up_to_its_absolute_limit(tmp_path: Path, decodes: list[str]) -> None:
    path = write(tmp_path, pixel_bomb_zip(5))
    size = path.stat().st_size
    # relative: just enough per byte of upload for the 5 images, and one value short of it
    enough = IngestLimits(max_image_decode_ratio=-(-5 * BOMB_VALUES // size))
    assert _parse_zip(path, limits=enough, size=(8, 8)).images.shape == (5, 8, 8, 1)  # type: ignore[attr-defined]
    assert len(decodes) == 5
    # absolute: binds even when the ratio would allow more
    capped = IngestLimits(max_image_decode_ratio=10**9, max_image_decode_bytes=5 * BOMB_VALUES - 1)
    with pytest.raises(DatasetValidationError) as caught:
        _parse_zip(path, limits=capped, size=(8, 8))
    assert caught.value.reason == "too-many-pixels"
    assert f"the limit is {5 * BOMB_VALUES - 1} values" in caught.value.detail
    assert len(decodes) == 5  # the refusal decoded nothing


def test_declared_pixels_count_every_channel_an_image_decodes_to(tmp_path: Path, decodes: list[str]) -> None:
    """An RGB image costs 3 values a pixel even when converted to grey (channels=1): it is decoded
    in colour first. Two 4 × 4 images: 32 values grey, 96 in colour."""
    grey = write(
        tmp_path, zip_bytes({"a/0.png": png(np.zeros((4, 4), np.uint8)), "b/0.png": png(np.zeros((4, 4), np.uint8))})
    )
    rgb = zip_bytes({"a/0.png": png(np.zeros((4, 4, 3), np.uint8)), "b/0.png": png(np.zeros((4, 4, 3), np.uint8))})
    colour = write(tmp_path, rgb, name="rgb.zip")
    assert _parse_zip(grey, limits=IngestLimits(max_image_decode_bytes=32)).images.shape == (2, 4, 4, 1)  # type: ignore[attr-defined]
    for options in (ImageOptions(), ImageOptions(channels=1)):
        with pytest.raises(DatasetValidationError) as caught:
            parse_images(
                colour,
                fmt="zip",
                task=None,
                classes=None,
                limits=IngestLimits(max_image_decode_bytes=95),
                options=options,
            )
        assert caught.value.reason == "too-many-pixels" and "declare 96 pixel values" in caught.value.detail
    assert len(decodes) == 2  # only the grey upload's two images


def test_mixed_sizes_are_refused_from_the_headers_before_any_decode(tmp_path: Path, decodes: list[str]) -> None:
    images = {
        **{f"a/{i}.png": png(np.zeros((4, 4), np.uint8)) for i in range(3)},
        "b/0.png": png(np.zeros((5, 4), np.uint8)),
    }
    with pytest.raises(DatasetValidationError) as caught:
        _parse_zip(write(tmp_path, zip_bytes(images)))
    assert caught.value.reason == "mixed-image-sizes" and "b/0.png" in caught.value.detail
    assert decodes == []


def test_a_crafted_image_is_a_refusal_whatever_pillow_raises(tmp_path: Path) -> None:
    """A PNG signature followed by garbage, and a truncated JPEG: refused naming the member."""
    good = png(np.zeros((4, 4), np.uint8))
    for bad in (good[:8] + b"\x00\x00\x00\x0dIHDR" + b"\xff" * 30, png(np.zeros((4, 4), np.uint8), fmt="JPEG")[:40]):
        path = write(tmp_path, zip_bytes({"a/0.png": good, "b/bad.png": bad}))
        with pytest.raises(DatasetValidationError) as caught:
            _parse_zip(path)
        assert caught.value.reason in ("not-an-image", "invalid-archive") and "b/bad.png" in caught.value.detail


# ------------------------------------------------------------------ deadline and cancellation


def _under(control: ParseControl, parse: Callable[[], object]) -> object:
    return control.run(parse)


def _cancelled() -> ParseControl:
    control = ParseControl(deadline_s=3600)
    control.cancel()
    return control


def _uploads(tmp_path: Path) -> Iterator[tuple[str, Callable[[], object]]]:
    """One parse per reader, each of an upload large enough to reach a checkpoint."""
    rng = np.random.default_rng(0)
    csv = write(tmp_path, to_csv(rng.random((600, 3)), rng.integers(0, 2, 600)), name="d.csv")
    yield "csv", lambda: parse_dataset(csv, fmt="csv", label_column="label", task=None, limits=IngestLimits())
    npz = write(tmp_path, npz_bytes(X=rng.random((600, 3)), y=rng.integers(0, 2, 600)), name="d.npz")
    yield "npz", lambda: parse_dataset(npz, fmt="npz", label_column=None, task=None, limits=IngestLimits())
    images = write(tmp_path, image_zip(class_images(3)), name="d.zip")
    yield "zip", lambda: _parse_zip(images)
    jsonl = write(tmp_path, b'{"text": "a", "label": 1}\n' * 10, name="d.jsonl")
    yield "jsonl", lambda: list(read_records(jsonl, fields=JsonlFields(), limits=IngestLimits()))


def test_every_reader_stops_when_its_client_has_gone_and_parses_without_a_control(tmp_path: Path) -> None:
    for fmt, parse in _uploads(tmp_path):
        parse()  # no control (the worker's re-read): checkpoints do nothing
        with pytest.raises(ParseCancelled):
            _under(_cancelled(), parse)
        assert _under(ParseControl(deadline_s=3600), parse) is not None, fmt


def test_every_reader_stops_at_its_deadline(tmp_path: Path) -> None:
    for _fmt, parse in _uploads(tmp_path):
        late = ParseControl(deadline_s=1.0, started=time.monotonic() - 2.0)
        with pytest.raises(ParseDeadlineExceeded) as caught:
            _under(late, parse)
        assert caught.value.slug == "parse-deadline-exceeded" and caught.value.extra["reason"] == "parse-deadline"


def test_a_zip_parse_stops_between_members_once_cancelled(tmp_path: Path, decodes: list[str]) -> None:
    """Cancelled while decoding its 5th image (of 24), the parse decodes no 6th."""
    control = ParseControl(deadline_s=3600)
    real_load = ImageFile.ImageFile.load

    def load_then_leave(image: ImageFile.ImageFile) -> object:
        result = real_load(image)
        if len(decodes) == 5:
            control.cancel()
        return result

    path = write(tmp_path, image_zip())
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ImageFile.ImageFile, "load", load_then_leave)
        with pytest.raises(ParseCancelled):
            control.run(lambda: _parse_zip(path))
    assert len(decodes) == 5


def test_checkpoint_outside_a_parse_does_nothing() -> None:
    checkpoint()
