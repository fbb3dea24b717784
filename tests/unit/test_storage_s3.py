"""The S3 blob store against a real S3-compatible server process: content addressing, the local
cache and its bound, refused uploads leaving no object, corrupted objects refused, outages as
StorageUnavailable."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from kernel.config import Settings
from kernel.storage.blobs import StorageUnavailable
from kernel.storage.configured import blob_store_from_settings
from kernel.storage.s3 import BlobCache, S3BlobStore, S3Location
from tests.conftest import make_settings
from tests.object_store import ObjectStoreServer, free_port

pytestmark = pytest.mark.usefixtures("s3_bucket")


def _store(tmp_path: Path, url: str, *, cache_bytes: int = 10**9) -> S3BlobStore:
    settings = make_settings(tmp_path / "data", storage_url=url, blob_cache_max_bytes=cache_bytes)
    store = blob_store_from_settings(settings)
    assert isinstance(store, S3BlobStore)
    return store


def _objects(server: ObjectStoreServer, location: S3Location) -> list[str]:
    listed = server.client().list_objects_v2(Bucket=location.bucket)
    return [item["Key"] for item in listed.get("Contents", [])]


def test_a_blob_round_trips_through_the_store_and_its_cache(
    tmp_path: Path, s3_bucket: str, object_store_server: ObjectStoreServer
) -> None:
    store = _store(tmp_path, s3_bucket)
    data = b"x" * 3_000_000  # several parts' worth is not needed: boto3 decides; the bytes must match
    key, digest = store.put_bytes(data)
    assert digest == hashlib.sha256(data).hexdigest() and key == store.key_for(digest)
    assert _objects(object_store_server, store.location) == [f"blobs/{key}"]
    assert store.exists(key) and not store.exists(store.key_for("0" * 64))
    assert not list(store.tmp_dir.glob("upload-*"))  # the temporary file went to the store
    first = store.local_path(key)
    assert first.read_bytes() == data
    # Served from the cache now: even with the object gone from the bucket.
    object_store_server.client().delete_object(Bucket=store.location.bucket, Key=f"blobs/{key}")
    assert store.local_path(key) == first
    store.delete(key)
    assert not first.exists()
    with pytest.raises(FileNotFoundError):
        store.local_path(key)
    assert store.put_bytes(data)[0] == key and store.put_bytes(data)[0] == key  # the same bytes, one object
    assert _objects(object_store_server, store.location) == [f"blobs/{key}"]


def test_a_refused_upload_leaves_no_object(
    tmp_path: Path, s3_bucket: str, object_store_server: ObjectStoreServer
) -> None:
    store = _store(tmp_path, s3_bucket)
    pending = store.begin(max_bytes=10)
    pending.write(b"12345")
    pending.discard()  # validation failed: nothing was adopted
    assert _objects(object_store_server, store.location) == []
    assert not pending.path.exists()


def test_an_object_that_does_not_match_its_address_is_refused(
    tmp_path: Path, s3_bucket: str, object_store_server: ObjectStoreServer
) -> None:
    store = _store(tmp_path, s3_bucket)
    key = store.key_for(hashlib.sha256(b"the real bytes").hexdigest())
    object_store_server.client().put_object(Bucket=store.location.bucket, Key=f"blobs/{key}", Body=b"other bytes")
    with pytest.raises(StorageUnavailable, match="does not match its content address"):
        store.local_path(key)
    assert not store.cache.path(key).exists() and not list(store.tmp_dir.glob(".fetch-*"))


def test_the_cache_stays_within_its_bound(tmp_path: Path, s3_bucket: str) -> None:
    store = _store(tmp_path, s3_bucket, cache_bytes=2500)
    keys = [store.put_bytes(bytes([i]) * 1000)[0] for i in range(4)]
    for key in keys:
        assert store.local_path(key).stat().st_size == 1000
    cached = [key for key in keys if store.cache.path(key).exists()]
    assert cached == keys[-2:]  # least recently used evicted first
    assert store.local_path(keys[0]).read_bytes() == bytes([0]) * 1000  # fetched again on demand


def test_an_outage_is_storage_unavailable_and_recovers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    own = ObjectStoreServer(port=free_port())
    own.start()
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL", own.endpoint)
        own.client().create_bucket(Bucket="outage")
        store = _store(tmp_path, "s3://outage")
        key = store.put_bytes(b"kept")[0]
        own.stop()
        pending = store.begin()
        pending.write(b"new bytes")
        digest = pending.finish()
        with pytest.raises(StorageUnavailable):
            store.adopt(pending.path, digest)
        with pytest.raises(StorageUnavailable):
            store.exists(key)
        own.start()  # moto keeps nothing across restarts: a fresh, empty store
        own.client().create_bucket(Bucket="outage")
        assert store.adopt(pending.path, digest) == (store.key_for(digest), True)
        assert store.local_path(store.key_for(digest)).read_bytes() == b"new bytes"
    finally:
        own.stop()


def test_storage_urls() -> None:
    assert S3Location.parse("s3://bucket") == S3Location("bucket", "")
    assert S3Location.parse("s3://bucket/a/b/") == S3Location("bucket", "a/b/")
    with pytest.raises(ValueError):
        S3Location.parse("s3:///prefix")
    with pytest.raises(ValueError, match="file:// or s3://"):
        Settings(storage_url="gs://bucket")  # type: ignore[call-arg]


def test_a_file_url_is_a_folder(tmp_path: Path) -> None:
    settings = make_settings(tmp_path / "data", storage_url=f"file://{tmp_path / 'elsewhere'}")
    store = blob_store_from_settings(settings)
    key = store.put_bytes(b"abc")[0]
    assert store.local_path(key) == tmp_path / "elsewhere" / key


def test_blob_cache_keys_stay_inside(tmp_path: Path) -> None:
    cache = BlobCache(tmp_path, max_bytes=10)
    with pytest.raises(ValueError):
        cache.path("../escape")
