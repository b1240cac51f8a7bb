"""Read-only assets (issue 37): digests, the operator's sources, the content-addressed cache, the archive
a keyed pool's volume is filled from. The sandbox side: test_assets_sandbox.py."""

from __future__ import annotations

import io
import tarfile
import uuid
from pathlib import Path

import msgspec
import pytest

from rollstream.consumers.executor.assets import (
    AssetCache,
    AssetError,
    allowed,
    archive,
    check_layout,
    local_digest,
    set_key,
)
from rollstream.schemas.events import Asset, RewardSpec
from rollstream.tasks.outside import LEVELS_DIGEST, SALES_DIGEST, levels, outside_tasks, sales
from rollstream.tasks.sources import ASSETS_DIR, load_tasks

pytestmark = pytest.mark.unit


def tree(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


def test_a_directory_digest_covers_every_file_its_content_and_its_place(tmp_path: Path) -> None:
    base = local_digest(tree(tmp_path / "a", {"x.txt": b"1", "d/y.txt": b"2"}))
    assert base == local_digest(tree(tmp_path / "b", {"d/y.txt": b"2", "x.txt": b"1"}))  # order of making
    assert base != local_digest(tree(tmp_path / "c", {"x.txt": b"1", "d/y.txt": b"3"}))  # a file's content
    assert base != local_digest(tree(tmp_path / "d", {"x.txt": b"1", "e/y.txt": b"2"}))  # a file's place
    assert base != local_digest(tree(tmp_path / "e", {"x.txt": b"1", "d/y.txt": b"2", "z": b""}))  # one more
    assert local_digest(tmp_path / "a" / "x.txt") == (
        "sha256:6b86b273ff34fce19d6b804eff5a3f5747ada4eaa22f1d49c01e52ddb7875b4b")  # a file: sha256 of its bytes


def test_the_shipped_assets_are_the_ones_their_tasks_pin() -> None:
    assert local_digest(ASSETS_DIR / "sales.json") == SALES_DIGEST
    assert local_digest(ASSETS_DIR / "levels") == LEVELS_DIGEST
    tasks = load_tasks(["outside"])
    assert {t.family for t in tasks} == {"outside"} and len(tasks) >= 9
    assert all(bool(t.reward.assets) != bool(t.reward.network) for t in tasks)  # each needs one or the other
    assert not any(t.reward.assets for t in load_tasks(["builtin"]))  # the default mixture is unchanged
    assert sorted(t.task_id for t in outside_tasks()) == [t.task_id for t in tasks]


@pytest.mark.parametrize("place", ["/etc", "../x", "a/../b", "a//b", "", ".hidden", "a/", "x" * 201, "a b"])
def test_an_asset_lives_at_a_plain_relative_place(place: str) -> None:
    raw = msgspec.json.encode({"path": place, "url": "s3://b/x", "digest": "sha256:" + "0" * 64})
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(raw, type=Asset)


def test_a_digest_is_a_sha256() -> None:
    for digest in ("md5:" + "0" * 32, "sha256:" + "0" * 63, "sha256:" + "G" * 64, "0" * 64):
        with pytest.raises(msgspec.ValidationError):
            msgspec.json.decode(msgspec.json.encode({"path": "a", "url": "s3://b/x", "digest": digest}), type=Asset)


def test_reward_specs_without_assets_read_as_before() -> None:
    assert msgspec.msgpack.decode(msgspec.msgpack.encode({"tests": ["assert True"]}), type=RewardSpec).assets == []


def test_the_operator_names_where_assets_may_come_from(tmp_path: Path) -> None:
    assert allowed(f"file://{ASSETS_DIR}/sales.json", [])  # what ships with rollstream
    assert allowed(str(ASSETS_DIR / "levels"), [])  # a plain path is a file URL
    assert not allowed("file:///etc/passwd", [])
    assert not allowed(f"file://{ASSETS_DIR}/../sources.py", [])  # .. resolved before the check
    assert not allowed(f"file://{ASSETS_DIR}-evil/x", [])  # a prefix ends at a /
    assert allowed("s3://bucket/tasks/data.json", ["s3://bucket/tasks"])
    assert not allowed("s3://bucket/tasks-evil/data.json", ["s3://bucket/tasks"])
    assert not allowed("s3://other/tasks/data.json", ["s3://bucket/tasks/"])
    with pytest.raises(AssetError, match=r"'\.\.'"):
        allowed("s3://bucket/tasks/../secrets/key", ["s3://bucket/tasks/"])
    link = tmp_path / "link"
    link.symlink_to("/etc")
    assert not allowed(f"file://{link}/passwd", [f"file://{tmp_path}"])  # a link out is followed, then refused


def test_two_assets_of_one_task_never_share_a_place() -> None:
    digest = "sha256:" + "0" * 64
    check_layout([Asset(path="a", url="s3://b/a", digest=digest), Asset(path="ab", url="s3://b/b", digest=digest)])
    for second in ("a", "a/b"):
        with pytest.raises(AssetError, match="overlap"):
            check_layout([Asset(path="a", url="s3://b/a", digest=digest),
                          Asset(path=second, url="s3://b/c", digest=digest)])


def test_a_set_is_keyed_by_places_and_digests_not_urls() -> None:
    one = Asset(path="d.json", url="s3://a/d.json", digest="sha256:" + "1" * 64)
    assert set_key([one]) == set_key([msgspec.structs.replace(one, url="file:///srv/d.json")])
    assert set_key([one]) != set_key([msgspec.structs.replace(one, path="e.json")])
    assert set_key([one]) != set_key([msgspec.structs.replace(one, digest="sha256:" + "2" * 64)])


async def test_the_cache_fetches_once_verifies_and_serves_from_itself(tmp_path: Path) -> None:
    source = tree(tmp_path / "src", {"data.json": b'{"a": 1}', "dir/1.txt": b"one", "dir/sub/2.txt": b"two"})
    cache = AssetCache(tmp_path / "cache", 1 << 20, [f"file://{source}"])
    data = Asset(path="data.json", url=f"file://{source}/data.json", digest=local_digest(source / "data.json"))
    folder = Asset(path="dir", url=str(source / "dir"), digest=local_digest(source / "dir"))
    got = dict((a.path, p) for a, p in await cache.resolve_all([data, folder]))
    assert got["data.json"].read_bytes() == b'{"a": 1}'
    assert (got["dir"] / "sub" / "2.txt").read_bytes() == b"two"
    (source / "data.json").write_bytes(b"changed at the source")  # the cache holds what was verified
    assert (await cache.resolve(data)).read_bytes() == b'{"a": 1}'
    assert (cache.fetched, cache.hits) == (2, 1)
    assert not list((tmp_path / "cache").glob("staging-*"))


async def test_a_wrong_digest_a_missing_url_and_a_refused_source_are_the_actions_errors(tmp_path: Path) -> None:
    source = tree(tmp_path / "src", {"data.json": b"x"})
    cache = AssetCache(tmp_path / "cache", 1 << 20, [f"file://{source}"])
    wrong = Asset(path="data.json", url=f"file://{source}/data.json", digest="sha256:" + "0" * 64)
    with pytest.raises(AssetError, match="refused") as caught:
        await cache.resolve(wrong)
    assert isinstance(caught.value, ValueError)  # the stage dead-letters a ValueError with its reason
    assert not cache.entry(wrong.digest).exists() and not list((tmp_path / "cache").glob("staging-*"))
    with pytest.raises(AssetError, match="does not exist"):
        await cache.resolve(Asset(path="d", url=f"file://{source}/nope.json", digest="sha256:" + "1" * 64))
    with pytest.raises(AssetError, match="executor.asset_sources"):
        await cache.resolve(Asset(path="p", url="file:///etc/passwd", digest="sha256:" + "2" * 64))
    unreachable = AssetCache(tmp_path / "cache", 1 << 20, ["nosuchscheme://host/"])
    with pytest.raises(AssetError, match="cannot fetch"):  # a store that cannot be reached
        await unreachable.resolve(Asset(path="q", url="nosuchscheme://host/x", digest="sha256:" + "3" * 64))


async def test_a_failed_fetch_is_not_tried_again_by_every_action(tmp_path: Path) -> None:
    source = tree(tmp_path / "src", {"data.json": b"x"})
    cache = AssetCache(tmp_path / "cache", 1 << 20, [f"file://{source}"])
    asset = Asset(path="data.json", url=f"file://{source}/data.json", digest=local_digest(source / "data.json"))
    (source / "data.json").write_bytes(b"not yet")
    with pytest.raises(AssetError):
        await cache.resolve(asset)
    (source / "data.json").write_bytes(b"x")
    with pytest.raises(AssetError):  # within RETRY_AFTER_S: the same error, no fetch
        await cache.resolve(asset)
    cache._failed.clear()
    assert (await cache.resolve(asset)).read_bytes() == b"x"


async def test_object_storage_through_fsspec(tmp_path: Path) -> None:
    import fsspec

    fs = fsspec.filesystem("memory")
    root = f"/assets-{uuid.uuid4().hex[:8]}"
    fs.pipe({f"{root}/set/a.txt": b"A", f"{root}/set/b/c.txt": b"C"})
    try:
        local = tree(tmp_path / "same", {"a.txt": b"A", "b/c.txt": b"C"})
        asset = Asset(path="set", url=f"memory://{root}/set", digest=local_digest(local))
        cache = AssetCache(tmp_path / "cache", 1 << 20, [f"memory://{root}/"])
        path = await cache.resolve(asset)
        assert (path / "b" / "c.txt").read_bytes() == b"C"
    finally:
        fs.rm(root, recursive=True)


async def test_the_cache_is_bounded_and_evicts_the_least_recently_used(tmp_path: Path) -> None:
    source = tree(tmp_path / "src", {f"{n}.bin": bytes([n]) * 400 for n in range(4)})
    cache = AssetCache(tmp_path / "cache", 1000, [f"file://{source}"])
    assets = [Asset(path=f"{n}.bin", url=f"file://{source}/{n}.bin", digest=local_digest(source / f"{n}.bin"))
              for n in range(4)]
    await cache.resolve(assets[0])
    await cache.resolve(assets[1])
    import os
    import time
    os.utime(cache.entry(assets[0].digest), (time.time() - 100, time.time() - 100))
    os.utime(cache.entry(assets[1].digest), (time.time() - 50, time.time() - 50))
    await cache.resolve(assets[2])  # 1200 bytes: the oldest goes
    assert not cache.entry(assets[0].digest).exists()
    assert cache.entry(assets[1].digest).exists() and cache.entry(assets[2].digest).exists()
    assert cache.evicted == 1
    big = tree(tmp_path / "big", {"big.bin": b"x" * 2000})
    with pytest.raises(AssetError, match="larger than the asset cache"):
        await AssetCache(tmp_path / "c2", 1000, [f"file://{big}"]).resolve(
            Asset(path="big.bin", url=f"file://{big}/big.bin", digest=local_digest(big / "big.bin")))


async def test_the_volume_is_filled_with_the_set_laid_out_read_only(tmp_path: Path) -> None:
    cache = AssetCache(tmp_path / "cache", 1 << 20, [])
    tar = tarfile.open(fileobj=io.BytesIO(archive(await cache.resolve_all([sales(), levels()]))))
    members = {m.name: m for m in tar.getmembers()}
    assert set(members) == {"sales.json", "levels", "levels/1.txt", "levels/2.txt", "levels/3.txt"}
    assert all(m.mode == (0o555 if m.isdir() else 0o444) and m.uid == 0 for m in members.values())
    assert tar.extractfile("levels/1.txt").read() == (ASSETS_DIR / "levels" / "1.txt").read_bytes()


async def test_a_directory_with_a_link_out_is_refused(tmp_path: Path) -> None:
    source = tree(tmp_path / "src", {"set/a.txt": b"A"})
    (source / "set" / "passwd").symlink_to("/etc/passwd")
    cache = AssetCache(tmp_path / "cache", 1 << 20, [f"file://{source}"])
    asset = Asset(path="set", url=f"file://{source}/set", digest="sha256:" + "0" * 64)
    with pytest.raises(AssetError, match="symbolic link"):
        await cache.resolve(asset)


# --- issue 52 item 2: only regular files, cache entries verified again, names matched to their end


@pytest.mark.parametrize("place", ["data.json\n", "a/b\n", "a\nb", "\na"])
def test_a_place_with_a_newline_is_refused(place: str) -> None:
    """msgspec searches with Python's re, where $ also matches before a trailing newline."""
    raw = msgspec.json.encode({"path": place, "url": "s3://b/x", "digest": "sha256:" + "0" * 64})
    with pytest.raises(msgspec.ValidationError, match=r"\$\.path"):
        msgspec.json.decode(raw, type=Asset)
    digest = msgspec.json.encode({"path": "a", "url": "s3://b/x", "digest": "sha256:" + "0" * 64 + "\n"})
    with pytest.raises(msgspec.ValidationError, match=r"\$\.digest"):
        msgspec.json.decode(digest, type=Asset)
    assert msgspec.json.decode(msgspec.json.encode({"path": "a/b.json", "url": "s3://b/x", "digest": "sha256:" + "0" * 64}),
                               type=Asset).path == "a/b.json"


def test_every_name_pattern_holds_to_the_end() -> None:
    from rollstream.config import SamplerConfig

    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"tests": ["assert True"], "network": ["example.org:443\n"]}, RewardSpec)
    assert msgspec.convert({"tests": ["assert True"], "network": ["example.org:443"]}, RewardSpec).network
    with pytest.raises(msgspec.ValidationError, match=r"matching regex.*run_name"):
        msgspec.convert({"run_name": "run\n"}, SamplerConfig)
    assert msgspec.convert({"run_name": "run-1"}, SamplerConfig).run_name == "run-1"


