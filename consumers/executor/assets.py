"""Read-only assets for sandboxes (``RewardSpec.assets``): fetched once, verified, cached, mounted.

A task names files or directories by fsspec URL and digest. The executor fetches each into a
content-addressed cache on its own filesystem (``executor.asset_cache``: one entry per digest,
verified before it is kept, evicted least recently used past ``executor.asset_cache_mb``), then
copies a task's whole set into a Docker volume of its own (through the engine's archive API, so
the same code works where the executor runs in a container of its own, as in compose, and holds
only the engine's socket) that the pool keyed by that set mounts read-only at ``/assets``
(consumers/executor/keyed.py). A sandbox never sees a set it did not ask for.

Digests: a file's is ``sha256:`` + the sha256 of its bytes; a directory's is ``sha256:`` + the
sha256 over one line ``<relative path>\\0<file digest hex>\\n`` per regular file, in sorted order of
the relative POSIX paths (empty directories do not count). :func:`local_digest` computes either for
a local path (``rollstream sandbox asset-digest PATH``).

Only regular files and directories of them are assets: a FIFO, socket or device (which would hang
a read, or never end one) is refused before a byte is read. A local file is opened without blocking
and without following a link, and checked on the descriptor it is read from (no race between the
check and the read). A cache entry is verified again, against the digest its name says, every time
it is handed out, before a job uses it: an entry changed on disk since it was fetched is dropped and
fetched again, never mounted.

What goes wrong with an asset is the action's, never the stage's: an URL outside
``executor.asset_sources``, an unreachable URL, a wrong digest, a source that is not a regular file
or directory, or an asset over the cache's bound raises :class:`AssetError` (a ``ValueError``: the
executor dead-letters the action with the reason).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import io
import logging
import os
import posixpath
import secrets
import shutil
import stat
import tarfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from rollstream.schemas.events import Asset
from rollstream.tasks.sources import ASSETS_DIR as BUNDLED  # what ships with rollstream: always allowed

log = logging.getLogger(__name__)

CHUNK = 1 << 20
RETRY_AFTER_S = 30.0  # a failed fetch is tried again by the first action this long after it


class AssetError(ValueError):
    """An asset that cannot be given to a task (the reason says which and why)."""


def open_regular(path: str | Path, what: str = "") -> io.BufferedReader:
    """``path`` opened for reading when it is a regular file: opened without blocking (a FIFO's open
    never waits for a writer) and without following a final link, then checked on the descriptor
    that is read (S_ISREG), so nothing can be swapped in between the check and the read. AssetError
    for anything else; OSError when it cannot be opened."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise AssetError(f"{what or path}: {path} is a symbolic link (an asset is a regular file)") from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise AssetError(f"{what or path}: {path} is not a regular file ({_kind(mode)}): refused")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a directory"), (stat.S_ISLNK, "a link")):
        if test(mode):
            return name
    return "not a file"


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open_regular(path) as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def tree_digest(files: Iterable[tuple[str, str]]) -> str:
    """A directory's digest (hex) from ``(relative POSIX path, file digest hex)`` pairs."""
    h = hashlib.sha256()
    for rel, digest in sorted(files):
        h.update(f"{rel}\0{digest}\n".encode())
    return h.hexdigest()


def local_digest(path: str | Path) -> str:
    """``sha256:<hex>`` of a local file or directory, as :class:`Asset.digest` wants it."""
    root = Path(os.path.realpath(path))  # a link given on the command line: what it names
    if root.is_dir():
        files = []
        for entry in sorted(root.rglob("*")):
            if entry.is_symlink():
                raise AssetError(f"{entry}: an asset directory holds no symbolic links")
            mode = entry.lstat().st_mode
            if stat.S_ISREG(mode):
                files.append((entry.relative_to(root).as_posix(), file_digest(entry)))
            elif not stat.S_ISDIR(mode):
                raise AssetError(f"{entry}: not a regular file ({_kind(mode)}): an asset directory holds only files")
        return "sha256:" + tree_digest(files)
    return "sha256:" + file_digest(root)


def set_key(assets: Sequence[Asset]) -> str:
    """What keys a pool: the set's places and digests (the URLs do not matter once verified)."""
    return tree_digest((a.path, a.digest) for a in assets)[:24]


def check_layout(assets: Sequence[Asset]) -> None:
    """Two assets of one task may not share a place or nest inside each other."""
    paths = sorted(a.path for a in assets)
    for before, after in zip(paths, paths[1:]):
        if after == before or after.startswith(before + "/"):
            raise AssetError(f"assets {before!r} and {after!r} overlap: each needs a place of its own under /assets")


