"""Every parser of client-supplied structured data against hostile shapes (issue 36, item 1):
deep nesting, integers past Python's 4,300-digit limit, values of the wrong type, negative or
huge shapes, offsets outside the file. Each refuses with its own domain error and a reason, never
another exception (the API's 500); and a hypothesis property per parser feeds it random bytes or
random JSON trees and asserts "a result or the domain error, nothing else"."""

from __future__ import annotations

import io
import json
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from api.problems import Problem
from api.routes.base_models import _parse_params
from kernel.base_models.registry import BaseModelUpload, normalised_params
from kernel.base_models.safetensors_header import InvalidSafetensors, read_header
from kernel.errors import InvalidInput
from kernel.ingest import DatasetValidationError, IngestLimits, parse_class_list, parse_dataset
from kernel.ingest.jsonl import JsonlFields, read_records
from kernel.ingest.text_errors import TextValidationError
from kernel.model_catalogue import ModelSizeLimits
from kernel.tokenizers.hugging_face import load_tokenizer_json
from tests.text_fixtures import word_level_tokenizer_json

HUGE_INT = "1" * 5000
DEEP = "[" * 5000 + "]" * 5000
SETTINGS = settings(database=None, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

json_trees = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from(["F32", "BF16", "U8", "x", "", "dtype", "shape", "data_offsets", "__metadata__"]),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(["dtype", "shape", "data_offsets", "__metadata__", "hidden_sizes", "a", "t", "model"]),
            children,
            max_size=4,
        )
    ),
    max_leaves=16,
)


def _deepen(tree: object, levels: int) -> object:
    for _ in range(levels):
        tree = {"a": tree} if levels % 2 else [tree]
    return tree


# ------------------------------------------------------------------------------- JSON Lines


def _records(path: Path) -> list[object]:
    return list(read_records(path, fields=JsonlFields(), limits=IngestLimits()))


@pytest.mark.parametrize(
    "line",
    [
        '{"text": "a", "label": ' + HUGE_INT + "}",  # a bare ValueError from json.loads: issue 36
        '{"text": "a", "label": 1, "meta": ' + HUGE_INT + "}",
        '{"text": "a", "label": ' + DEEP + "}",
        '{"text": "a", "label": 1, "meta": ' + "[" * 65 + "]" * 65 + "}",
    ],
)
def test_a_hostile_jsonl_record_is_refused_naming_its_line(tmp_path: Path, line: str) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('{"text": "fine", "label": 0}\n' + line + "\n")
    with pytest.raises(TextValidationError) as caught:
        _records(path)
    assert caught.value.reason == "jsonl-invalid-line" and caught.value.detail.startswith("line 2: ")
    assert "11111" not in caught.value.detail


def test_nan_in_a_member_the_reader_ignores_is_accepted_as_before(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('{"text": "a", "label": 0, "score": NaN}\n{"text": "b", "label": 1, "score": 1e999}\n')
    assert [record.label for record in _records(path)] == [0, 1]  # type: ignore[attr-defined]


jsonl_lines = st.lists(
    st.one_of(
        json_trees.map(lambda tree: json.dumps({"text": "t", "label": tree}).encode()),
        st.builds(
            lambda tree, deep: json.dumps({"text": "t", "label": 1, "m": _deepen(tree, deep)}).encode(),
            json_trees,
            st.integers(0, 80),
        ),
        st.binary(max_size=30),
        st.sampled_from([b'{"text": "a", "label": ' + HUGE_INT.encode() + b"}", b"[" * 3000, b"\xff\xfe", b"NaN"]),
    ),
    min_size=1,
    max_size=6,
)


@SETTINGS
@given(lines=jsonl_lines)
def test_any_jsonl_is_records_or_a_text_validation_error(tmp_path: Path, lines: list[bytes]) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"\n".join(lines))
    try:
        _records(path)
    except TextValidationError as error:
        assert error.detail


# -------------------------------------------------------------------------- safetensors


def _safetensors(tmp_path: Path, header: bytes, *, data: bytes = b"\0" * 16, length: int | None = None) -> Path:
    path = tmp_path / "w.safetensors"
    path.write_bytes(struct.pack("<Q", len(header) if length is None else length) + header + data)
    return path


def _tensor(**fields: object) -> bytes:
    entry = {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16], **fields}
    return json.dumps({"w": entry}).encode()