def _release(fifo: Path) -> None:
    """Let a reader blocked on ``fifo`` go (only needed when the refusal failed and a read hung)."""
    import os

    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass  # no reader waits: nothing hung


async def test_a_fifo_is_refused_at_once_not_read(tmp_path: Path) -> None:
    import asyncio
    import os

    source = tree(tmp_path / "src", {"set/a.txt": b"A"})
    fifo = source / "pipe"
    os.mkfifo(fifo)
    cache = AssetCache(tmp_path / "cache", 1 << 20, [f"file://{source}"])
    try:
        with pytest.raises(AssetError, match=r"not a regular file.*refused"):
            await asyncio.wait_for(cache.resolve(Asset(path="p", url=f"file://{fifo}", digest="sha256:" + "0" * 64)), 10)
        os.mkfifo(source / "set" / "pipe")  # one inside a directory asset
        with pytest.raises(AssetError, match="not a regular file"):
            await asyncio.wait_for(cache.resolve(Asset(path="set", url=str(source / "set"),
                                                       digest="sha256:" + "0" * 64)), 10)
        with pytest.raises(AssetError, match="a FIFO"):  # rollstream sandbox asset-digest PATH
            await asyncio.wait_for(asyncio.to_thread(local_digest, fifo), 10)
        with pytest.raises(AssetError, match="a FIFO"):
            await asyncio.wait_for(asyncio.to_thread(local_digest, source / "set"), 10)
    finally:
        _release(fifo)
        _release(source / "set" / "pipe")
    regular = tree(tmp_path / "ok", {"a.txt": b"A"})  # a regular file beside them is read as before
    ok = AssetCache(tmp_path / "cache2", 1 << 20, [f"file://{regular}"])
    path = await ok.resolve(Asset(path="a.txt", url=f"file://{regular}/a.txt", digest=local_digest(regular / "a.txt")))
    assert path.read_bytes() == b"A"


