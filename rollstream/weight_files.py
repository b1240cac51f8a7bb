"""A weight store whose data plane is files: for models too big to keep versions in Redis memory.

``weights.store = URL`` (a directory, ``file://...``, ``s3://bucket/weights``, any fsspec URL).
Each version is a directory of safetensors files that SGLang's ``/update_weights_from_disk`` and
transformers' ``from_pretrained`` read as it is::

    {url}/v00000012/
      model.safetensors            one file, or model-00001.safetensors ... (each <= file_shard_bytes)
      model.safetensors.index.json when there are several (weight_map: tensor -> file)
      config.json                  the model's config (from the learner)

Redis stays the control plane, with the keys of :class:`rollstream.weights.WeightStore`:
``v{V}:files`` (msgpack :class:`FileManifest`: every file's size and XXH3-128 digest, every
tensor's dtype, shape and file), ``latest``, ``versions`` and the announcement channel. A
version's files are written first, its manifest next, ``latest`` last: a version a reader can
find is complete. A reader verifies every file's digest before it builds a tensor; a missing or
corrupted file raises :class:`WeightStoreError` and nothing is loaded.

Publishing streams: tensors arrive one at a time (a learner gathering a sharded model), are
packed into the current file, and a file is written and let go once it is full, so the
publisher holds at most one file's tensors. Versions older than ``keep_versions`` lose their
Redis keys after the grace period and their files one publish later.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Annotated, Any

import msgspec
import torch
import xxhash
from msgspec import Meta

from rollstream.errors import WeightStoreError, converted
from rollstream.schemas import WeightsPublished
from rollstream.weights import DTYPE_NAMES, DTYPES, WeightStore

log = logging.getLogger(__name__)
INDEX = "model.safetensors.index.json"
READ_BLOCK = 16 << 20


class FileEntry(msgspec.Struct, frozen=True, kw_only=True):
    name: str  # relative to the version's directory
    nbytes: Annotated[int, Meta(ge=0)]
    digest: str  # hex XXH3-128 of the file


class FileTensor(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    dtype: str
    shape: list[Annotated[int, Meta(ge=0)]]
    file: str


class FileManifest(msgspec.Struct, frozen=True, kw_only=True):
    version: int
    step: int
    url: str  # the version's directory
    dtype: str
    total_bytes: int
    files: list[FileEntry]
    tensors: list[FileTensor]
    created_at: float
    digest_algorithm: str = "xxh3_128"


_codec = (msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder(FileManifest))


def filesystem(url: str) -> tuple[Any, str]:
    """(fsspec filesystem, path) of a URL; a plain path is the local filesystem."""
    import fsspec

    fs, path = fsspec.core.url_to_fs(url)
    return fs, path.rstrip("/")


def is_local(fs: Any) -> bool:
    protocols = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
    return "file" in protocols or "local" in protocols


def file_digest(fs: Any, path: str) -> tuple[int, str]:
    """(size, XXH3-128) of a file, read in blocks."""
    hasher, size = xxhash.xxh3_128(), 0
    with fs.open(path, "rb") as fh:
        while block := fh.read(READ_BLOCK):
            hasher.update(block)
            size += len(block)
    return size, hasher.hexdigest()


class VersionFiles(Mapping[str, torch.Tensor]):
    """A fetched, verified version: its tensors, read from its files when asked (one file held
    at a time). ``local_dir``: the version's directory when it is on this machine's filesystem
    (an SGLang server on the same host or volume loads it from there, as it is)."""

    def __init__(self, fs: Any, manifest: FileManifest) -> None:
        self.fs, self.manifest = fs, manifest
        self._where = {t.name: t.file for t in manifest.tensors}
        self._cached: tuple[str, dict[str, torch.Tensor]] | None = None
        self.local_dir = manifest.url if is_local(fs) else None

    @property
    def version(self) -> int:
        return self.manifest.version

    def __getitem__(self, name: str) -> torch.Tensor:
        file = self._where[name]
        if self._cached is None or self._cached[0] != file:
            from safetensors.torch import load

            with converted(f"reading {file} of weights version {self.version}", into=WeightStoreError):
                self._cached = (file, load(self.fs.cat_file(f"{self.manifest.url}/{file}")))
        return self._cached[1][name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)

    def download_to(self, directory: str) -> str:
        """Copy the version's files into a local ``directory`` (for a server that cannot read the URL)."""
        import os

        os.makedirs(directory, exist_ok=True)
        for entry in self.manifest.files:
            self.fs.get_file(f"{self.manifest.url}/{entry.name}", os.path.join(directory, entry.name))
        return directory


