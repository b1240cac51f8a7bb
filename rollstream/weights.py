"""Versioned weight store in Redis: how new policy weights reach the generators.

Layout under ``{key_prefix}weights:``::

    v{V}:chunk:{i}   bounded byte chunks of all tensors laid end to end
    v{V}:manifest    msgpack Manifest: names, dtypes, shapes, byte offsets, chunk checksums
    latest           the newest complete version (moved only after its manifest exists)
    versions         sorted set of published versions (score = version)
    channel: {key_prefix}weights:published   carries V after ``latest`` moved

A reader takes ``latest`` (or the version a ``WeightsPublished`` names), reads the manifest,
then every chunk, and verifies every checksum before it builds a single tensor: a missing
or corrupted chunk raises :class:`WeightStoreError` and nothing is loaded. Only the last
``keep_versions`` versions are kept; older ones are deleted after ``expire_grace_s`` (so a
reader in the middle of a fetch can finish).

Chunking and assembly are pure functions (:func:`pack`, :func:`unpack`).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import AsyncIterator, Mapping
from typing import Annotated

import msgspec
import redis.asyncio as aioredis
import torch
from msgspec import Meta
from redis.exceptions import RedisError

from rollstream.errors import WeightStoreError
from schemas import WeightsPublished

log = logging.getLogger(__name__)

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "int64": torch.int64,
    "int32": torch.int32,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
ALIGN = 16  # bytes; tensors start at multiples of this in the packed stream


class TensorEntry(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    dtype: str
    shape: list[Annotated[int, Meta(ge=0)]]
    offset: Annotated[int, Meta(ge=0)]  # byte offset in the concatenation of all chunks
    nbytes: Annotated[int, Meta(ge=0)]


class ChunkEntry(msgspec.Struct, frozen=True, kw_only=True):
    nbytes: Annotated[int, Meta(ge=0)]
    sha256: str


class Manifest(msgspec.Struct, frozen=True, kw_only=True):
    version: int
    step: int
    dtype: str  # the broadcast dtype ("mixed" when tensors differ)
    total_bytes: int
    tensors: list[TensorEntry]
    chunks: list[ChunkEntry]
    created_at: float


_manifest_codec = (msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder(Manifest))


def pack(state_dict: Mapping[str, torch.Tensor], chunk_bytes: int) -> tuple[list[TensorEntry], list[memoryview]]:
    """Lay all tensors end to end (each aligned) in one buffer and cut it into chunks of at most ``chunk_bytes``.

    One copy of the weights is made; the chunks are views into it.
    """
    entries: list[TensorEntry] = []
    offset = 0
    for name, tensor in state_dict.items():
        if tensor.dtype not in DTYPE_NAMES:
            raise WeightStoreError(f"tensor {name!r} has unsupported dtype {tensor.dtype}")
        offset += -offset % ALIGN  # keep every tensor aligned so the reader can view it in place
        nbytes = tensor.numel() * tensor.element_size()
        entries.append(TensorEntry(name=name, dtype=DTYPE_NAMES[tensor.dtype], shape=list(tensor.shape),
                                   offset=offset, nbytes=nbytes))
        offset += nbytes
    flat = torch.zeros(offset, dtype=torch.uint8)  # [total_bytes]
    for entry, tensor in zip(entries, state_dict.values()):
        if entry.nbytes:
            source = tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
            flat[entry.offset : entry.offset + entry.nbytes].copy_(source)
    view = memoryview(flat.numpy()).cast("B")
    chunks = [view[start : start + chunk_bytes] for start in range(0, offset, chunk_bytes)]
    return entries, chunks


def unpack(manifest: Manifest, buffer: bytearray) -> dict[str, torch.Tensor]:
    """Tensors of ``manifest`` as views into ``buffer`` (the verified concatenation of all chunks)."""
    if len(buffer) != manifest.total_bytes:
        raise WeightStoreError(f"version {manifest.version}: got {len(buffer)} bytes, manifest says {manifest.total_bytes}")
    flat = torch.frombuffer(buffer, dtype=torch.uint8) if buffer else torch.empty(0, dtype=torch.uint8)
    out: dict[str, torch.Tensor] = {}
    for entry in manifest.tensors:
        dtype = DTYPES[entry.dtype]
        raw = flat[entry.offset : entry.offset + entry.nbytes]
        out[entry.name] = raw.view(dtype).reshape(entry.shape)
    return out


def checksum(data: bytes | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


class WeightStore:
    """Publish and fetch versioned state dicts through Redis."""

    def __init__(
        self,
        client: aioredis.Redis,
        *,
        key_prefix: str,
        chunk_bytes: int = 8 << 20,
        keep_versions: int = 2,
        expire_grace_s: float = 30.0,
        pipeline_bytes: int = 64 << 20,
    ) -> None:
        self.client = client
        self.prefix = f"{key_prefix}weights:"
        self.chunk_bytes = chunk_bytes
        self.keep_versions = keep_versions
        self.expire_grace_s = expire_grace_s
        self.pipeline_bytes = pipeline_bytes  # bounds the memory one Redis round trip holds

    @property
    def channel(self) -> str:
        return f"{self.prefix}published"

    def _chunk_key(self, version: int, index: int) -> str:
        return f"{self.prefix}v{version}:chunk:{index}"

    def _manifest_key(self, version: int) -> str:
        return f"{self.prefix}v{version}:manifest"

    async def publish(self, version: int, state_dict: Mapping[str, torch.Tensor], *, step: int) -> WeightsPublished:
        """Write ``state_dict`` as ``version``, move ``latest``, announce it, expire old versions."""
        entries, chunks = await asyncio.to_thread(pack, state_dict, self.chunk_bytes)
        # hashlib releases the GIL: checksums are computed while the chunks are being sent.
        hashing = asyncio.ensure_future(asyncio.to_thread(lambda: [checksum(c) for c in chunks]))
        try:
            for batch in self._batches(range(len(chunks)), [c.nbytes for c in chunks]):
                async with self.client.pipeline(transaction=False) as pipe:
                    for i in batch:
                        pipe.set(self._chunk_key(version, i), chunks[i])
                    await pipe.execute()
            digests = await hashing
            dtypes = {e.dtype for e in entries}
            manifest = Manifest(
                version=version, step=step, dtype=dtypes.pop() if len(dtypes) == 1 else "mixed",
                total_bytes=sum(c.nbytes for c in chunks), tensors=entries,
                chunks=[ChunkEntry(nbytes=c.nbytes, sha256=d) for c, d in zip(chunks, digests)],
                created_at=time.time(),
            )
            manifest_bytes = _manifest_codec[0].encode(manifest)
            async with self.client.pipeline(transaction=True) as pipe:
                pipe.set(self._manifest_key(version), manifest_bytes)
                pipe.zadd(f"{self.prefix}versions", {str(version): version})
                pipe.set(f"{self.prefix}latest", version)
                await pipe.execute()
            await self.client.publish(self.channel, str(version))
            await self._expire_old(version)
        except RedisError as exc:
            hashing.cancel()
            raise WeightStoreError(f"publishing weights version {version} failed: {exc}") from exc
        return WeightsPublished(
            version=version, step=step, manifest_key=self._manifest_key(version),
            checksum=checksum(manifest_bytes), num_bytes=manifest.total_bytes, dtype=manifest.dtype,
            published_at=time.time(),
        )

    def _batches(self, indices: range, sizes: list[int]) -> list[list[int]]:
        batches: list[list[int]] = [[]]
        held = 0
        for i in indices:
            if batches[-1] and held + sizes[i] > self.pipeline_bytes:
                batches.append([])
                held = 0
            batches[-1].append(i)
            held += sizes[i]
        return [b for b in batches if b]

    async def _expire_old(self, newest: int) -> None:
        versions = [int(v) for v in await self.client.zrange(f"{self.prefix}versions", 0, -1)]
        doomed = [v for v in versions if v <= newest - self.keep_versions]
        if not doomed:
            return
        async with self.client.pipeline(transaction=False) as pipe:
            for v in doomed:
                keys = [self._manifest_key(v)]
                raw = await self.client.get(self._manifest_key(v))
                if raw is not None:
                    keys += [self._chunk_key(v, i) for i in range(len(_manifest_codec[1].decode(raw).chunks))]
                for key in keys:
                    if self.expire_grace_s > 0:
                        pipe.expire(key, max(1, int(self.expire_grace_s)))
                    else:
                        pipe.delete(key)
                pipe.zrem(f"{self.prefix}versions", str(v))
            await pipe.execute()

    async def latest_version(self) -> int | None:
        try:
            value = await self.client.get(f"{self.prefix}latest")
        except RedisError as exc:
            raise WeightStoreError(f"reading the latest weights version failed: {exc}") from exc
        return int(value) if value is not None else None

    async def manifest(self, version: int) -> Manifest:
        raw = await self.client.get(self._manifest_key(version))
        if raw is None:
            raise WeightStoreError(f"weights version {version} has no manifest (never published, or expired)")
        return _manifest_codec[1].decode(raw)

    async def fetch(self, version: int | None = None) -> tuple[int, dict[str, torch.Tensor]]:
        """Read and verify a whole version (default: latest). Raises WeightStoreError, loads nothing, on any fault."""
        try:
            if version is None:
                version = await self.latest_version()
                if version is None:
                    raise WeightStoreError("no weights have been published yet")
            manifest = await self.manifest(version)
            buffer = bytearray(manifest.total_bytes)
            sizes = [c.nbytes for c in manifest.chunks]
            offset = 0
            hashing: list[asyncio.Future[None]] = []
            for batch in self._batches(range(len(sizes)), sizes):
                async with self.client.pipeline(transaction=False) as pipe:
                    for i in batch:
                        pipe.get(self._chunk_key(version, i))
                    values = await pipe.execute()
                for i, value in zip(batch, values):
                    entry = manifest.chunks[i]
                    if value is None:
                        raise WeightStoreError(f"weights version {version}: chunk {i} is missing (expired or never written)")
                    if len(value) != entry.nbytes:
                        raise WeightStoreError(f"weights version {version}: chunk {i} has {len(value)} bytes, expected {entry.nbytes}")
                    buffer[offset : offset + entry.nbytes] = value
                    hashing.append(asyncio.ensure_future(asyncio.to_thread(_verify, version, i, value, entry.sha256)))
                    offset += entry.nbytes
            await asyncio.gather(*hashing)
        except RedisError as exc:
            raise WeightStoreError(f"fetching weights version {version} failed: {exc}") from exc
        return version, unpack(manifest, buffer)

    async def updates(self, poll_s: float = 5.0) -> AsyncIterator[int]:
        """Yield each new version number once, newest first seen: pub/sub, with polling as fallback."""
        last = -1
        pubsub = self.client.pubsub()
        try:
            await pubsub.subscribe(self.channel)
            while True:
                try:
                    await pubsub.get_message(ignore_subscribe_messages=True, timeout=poll_s)
                    latest = await self.latest_version()  # also catches announcements missed while away
                except RedisError as exc:
                    log.warning("weight updates: Redis error %s; retrying in %.0fs", exc, poll_s)
                    await asyncio.sleep(poll_s)
                    continue
                if latest is not None and latest > last:
                    last = latest
                    yield latest
        finally:
            await pubsub.aclose()


def _verify(version: int, index: int, value: bytes, expected: str) -> None:
    if checksum(value) != expected:
        raise WeightStoreError(f"weights version {version}: chunk {index} is corrupted (checksum mismatch)")