async def test_open_regular_checks_the_descriptor_it_reads(tmp_path: Path) -> None:
    import os

    from rollstream.consumers.executor.assets import open_regular

    (tmp_path / "f").write_bytes(b"data")
    with open_regular(tmp_path / "f") as f:
        assert f.read() == b"data"
    (tmp_path / "link").symlink_to(tmp_path / "f")
    with pytest.raises(AssetError, match="symbolic link"):
        open_regular(tmp_path / "link")
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(AssetError, match="a FIFO"):
        open_regular(tmp_path / "fifo")
    with pytest.raises(AssetError, match="a directory"):
        open_regular(tmp_path)


async def test_a_cached_entry_is_verified_again_before_a_job_uses_it(tmp_path: Path) -> None:
    import os
    import shutil

    source = tree(tmp_path / "src", {"data.json": b'{"a": 1}', "dir/1.txt": b"one"})
    cache = AssetCache(tmp_path / "cache", 1 << 20, [f"file://{source}"])
    data = Asset(path="data.json", url=f"file://{source}/data.json", digest=local_digest(source / "data.json"))
    folder = Asset(path="dir", url=str(source / "dir"), digest=local_digest(source / "dir"))
    entry = await cache.resolve(data)
    entry.chmod(0o644)
    entry.write_bytes(b'{"a": 2}')  # changed on disk after it was verified
    again = await cache.resolve(data)
    assert again.read_bytes() == b'{"a": 1}' and (cache.fetched, cache.hits, cache.reverified_bad) == (2, 0, 1)
    assert (await cache.resolve(data)).read_bytes() == b'{"a": 1}' and cache.hits == 1  # intact: served as before
    tree_entry = await cache.resolve(folder)
    (tree_entry / "extra.txt").write_bytes(b"planted")  # a file added to a cached directory
    assert not (await cache.resolve(folder) / "extra.txt").exists() and cache.reverified_bad == 2
    tree_entry = cache.entry(folder.digest)
    (tree_entry / "1.txt").unlink()
    (tree_entry / "1.txt").symlink_to(source / "dir" / "1.txt")  # the same bytes, through a link
    assert not (await cache.resolve(folder) / "1.txt").is_symlink() and cache.reverified_bad == 3
    os.unlink(cache.entry(data.digest))
    os.mkfifo(cache.entry(data.digest))  # an entry replaced by a FIFO: never read, fetched again
    assert (await cache.resolve(data)).read_bytes() == b'{"a": 1}' and cache.reverified_bad == 4
    shutil.rmtree(cache.entry(folder.digest))
    cache.entry(folder.digest).symlink_to(source / "dir")  # an entry replaced by a link out
    got = await cache.resolve(folder)
    assert not got.is_symlink() and (got / "1.txt").read_bytes() == b"one" and cache.reverified_bad == 5
    cache.entry(data.digest).write_bytes(b"tampered")
    (source / "data.json").write_bytes(b"changed at the source too")  # nothing good left to fetch: refused
    with pytest.raises(AssetError, match="refused"):
        await cache.resolve(data)
    assert not os.path.lexists(cache.entry(data.digest))