def normalised_url(url: str) -> str:
    """A local path as a ``file://`` URL, ``..`` resolved; any other URL as given (without ``..``)."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme == "file":
        path = rest if sep else url
        return "file://" + os.path.realpath(path)
    if ".." in rest.split("/"):
        raise AssetError(f"asset URL {url!r}: no '..' segments")
    return url


def allowed(url: str, sources: Sequence[str]) -> bool:
    """Whether ``url`` lies under one of the operator's ``sources`` (or is bundled with rollstream)."""
    url = normalised_url(url)
    prefixes = [normalised_url(s) if s.startswith(("file://", "/")) else s for s in sources]
    prefixes.append("file://" + str(BUNDLED))
    for prefix in prefixes:
        if url == prefix or url.startswith(prefix if prefix.endswith("/") else prefix + "/"):
            return True
    return False


class AssetCache:
    """The content-addressed cache: ``resolve(asset)`` -> the local path holding its verified content."""

    def __init__(self, root: str | Path, max_bytes: int, sources: Sequence[str] = ()) -> None:
        self.root = Path(root)
        self.max_bytes = max_bytes
        self.sources = list(sources)
        self._locks: dict[str, asyncio.Lock] = {}
        self._failed: dict[tuple[str, str], tuple[float, AssetError]] = {}
        self.fetched = 0
        self.hits = 0
        self.evicted = 0
        self.reverified_bad = 0  # entries found changed on disk when handed out again (dropped, fetched again)

    @classmethod
    def from_config(cls, config: Any) -> AssetCache:
        root = config.asset_cache or os.path.join(
            os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "rollstream", "assets")
        return cls(root, config.asset_cache_mb << 20, config.asset_sources)

    def entry(self, digest: str) -> Path:
        return self.root / "sha256" / digest.removeprefix("sha256:")

    async def resolve(self, asset: Asset) -> Path:
        if not allowed(asset.url, self.sources):
            raise AssetError(
                f"asset {asset.path!r}: {asset.url!r} is not under executor.asset_sources "
                f"({', '.join(self.sources) or 'none: only the assets that ship with rollstream'}); "
                "the operator lists the URL prefixes tasks may use (docs/executor.md, \"Assets\")")
        lock = self._locks.setdefault(asset.digest, asyncio.Lock())
        async with lock:
            path = self.entry(asset.digest)
            if os.path.lexists(path):
                if await asyncio.to_thread(self.intact, path, asset.digest):  # again, before a job uses it
                    self.hits += 1
                    os.utime(path, follow_symlinks=False)  # least recently used goes first
                    return path
                log.warning("asset cache: %s no longer holds %s (changed on disk since it was verified): "
                            "dropped, fetched again", path, asset.digest)
                await asyncio.to_thread(_remove, path)
                self.reverified_bad += 1
            failed = self._failed.get((asset.url, asset.digest))
            if failed is not None and time.monotonic() - failed[0] < RETRY_AFTER_S:
                raise failed[1]  # every action of a task with a bad asset: not a fetch each
            try:
                await asyncio.to_thread(self._fetch, asset, path)
            except AssetError as exc:
                self._failed[(asset.url, asset.digest)] = (time.monotonic(), exc)
                raise
            self._failed.pop((asset.url, asset.digest), None)
            self.fetched += 1
            await asyncio.to_thread(self._evict, {path})
            return path

    @staticmethod
    def intact(path: Path, digest: str) -> bool:
        """Whether cache entry ``path`` still holds exactly what ``digest`` pins: a regular file of that
        sha256, or a directory of regular files (no link, FIFO, ...) of that tree digest."""
        try:
            mode = os.lstat(path).st_mode
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                return False
            return local_digest(path) == digest
        except (OSError, AssetError):
            return False

    async def resolve_all(self, assets: Sequence[Asset]) -> list[tuple[Asset, Path]]:
        check_layout(assets)
        return [(asset, await self.resolve(asset)) for asset in assets]

    def _fetch(self, asset: Asset, path: Path) -> None:
        import fsspec

        started = time.monotonic()
        staging = self.root / f"staging-{secrets.token_hex(6)}"
        try:
            fs, remote = fsspec.core.url_to_fs(normalised_url(asset.url))
            if fs.isdir(remote):
                files = self._fetch_tree(fs, remote, staging, asset)
                got = tree_digest(files)
            elif fs.exists(remote):
                kind = fs.info(remote).get("type")
                if kind != "file":  # a FIFO, socket or device: a read that hangs or never ends
                    raise AssetError(f"asset {asset.path!r}: {asset.url} is not a regular file or directory "
                                     f"({kind}): refused")
                staging.parent.mkdir(parents=True, exist_ok=True)
                got, _ = self._fetch_file(fs, remote, staging, self.max_bytes, asset)
            else:
                raise AssetError(f"asset {asset.path!r}: {asset.url} does not exist")
            if "sha256:" + got != asset.digest:
                raise AssetError(f"asset {asset.path!r}: {asset.url} has digest sha256:{got}, the task says "
                                 f"{asset.digest}: refused (a changed file, or a wrong digest in the task)")
            path.parent.mkdir(parents=True, exist_ok=True)
            os.replace(staging, path)
        except AssetError:
            raise
        except Exception as exc:  # fsspec's and the stores' own errors: unreachable, denied, ...
            raise AssetError(f"asset {asset.path!r}: cannot fetch {asset.url}: {type(exc).__name__}: {exc}") from exc
        finally:
            if staging.is_dir():
                shutil.rmtree(staging, ignore_errors=True)
            else:
                staging.unlink(missing_ok=True)
        log.info("asset %s fetched from %s in %.2f s", asset.digest[:19], asset.url, time.monotonic() - started)

    def _fetch_file(self, fs: Any, remote: str, dest: Path, budget: int, asset: Asset) -> tuple[str, int]:
        h, size = hashlib.sha256(), 0
        from fsspec.implementations.local import LocalFileSystem

        local = isinstance(fs, LocalFileSystem)  # read through a descriptor checked to be a regular file
        source = open_regular(remote, f"asset {asset.path!r}") if local else fs.open(remote, "rb")
        with source as src, open(dest, "wb") as out:
            while chunk := src.read(CHUNK):
                size += len(chunk)
                if size > budget:
                    raise AssetError(f"asset {asset.path!r}: {asset.url} is larger than the asset cache "
                                     f"(executor.asset_cache_mb = {self.max_bytes >> 20})")
                h.update(chunk)
                out.write(chunk)
        return h.hexdigest(), size

    def _fetch_tree(self, fs: Any, remote: str, staging: Path, asset: Asset) -> list[tuple[str, str]]:
        base = remote.rstrip("/")
        files, budget = [], self.max_bytes
        found = fs.find(base, detail=True)
        for name in sorted(found):
            if found[name].get("islink"):  # a local directory's link could lead out of the allowed sources
                raise AssetError(f"asset {asset.path!r}: {name} is a symbolic link (an asset directory holds none)")
            if found[name].get("type") not in ("file", None):  # a FIFO, socket or device in the directory
                raise AssetError(f"asset {asset.path!r}: {name} is not a regular file ({found[name].get('type')}): "
                                 "an asset directory holds only files")
            rel = posixpath.relpath(name, base)
            if rel.startswith("..") or rel == ".":
                continue
            dest = staging / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            digest, size = self._fetch_file(fs, name, dest, budget, asset)
            budget -= size
            files.append((rel, digest))
        staging.mkdir(parents=True, exist_ok=True)
        return files

    def _evict(self, keep: set[Path]) -> None:
        """Drop the least recently used entries until the cache fits its bound (``keep`` stays)."""
        store = self.root / "sha256"
        entries = []
        for path in store.iterdir() if store.is_dir() else ():
            size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else path.stat().st_size
            entries.append((path.stat().st_mtime, size, path))
        total = sum(size for _, size, _ in entries)
        for _, size, path in sorted(entries):
            if total <= self.max_bytes:
                break
            if path in keep:
                continue
            shutil.rmtree(path) if path.is_dir() else path.unlink()
            total -= size
            self.evicted += 1
            log.info("asset cache: evicted %s (%d bytes; the cache is bounded at %d)", path.name[:16], size,
                     self.max_bytes)


