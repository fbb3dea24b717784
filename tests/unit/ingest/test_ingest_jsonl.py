"""JSON Lines text uploads (kernel/ingest/jsonl.py, kernel/ingest/text.py): records are read streamed,
every malformed line is refused with a stable reason naming the line (never its text), the task
follows from the label member, and the token array is the texts' ids truncated and padded."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest

from kernel.ingest import DatasetValidationError, IngestLimits
from kernel.ingest.jsonl import JsonlFields, read_records
from kernel.ingest.text import TextOptions, check_text_options, scan_text, token_dtype, write_token_rows
from kernel.ingest.text_errors import TEXT_REASONS, TextValidationError
from kernel.tokenizers.byte import PAD_ID, ByteTokenizer
from tests.text_fixtures import classification_body, jsonl, language_model_body

LIMITS = IngestLimits()


def _file(tmp_path: Path, body: bytes) -> Path:
    path = tmp_path / "upload.jsonl"
    path.write_bytes(body)
    return path


def test_labelled_records_make_a_classification_dataset_with_the_class_list(tmp_path: Path) -> None:
    scanned = scan_text(
        _file(tmp_path, classification_body(repeat=1)), task=None, classes=None, options=TextOptions(), limits=LIMITS
    )
    assert scanned.task == "classification" and scanned.n_rows == 6
    assert scanned.classes is not None and scanned.classes.names == ("bad", "good")
    assert scanned.y is not None and scanned.y.tolist() == [1, 0, 1, 0, 1, 0]


def test_records_without_labels_make_a_language_model_dataset(tmp_path: Path) -> None:
    scanned = scan_text(
        _file(tmp_path, language_model_body(repeat=2)), task=None, classes=None, options=TextOptions(), limits=LIMITS
    )
    assert scanned.task == "language-model" and scanned.n_rows == 12 and scanned.y is None


def test_whole_number_labels_and_a_declared_class_list_map_by_name(tmp_path: Path) -> None:
    body = jsonl([{"t": "x", "y": 2}, {"t": "y", "y": 1}, {"t": "z", "y": 2}])
    options = TextOptions(fields=JsonlFields(text="t", label="y"))
    scanned = scan_text(_file(tmp_path, body), task=None, classes=("1", "2"), options=options, limits=LIMITS)
    assert scanned.y is not None and scanned.y.tolist() == [1, 0, 1]
    with pytest.raises(DatasetValidationError) as refused:
        scan_text(_file(tmp_path, body), task=None, classes=("a", "b"), options=options, limits=LIMITS)
    assert refused.value.reason == "label-not-in-classes" and "line 1" in refused.value.detail


def test_blank_lines_and_a_bom_are_accepted(tmp_path: Path) -> None:
    body = "\ufeff".encode() + b'{"text": "a"}\r\n\n   \n{"text": "b"}'
    records = list(read_records(_file(tmp_path, body), fields=JsonlFields(), limits=LIMITS))
    assert [(r.line, r.text) for r in records] == [(1, "a"), (4, "b")]


REFUSALS: list[tuple[str, bytes, str, str]] = [
    ("jsonl-invalid-line", b'{"text": "a"}\n{"text": \n', "line 2", "not valid JSON"),
    ("jsonl-invalid-line", b'["text"]\n', "line 1", "not an object"),
    ("jsonl-missing-field", b'{"text": "a"}\n{"body": "b"}\n', "line 2", "'text'"),
    ("jsonl-missing-field", b'{"text": "a", "label": "x"}\n{"text": "b"}\n', "line 2", "label"),
    ("jsonl-bad-field", b'{"text": 3}\n', "line 1", "string"),
    ("jsonl-bad-field", b'{"text": "a", "label": 1.5}\n', "line 1", "whole number"),
    ("jsonl-bad-field", b'{"text": "a", "label": true}\n', "line 1", "whole number"),
    ("text-not-utf8", b'{"text": "a"}\n{"text": "\xff\xfe"}\n', "line 2", "UTF-8"),
    ("text-not-utf8", b'{"text": "\\ud800"}\n', "line 1", "surrogate"),
    ("jsonl-empty", b"\n\n", "no records", ""),
    ("jsonl-line-too-long", b'{"text": "' + b"a" * 40 + b'"}\n', "line 1", "40 bytes"),
    ("jsonl-too-many-records", b'{"text": "a"}\n' * 4, "line 4", "3 records"),
]


@pytest.mark.parametrize(("reason", "body", "where", "why"), REFUSALS)
def test_each_malformed_upload_is_refused_naming_the_line(
    tmp_path: Path, reason: str, body: bytes, where: str, why: str
) -> None:
    limits = IngestLimits(max_text_line_bytes=40, max_text_records=3)
    with pytest.raises(TextValidationError) as refused:
        scan_text(_file(tmp_path, body), task=None, classes=None, options=TextOptions(), limits=limits)
    assert refused.value.reason == reason
    assert where in refused.value.detail and why in refused.value.detail


def test_every_text_reason_is_reachable() -> None:
    covered = {reason for reason, *_ in REFUSALS} | {"bad-text-options", "unknown-text-task", "token-array-too-large"}
    assert covered == set(TEXT_REASONS)


def test_a_refusal_never_echoes_the_text(tmp_path: Path) -> None:
    secret = "patient 4711 has a rare condition"
    body = jsonl([{"text": "fine"}]) + json.dumps({"text": secret})[:-1].encode() + b"\n"
    with pytest.raises(TextValidationError) as refused:
        scan_text(_file(tmp_path, body), task=None, classes=None, options=TextOptions(), limits=LIMITS)
    assert "4711" not in str(refused.value) and "rare" not in str(refused.value)


def test_a_requested_task_must_agree_with_the_records(tmp_path: Path) -> None:
    path = _file(tmp_path, language_model_body(repeat=1))
    with pytest.raises(TextValidationError) as refused:
        scan_text(path, task="classification", classes=None, options=TextOptions(), limits=LIMITS)
    assert refused.value.reason == "jsonl-missing-field" and "language-model" in refused.value.detail
    with pytest.raises(TextValidationError) as unknown:
        scan_text(path, task="regression", classes=None, options=TextOptions(), limits=LIMITS)
    assert unknown.value.reason == "unknown-text-task"
    assert scan_text(path, task="language-model", classes=None, options=TextOptions(), limits=LIMITS).n_rows == 6


@pytest.mark.parametrize(
    "options",
    [
        TextOptions(max_length=0),
        TextOptions(max_length=4097),
        TextOptions(fields=JsonlFields(text="x", label="x")),
        TextOptions(fields=JsonlFields(text="", label="label")),
    ],
)
def test_options_out_of_bounds_are_refused_before_reading(options: TextOptions) -> None:
    with pytest.raises(TextValidationError) as refused:
        check_text_options(options, limits=LIMITS)
    assert refused.value.reason == "bad-text-options"


def _tokens(tmp_path: Path, body: bytes, *, max_length: int, limits: IngestLimits = LIMITS) -> np.ndarray:
    path = _file(tmp_path, body)
    options = TextOptions(max_length=max_length)
    scanned = scan_text(path, task=None, classes=None, options=options, limits=limits)
    out = io.BytesIO()
    write_token_rows(path, options=options, tokenizer=ByteTokenizer(), n_rows=scanned.n_rows, limits=limits, out=out)
    out.seek(0)
    array: np.ndarray = np.load(out, allow_pickle=False)
    return array


def test_token_rows_are_truncated_and_right_padded(tmp_path: Path) -> None:
    tokens = _tokens(tmp_path, jsonl([{"text": "abcdef"}, {"text": "é"}, {"text": ""}]), max_length=4)
    assert tokens.dtype == np.uint16 and tokens.shape == (3, 4)
    assert tokens.tolist() == [
        [97, 98, 99, 100],  # truncated at max_length
        [0xC3, 0xA9, PAD_ID, PAD_ID],  # é is two UTF-8 bytes, then padding
        [PAD_ID] * 4,
    ]


def test_tokenisation_is_chunked_across_many_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("kernel.ingest.text.ENCODE_CHUNK_ROWS", 3)
    texts = [f"row {i}" for i in range(10)]
    tokens = _tokens(tmp_path, jsonl([{"text": t} for t in texts]), max_length=6)
    assert [ByteTokenizer().decode(row) for row in tokens.tolist()] == texts


def test_a_token_array_beyond_the_decompressed_cap_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TextValidationError) as refused:
        _tokens(tmp_path, language_model_body(repeat=1), max_length=64, limits=IngestLimits(max_decompressed_bytes=100))
    assert refused.value.reason == "token-array-too-large"


def test_ids_take_uint16_while_they_fit_and_int32_beyond() -> None:
    assert token_dtype(259) == np.uint16 and token_dtype(65_536) == np.uint16
    assert token_dtype(65_537) == np.int32