@pytest.mark.parametrize(
    ("header", "reason", "says"),
    [
        (DEEP.encode(), "header-too-deep", "nest"),
        (
            ('{"w": {"dtype": "F32", "shape": [' + HUGE_INT + '], "data_offsets": [0, 16]}}').encode(),
            "header-number-too-long",
            "number",
        ),
        (_tensor(shape=[2**70, 0]), "header-number-too-long", "number"),  # past unsigned 64 bits
        (
            b'{"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}, "v": NaN}',
            "header-non-finite-number",
            "",
        ),
        (_tensor(dtype=["F32"]), "malformed", "not a string"),  # TypeError (unhashable) before issue 36
        (_tensor(dtype={"a": 1}), "malformed", "not a string"),
        (_tensor(dtype=4), "malformed", "not a string"),
        (_tensor(dtype=None), "malformed", "not a string"),
        (_tensor(dtype="F" * 5000), "malformed", "unsupported dtype"),
        (_tensor(shape=[2, -2]), "malformed", "invalid shape"),
        (_tensor(shape=[2, 2.0]), "malformed", "invalid shape"),
        (_tensor(shape=[True, 4]), "malformed", "invalid shape"),
        (_tensor(shape=[[2], 2]), "malformed", "invalid shape"),
        (_tensor(shape="2,2"), "malformed", "invalid shape"),
        (_tensor(shape=[1] * 33), "malformed", "invalid shape"),
        (_tensor(data_offsets=[0, 2**63]), "malformed", "outside"),
        (_tensor(data_offsets=[16, 32]), "malformed", "outside"),
        (_tensor(data_offsets=[8, 0]), "malformed", "outside"),
        (_tensor(data_offsets=[-16, 0]), "malformed", "data_offsets"),
        (_tensor(data_offsets=[0, 16, 32]), "malformed", "data_offsets"),
        (_tensor(data_offsets=[0, 12]), "malformed", "do not match"),
        (json.dumps({"w" * 5000: {"dtype": 1}}).encode(), "malformed", "…"),
        (b'{"__metadata__": {"a": 1}}', "malformed", "__metadata__"),
        (b"\xff\xfe{}", "malformed", "UTF-8"),
        (b"[]", "malformed", "object"),
    ],
)
def test_a_hostile_safetensors_header_is_invalid_safetensors(
    tmp_path: Path, header: bytes, reason: str, says: str
) -> None:
    with pytest.raises(InvalidSafetensors) as caught:
        read_header(_safetensors(tmp_path, header))
    assert caught.value.extra["reason"] == reason and says in caught.value.detail
    assert len(caught.value.detail) < 600  # a 5,000-character name or dtype is not echoed whole


def test_a_header_longer_than_the_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidSafetensors, match="exceeds the file"):
        read_header(_safetensors(tmp_path, b"{}", length=2**63))


def test_a_valid_header_still_reads(tmp_path: Path) -> None:
    entries = read_header(_safetensors(tmp_path, _tensor()))
    assert entries["w"].shape == (2, 2) and entries["w"].dtype == "F32"


@SETTINGS
@given(
    header=st.one_of(
        st.builds(lambda tree, deep: json.dumps(_deepen(tree, deep)).encode(), json_trees, st.integers(0, 12)),
        st.binary(max_size=64),
    )
)
def test_any_safetensors_header_is_entries_or_invalid_safetensors(tmp_path: Path, header: bytes) -> None:
    try:
        read_header(_safetensors(tmp_path, header))
    except InvalidSafetensors as error:
        assert error.slug == "invalid-safetensors"


counts = st.integers(min_value=-3, max_value=2**65)
tensor_entries = (
    st.fixed_dictionaries(
        {
            "dtype": st.sampled_from(["F32", "U8", "F99"]) | json_trees,
            "shape": st.lists(counts, max_size=4) | json_trees,
            "data_offsets": st.lists(counts, min_size=2, max_size=2) | json_trees,
        }
    )
    | json_trees
)


@SETTINGS
@given(entry=tensor_entries)
def test_any_tensor_entry_is_read_or_invalid_safetensors(tmp_path: Path, entry: object) -> None:
    try:
        read_header(_safetensors(tmp_path, json.dumps({"w": entry}).encode()))
    except InvalidSafetensors as error:
        assert error.slug == "invalid-safetensors"


# ------------------------------------------------------------------------ base-model params

SIZE_LIMITS = ModelSizeLimits(max_parameters=10**6, max_activation_bytes=10**9, physical_batch_size=64)


def _params_then_validate(text: str) -> None:
    params = _parse_params(text)
    upload = BaseModelUpload(
        name="b", architecture="mlp", params=params, input_shape=(8,), n_outputs=2, source=None, idempotency_key=None
    )
    normalised_params(upload, SIZE_LIMITS)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('{"hidden_sizes": ' + "[" * 5000 + "]" * 5000 + "}", "params-too-deep"),  # RecursionError: issue 36
        (DEEP, "params-too-deep"),
        ('{"hidden_sizes": [' + HUGE_INT + "]}", "params-number-too-long"),
        ('{"hidden_sizes": [NaN]}', "params-non-finite-number"),
        ('{"hidden_sizes": [1e999]}', "params-non-finite-number"),
        ("{", "params-invalid-json"),
        ("[1]", "params-not-an-object"),
    ],
)
def test_hostile_params_are_a_422_with_a_reason(text: str, reason: str) -> None:
    with pytest.raises(Problem) as caught:
        _parse_params(text)
    assert caught.value.status == 422 and caught.value.extra["reason"] == reason