class DirectoryWriter:
    """Writes tensors that arrive one at a time as a safetensors directory: ``model.safetensors``,
    or ``model-00001.safetensors``, ... of at most ``file_bytes`` each and the index that maps
    every tensor to its file. Holds at most one file's tensors."""

    def __init__(self, fs: Any, where: str, file_bytes: int) -> None:
        self.fs, self.where, self.file_bytes = fs, where, file_bytes
        self.fs.makedirs(where, exist_ok=True)
        self.entries: list[FileEntry] = []
        self.placed: list[FileTensor] = []
        self._shard: dict[str, torch.Tensor] = {}
        self._held = 0

    def add(self, name: str, tensor: torch.Tensor) -> None:
        if tensor.dtype not in DTYPE_NAMES:
            raise WeightStoreError(f"tensor {name!r} has unsupported dtype {tensor.dtype}")
        nbytes = tensor.numel() * tensor.element_size()
        if self._shard and self._held + nbytes > self.file_bytes:
            self._flush(len(self.entries) + 1)
        self._shard[name] = tensor.detach().to("cpu").contiguous()
        self._held += nbytes

    def close(self, files: Mapping[str, bytes]) -> list[FileEntry]:
        """Write what is left and ``files`` (config.json, ...); returns every file written."""
        single = not self.entries
        if self._shard or single:
            self._flush(0 if single else len(self.entries) + 1)
        extra = dict(files)
        if not single:
            extra[INDEX] = json.dumps({"metadata": {"total_size": sum(e.nbytes for e in self.entries)},
                                       "weight_map": {t.name: t.file for t in self.placed}}, indent=1).encode()
        for name, data in extra.items():
            self.fs.pipe_file(f"{self.where}/{name}", data)
            self.entries.append(FileEntry(name=name, nbytes=len(data), digest=xxhash.xxh3_128_hexdigest(data)))
        return self.entries

    def _flush(self, index: int) -> None:
        from safetensors.torch import save

        name = "model.safetensors" if index == 0 else f"model-{index:05d}.safetensors"
        data = save(self._shard, metadata={"format": "pt"})
        self.fs.pipe_file(f"{self.where}/{name}", data)
        self.entries.append(FileEntry(name=name, nbytes=len(data), digest=xxhash.xxh3_128_hexdigest(data)))
        self.placed += [FileTensor(name=n, dtype=DTYPE_NAMES[t.dtype], shape=list(t.shape), file=name)
                        for n, t in self._shard.items()]
        self._shard, self._held = {}, 0