def _remove(path: Path) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def archive(resolved: Sequence[tuple[Asset, Path]]) -> bytes:
    """A tar of the set laid out as ``/assets`` shows it: root's, files 0444, directories 0555."""
    buffer = io.BytesIO()
    made: set[str] = set()

    def directory(tar: tarfile.TarFile, name: str) -> None:
        parts = name.split("/")
        for depth in range(1, len(parts) + 1):
            prefix = "/".join(parts[:depth])
            if prefix and prefix not in made:
                made.add(prefix)
                info = tarfile.TarInfo(prefix)
                info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o555, 0
                tar.addfile(info)

    def add_file(tar: tarfile.TarFile, name: str, source: Path) -> None:
        directory(tar, posixpath.dirname(name))
        info = tarfile.TarInfo(name)
        info.size, info.mode, info.mtime = source.stat().st_size, 0o444, 0
        with open(source, "rb") as f:
            tar.addfile(info, f)

    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for asset, path in sorted(resolved, key=lambda item: item[0].path):
            if path.is_dir():
                directory(tar, asset.path)
                for entry in sorted(path.rglob("*")):
                    if entry.is_file():
                        add_file(tar, f"{asset.path}/{entry.relative_to(path).as_posix()}", entry)
                    elif entry.is_dir():
                        directory(tar, f"{asset.path}/{entry.relative_to(path).as_posix()}")
            else:
                add_file(tar, asset.path, path)
    return buffer.getvalue()