@SETTINGS
@given(tree=json_trees, deep=st.integers(0, 20), hostile=st.sampled_from([None, DEEP, HUGE_INT, "NaN", "1e999"]))
def test_any_params_are_valid_or_refused_as_invalid_input(tree: object, deep: int, hostile: str | None) -> None:
    text = json.dumps({"hidden_sizes": _deepen(tree, deep)} if deep % 3 else _deepen(tree, deep))
    if hostile is not None:
        text = '{"hidden_sizes": [' + hostile + "]}"
    try:
        _params_then_validate(text)
    except Problem as problem:
        assert problem.status == 422
    except InvalidInput as error:
        assert error.slug in ("model-incompatible", "unknown-model")


# ------------------------------------------------------------------------------ tokenizers


@pytest.mark.parametrize(
    "body",
    [
        DEEP.encode(),
        ('{"model": ' + "[" * 100 + "]" * 100 + "}").encode(),
        b"\xff\xfe not UTF-8",
        (
            '{"version": "1.0", "model": {"type": "WordLevel", "vocab": {"a": ' + HUGE_INT + '}, "unk_token": "a"}}'
        ).encode(),
    ],
)
def test_a_hostile_tokenizer_json_is_an_invalid_tokenizer(body: bytes) -> None:
    with pytest.raises(InvalidInput) as caught:
        load_tokenizer_json(body, pad_token=None, max_vocab=1000)
    assert caught.value.slug == "invalid-tokenizer"


@SETTINGS
@given(tree=json_trees, deep=st.integers(0, 70))
def test_any_tokenizer_json_loads_or_is_refused(tree: object, deep: int) -> None:
    document = json.loads(word_level_tokenizer_json())
    document["model"]["vocab"]["x"] = _deepen(tree, deep)
    try:
        load_tokenizer_json(json.dumps(document).encode(), pad_token=None, max_vocab=1000)
    except InvalidInput as error:
        assert error.slug in ("invalid-tokenizer", "tokenizer-vocab-size", "tokenizer-without-pad")


# -------------------------------------------------------------------------------- NPZ shapes


def _npy(header: str, data: bytes = b"\0" * 64) -> bytes:
    encoded = header.encode("latin1")
    padding = (64 - (10 + len(encoded) + 1) % 64) % 64
    encoded += b" " * padding + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(encoded)) + encoded + data


def _npz(tmp_path: Path, features: bytes) -> Path:
    labels = io.BytesIO()
    np.save(labels, np.zeros(2))
    path = tmp_path / "d.npz"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("X.npy", features)
        archive.writestr("y.npy", labels.getvalue())
    return path


@pytest.mark.parametrize(
    "shape",
    [
        "(-1, -1)",
        "(2, -3)",
        "(True, 2)",
        "(2, " + "1" * 5000 + ")",
        "(" + "(" * 3000 + ")" * 3000 + ")",
        "(1,) * 40",
        "(2, 99999999999999999999)",
    ],
)
def test_a_hostile_npy_shape_is_invalid_npz(tmp_path: Path, shape: str) -> None:
    header = "{'descr': '<f8', 'fortran_order': False, 'shape': " + shape + ", }"
    with pytest.raises(DatasetValidationError) as caught:
        parse_dataset(_npz(tmp_path, _npy(header)), fmt="npz", label_column=None, task=None, limits=IngestLimits())
    assert caught.value.reason == "invalid-npz"


@SETTINGS
@given(
    shape=st.lists(st.integers(min_value=-(2**65), max_value=2**65) | st.booleans(), max_size=6),
    descr=st.sampled_from(["<f8", "|u1", "|b1", "<i8", "|O", "<U3", "|V4", "<c8"]),
)
def test_any_npy_header_is_read_or_refused(tmp_path: Path, shape: list[int], descr: str) -> None:
    dims = "".join(f"{d!r}, " for d in shape)
    header = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': ({dims}), }}"
    try:
        parse_dataset(_npz(tmp_path, _npy(header)), fmt="npz", label_column=None, task=None, limits=IngestLimits())
    except DatasetValidationError as error:
        assert error.detail


# ------------------------------------------------------------------------------- class lists


@SETTINGS
@given(text=st.text(alphabet=st.sampled_from("ab1,. -e\x00\u00e9"), max_size=40) | st.just("1" * 5000 + ",2"))
def test_any_class_list_is_names_or_a_bad_class_list(text: str) -> None:
    try:
        names = parse_class_list(text, max_classes=10)
    except DatasetValidationError as error:
        assert error.reason == "bad-class-list"
        return
    assert names is not None and 2 <= len(names) <= 10