class FileWeightStore(WeightStore):
    """:class:`WeightStore` with the tensors in files under ``url`` (see the module docstring)."""

    def __init__(self, client: Any, url: str, *, key_prefix: str, file_bytes: int = 512 << 20,
                 keep_versions: int = 2, expire_grace_s: float = 30.0) -> None:
        super().__init__(client, key_prefix=key_prefix, keep_versions=keep_versions, expire_grace_s=expire_grace_s)
        self.url = url.rstrip("/")
        self.fs, self.root = filesystem(url)
        self.file_bytes = file_bytes

    def _manifest_key(self, version: int) -> str:
        return f"{self.prefix}v{version}:files"

    def version_url(self, version: int) -> str:
        return f"{self.root}/v{version:08d}"

    async def publish_stream(self, version: int, tensors: AsyncIterator[tuple[str, torch.Tensor]], *, step: int,
                             files: Mapping[str, bytes] | None = None) -> WeightsPublished:
        where = self.version_url(version)
        with converted(f"publishing weights version {version} to {self.url}", into=WeightStoreError):
            await asyncio.to_thread(self._clear, where)
            writer = DirectoryWriter(self.fs, where, self.file_bytes)
            async for name, tensor in tensors:
                await asyncio.to_thread(writer.add, name, tensor)
            entries = await asyncio.to_thread(writer.close, files or {})
            dtypes = {t.dtype for t in writer.placed}
            manifest = FileManifest(
                version=version, step=step, url=where, dtype=dtypes.pop() if len(dtypes) == 1 else "mixed",
                total_bytes=sum(e.nbytes for e in entries), files=entries, tensors=writer.placed,
                created_at=time.time())
            return await self._commit(version, step, _codec[0].encode(manifest), manifest.total_bytes,
                                      manifest.dtype)

    def _clear(self, where: str) -> None:
        """A directory left by a publish that died before its manifest (it is no version yet)."""
        if self.fs.exists(where):
            self.fs.rm(where, recursive=True)
        self.fs.makedirs(where, exist_ok=True)

    async def _expire_old(self, newest: int) -> None:
        await super()._expire_old(newest)
        # Files one publish later than the keys: a reader that found a manifest before it expired
        # finishes reading (the Redis store's grace, in files).
        cut = newest - self.keep_versions - 1
        await asyncio.to_thread(self._remove_before, cut, await self.pinned())

    def _remove_before(self, cut: int, pinned: set[int] = frozenset()) -> None:
        try:
            listed = self.fs.ls(self.root, detail=False)
        except FileNotFoundError:
            return
        for path in listed:
            name = path.rstrip("/").rsplit("/", 1)[-1]
            if name.startswith("v") and name[1:].isdigit() and int(name[1:]) <= cut and int(name[1:]) not in pinned:
                self.fs.rm(path, recursive=True)

    def _data_keys(self, version: int, manifest: bytes) -> list[str]:
        return []  # no chunk keys: the files go by _remove_before

    async def manifest(self, version: int) -> FileManifest:  # type: ignore[override]
        raw = await self.client.get(self._manifest_key(version))
        if raw is None:
            raise WeightStoreError(f"weights version {version} has no manifest (never published, or expired)")
        try:
            return _codec[1].decode(raw)
        except msgspec.DecodeError as exc:
            raise WeightStoreError(f"weights version {version}: unreadable file manifest ({exc})") from exc

    async def fetch(self, version: int | None = None) -> tuple[int, VersionFiles]:  # type: ignore[override]
        """The version's files, every one verified (size and digest) before anything is read from them."""
        with converted(lambda: f"fetching weights version {version} from {self.url}", into=WeightStoreError):
            if version is None:
                version = await self.latest_version()
                if version is None:
                    raise WeightStoreError("no weights have been published yet")
            manifest = await self.manifest(version)
            for entry in manifest.files:
                path = f"{manifest.url}/{entry.name}"
                try:
                    size, digest = await asyncio.to_thread(file_digest, self.fs, path)
                except FileNotFoundError:
                    raise WeightStoreError(f"weights version {version}: {entry.name} is missing") from None
                if size != entry.nbytes or digest != entry.digest:
                    raise WeightStoreError(f"weights version {version}: {entry.name} is corrupted (size {size}, "
                                           f"expected {entry.nbytes}; digest mismatch: {digest != entry.digest})")
            for tensor in manifest.tensors:
                if tensor.dtype not in DTYPES:
                    raise WeightStoreError(f"weights version {version}: tensor {tensor.name!r} has dtype {tensor.dtype}")
        return version, VersionFiles(self.fs, manifest)


def open_weight_store(client: Any, *, key_prefix: str, settings: Any) -> WeightStore:
    """The store ``weights.store`` names (``settings``: the [weights] section)."""
    if settings.store == "redis":
        return WeightStore(client, key_prefix=key_prefix, chunk_bytes=settings.chunk_bytes,
                           keep_versions=settings.keep_versions)
    return FileWeightStore(client, settings.store, key_prefix=key_prefix, file_bytes=settings.file_shard_bytes,
                           keep_versions=settings.keep_versions)
