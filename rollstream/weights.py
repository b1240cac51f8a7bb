"""Versioned weight store in Redis: how new policy weights reach the generators.

Layout under ``{key_prefix}weights:``::

    v{V}:chunk:{i}   each tensor's bytes, cut into pieces of at most ``chunk_bytes``
                     (tensors in state-dict order, a tensor's pieces consecutive)
    v{V}:manifest    msgpack Manifest: names, dtypes, shapes, each tensor's chunks, digests
    latest           the newest complete version (moved only after its manifest exists)
    versions         sorted set of published versions (score = version)
    channel: {key_prefix}weights:published   carries V after ``latest`` moved

A reader takes ``latest`` (or the version a ``WeightsPublished`` names), reads the manifest,
then every chunk, and verifies every chunk's digest before it builds a single tensor: a
missing or corrupted chunk raises :class:`WeightStoreError` and nothing is loaded. Chunk
digests are XXH3-128 (about 20 GB/s here, so verification costs ~1 % of a transfer; it
guards against corruption and truncation, not against an attacker who can write to Redis,
who could rewrite the manifest as well); the announcement's manifest checksum is sha256.
Only the last ``keep_versions`` versions are kept; older ones are deleted after
``expire_grace_s`` (so a reader in the middle of a fetch can finish).

No copy of the weights is made on either side beyond the socket: chunks are sent straight
from each tensor's memory, and a fetched tensor that fits in one chunk is a view of the
bytes Redis returned (a larger one is joined once). Fetched tensors are therefore
read-only by contract: load them into a model (``load_state_dict`` copies) or clone them
before writing in place.

Chunking and assembly are pure functions (:func:`pack`, :func:`unpack`).

**Version facts.** Two numbers say where the policy is, each with one key and one reader here:

* the learner's version, :func:`learner_version` (``{key_prefix}policy:version``): optimizer steps
  of the surviving lineage, set by the learner with each broadcast (:func:`set_learner_version`);
  the sampler stamps prompts with it, generators and executors measure staleness against it;
* the newest published weights, :func:`published_version` (``{key_prefix}weights:latest``, moved
  by :class:`WeightStore` once a version is complete, announced on ``weights:published``): what a
  generator can load. The two differ while a version is being written.

**Staleness**, one rule for every stage (:func:`versions_past`): a rollout's lag is the learner's
version less the oldest policy version that generated any of its tokens; the learner trains it only
while the lag is at most ``rl.max_staleness``. The learner drops what is past it, the executor ends
an episode that is already past it (its next turns could never be trained), and a generator that
refuses stale weights holds while a rollout it would start now is past it after one more learner
step (``ahead=1``: the learner is always working on its next step).

The ``policy`` topic carries each ``WeightsPublished`` as the record of what was published (the
evaluator follows it). This module imports torch only when tensors are packed or built, so a
stage without a model (the sampler, the executor) reads the version facts without it.
"""

from __future__ import annotations

import functools
import hashlib
import time
import warnings
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING, Annotated, Any, Literal

import msgspec
import xxhash
from msgspec import Meta

from rollstream.errors import WeightStoreError, converted
from rollstream.schemas import WeightsPublished

if TYPE_CHECKING:
    import redis.asyncio as aioredis
    import torch

LEARNER_VERSION = "policy:version"  # under infra.key_prefix
PUBLISHED_VERSION = "weights:latest"


async def learner_version(client: aioredis.Redis, key_prefix: str) -> int:
    """The learner's version (0 before its first broadcast)."""
    value = await client.get(f"{key_prefix}{LEARNER_VERSION}")
    return int(value) if value is not None else 0


async def set_learner_version(client: aioredis.Redis, key_prefix: str, version: int) -> None:
    """Written by the learner only, once ``version`` is published (or on resume)."""
    await client.set(f"{key_prefix}{LEARNER_VERSION}", version)


async def published_version(client: aioredis.Redis, key_prefix: str) -> int | None:
    """The newest complete published weights version (None before the first)."""
    with converted("reading the latest weights version", into=WeightStoreError):
        value = await client.get(f"{key_prefix}{PUBLISHED_VERSION}")
    return int(value) if value is not None else None


def versions_past(learner_version: int, oldest_version: int, max_staleness: int, *, ahead: int = 0) -> int:
    """How many versions past ``max_staleness`` a rollout whose oldest weights are ``oldest_version``
    lags behind ``learner_version`` once the learner has taken ``ahead`` more steps; 0 while it may
    still be trained (lag <= max_staleness), so ``versions_past(...) > 0`` is "too stale"."""
    return max(0, learner_version + ahead - oldest_version - max_staleness)


_DTYPE_NAMES = ("float32", "bfloat16", "float16", "int64", "int32", "uint8", "bool")


@functools.cache
def dtype_tables() -> tuple[dict[str, torch.dtype], dict[torch.dtype, str]]:
    """The dtypes a version may hold: name -> dtype and dtype -> name (imports torch)."""
    import torch

    dtypes = {name: getattr(torch, name) for name in _DTYPE_NAMES}
    return dtypes, {v: k for k, v in dtypes.items()}


def __getattr__(name: str) -> Any:  # DTYPES and DTYPE_NAMES, built (and torch imported) on first use
    if name in ("DTYPES", "DTYPE_NAMES"):
        return dtype_tables()[name == "DTYPE_NAMES"]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class TensorEntry(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    dtype: str
    shape: list[Annotated[int, Meta(ge=0)]]
    nbytes: Annotated[int, Meta(ge=0)]
    first_chunk: Annotated[int, Meta(ge=0)]  # its bytes are chunks first_chunk .. first_chunk + num_chunks - 1
    num_chunks: Annotated[int, Meta(ge=0)]  # 0 for an empty tensor


class ChunkEntry(msgspec.Struct, frozen=True, kw_only=True):
    nbytes: Annotated[int, Meta(ge=0)]
    digest: str  # hex XXH3-128 of the chunk's bytes


class Manifest(msgspec.Struct, frozen=True, kw_only=True):
    version: int
    step: int
    dtype: str  # the broadcast dtype ("mixed" when tensors differ)
    total_bytes: int
    tensors: list[TensorEntry]
    chunks: list[ChunkEntry]
    created_at: float
    # The only algorithm so far; a manifest naming another one fails to decode (a clear error).
    digest_algorithm: Literal["xxh3_128"] = "xxh3_128"


_manifest_codec = (msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder(Manifest))


def pack(state_dict: Mapping[str, torch.Tensor], chunk_bytes: int) -> tuple[list[TensorEntry], list[memoryview]]:
    """Cut each tensor's bytes into chunks of at most ``chunk_bytes``, without copying.

    The chunks are views of the tensors' own memory (a tensor that is not a contiguous CPU
    tensor is first made one); they stay valid while the views are alive.
    """
    import torch

    if chunk_bytes < 1:
        raise WeightStoreError(f"chunk_bytes must be >= 1, got {chunk_bytes}")
    dtype_names = dtype_tables()[1]
    entries: list[TensorEntry] = []
    chunks: list[memoryview] = []
    for name, tensor in state_dict.items():
        if tensor.dtype not in dtype_names:
            raise WeightStoreError(f"tensor {name!r} has unsupported dtype {tensor.dtype}")
        nbytes = tensor.numel() * tensor.element_size()
        first = len(chunks)
        if nbytes:
            data = tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
            view = memoryview(data.numpy())  # the ndarray keeps ``data`` alive
            chunks += [view[start : start + chunk_bytes] for start in range(0, nbytes, chunk_bytes)]
        entries.append(TensorEntry(name=name, dtype=dtype_names[tensor.dtype], shape=list(tensor.shape),
                                   nbytes=nbytes, first_chunk=first, num_chunks=len(chunks) - first))
    return entries, chunks


def unpack(manifest: Manifest, chunks: Sequence[bytes]) -> dict[str, torch.Tensor]:
    """Tensors of ``manifest`` built on ``chunks`` (all of the version's chunks, verified).

    A tensor of one chunk is a view of it; a tensor of several is joined into one buffer.
    """
    import torch

    if len(chunks) != len(manifest.chunks):
        raise WeightStoreError(f"version {manifest.version}: got {len(chunks)} chunks, manifest lists {len(manifest.chunks)}")
    dtypes = dtype_tables()[0]
    out: dict[str, torch.Tensor] = {}
    for entry in manifest.tensors:
        dtype = dtypes[entry.dtype]
        pieces = chunks[entry.first_chunk : entry.first_chunk + entry.num_chunks]
        if len(pieces) != entry.num_chunks or sum(len(p) for p in pieces) != entry.nbytes:
            raise WeightStoreError(f"version {manifest.version}: tensor {entry.name!r} does not match its chunks")
        if not entry.nbytes:
            out[entry.name] = torch.empty(entry.shape, dtype=dtype)
            continue
        buffer = pieces[0] if len(pieces) == 1 else b"".join(pieces)
        with warnings.catch_warnings():  # read-only by contract (module docstring)
            warnings.filterwarnings("ignore", message="The given buffer is not writable")
            out[entry.name] = torch.frombuffer(buffer, dtype=dtype).reshape(entry.shape)
    return out


async def aiter_items(state_dict: Mapping[str, torch.Tensor]) -> AsyncIterator[tuple[str, torch.Tensor]]:
    """A state dict's items as the async stream :meth:`WeightStore.publish_stream` takes."""
    for item in state_dict.items():
        yield item


def pipeline_batches(sizes: Sequence[int], budget: int) -> list[list[int]]:
    """Indices of consecutive chunks grouped so that one Redis pipeline carries at most
    ``budget`` bytes (or one chunk). A few MiB per round trip is fastest here: redis-py and
    asyncio copy a pipeline's whole payload into one buffer, and 64 MiB ones ran 2.5x slower."""
    batches: list[list[int]] = []
    held = 0
    for i, size in enumerate(sizes):
        if not batches or held + size > budget:
            batches.append([])
            held = 0
        batches[-1].append(i)
        held += size
    return batches


def _decode_manifest(version: int, raw: bytes) -> Manifest:
    try:
        return _manifest_codec[1].decode(raw)
    except msgspec.DecodeError as exc:
        raise WeightStoreError(f"weights version {version}: unreadable manifest ({exc}); was it published by "
                               "an incompatible rollstream version? Publish again with this one") from exc


def checksum(data: bytes | memoryview) -> str:
    """sha256 of ``data`` (the manifest checksum carried by ``WeightsPublished``)."""
    return hashlib.sha256(data).hexdigest()


def chunk_digest(data: bytes | memoryview) -> str:
    """The digest of one chunk: XXH3-128, fast enough to run inline on the event loop."""
    return xxhash.xxh3_128_hexdigest(data)


class WeightStore:
    """Publish and fetch versioned state dicts through Redis."""

    def __init__(
        self,
        client: aioredis.Redis,
        *,
        key_prefix: str,
        chunk_bytes: int = 16 << 20,
        keep_versions: int = 2,
        expire_grace_s: float = 30.0,
        pipeline_bytes: int = 16 << 20,  # see pipeline_batches
    ) -> None:
        self.client = client
        self.key_prefix = key_prefix
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
        return await self.publish_stream(version, aiter_items(state_dict), step=step)

    async def publish_stream(self, version: int, tensors: AsyncIterator[tuple[str, torch.Tensor]], *, step: int,
                             files: Mapping[str, bytes] | None = None) -> WeightsPublished:
        """:meth:`publish` from tensors that arrive one at a time (a learner gathering a sharded
        model): each tensor's chunks are written once ``pipeline_bytes`` of them are pending, and
        the tensor is let go, so the publisher never holds the whole state dict. ``files``
        (config.json, for stores of directories) is not kept in Redis."""
        entries: list[TensorEntry] = []
        chunk_entries: list[ChunkEntry] = []
        pending: list[tuple[int, memoryview]] = []
        with converted(f"publishing weights version {version}", into=WeightStoreError):
            async for name, tensor in tensors:
                [entry], chunks = pack({name: tensor}, self.chunk_bytes)
                entries.append(msgspec.structs.replace(entry, first_chunk=len(chunk_entries)))
                for chunk in chunks:
                    pending.append((len(chunk_entries), chunk))
                    chunk_entries.append(ChunkEntry(nbytes=chunk.nbytes, digest=chunk_digest(chunk)))
                if sum(c.nbytes for _, c in pending) >= self.pipeline_bytes:
                    await self._write_chunks(version, pending)
                    pending = []
            await self._write_chunks(version, pending)
            dtypes = {e.dtype for e in entries}
            manifest = Manifest(
                version=version, step=step, dtype=dtypes.pop() if len(dtypes) == 1 else "mixed",
                total_bytes=sum(c.nbytes for c in chunk_entries), tensors=entries, chunks=chunk_entries,
                created_at=time.time(),
            )
            return await self._commit(version, step, _manifest_codec[0].encode(manifest), manifest.total_bytes,
                                      manifest.dtype)

    async def _commit(self, version: int, step: int, manifest: bytes, num_bytes: int, dtype: str) -> WeightsPublished:
        """Make ``version`` exist (its data is written): its manifest, the versions index and
        ``latest`` in one transaction; then announce it and expire old versions."""
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.set(self._manifest_key(version), manifest)
            pipe.zadd(f"{self.prefix}versions", {str(version): version})
            pipe.set(f"{self.key_prefix}{PUBLISHED_VERSION}", version)
            await pipe.execute()
        await self.client.publish(self.channel, str(version))
        await self._expire_old(version)
        return WeightsPublished(version=version, step=step, manifest_key=self._manifest_key(version),
                                checksum=checksum(manifest), num_bytes=num_bytes, dtype=dtype,
                                published_at=time.time())

    async def _write_chunks(self, version: int, chunks: Sequence[tuple[int, memoryview]]) -> None:
        for batch in pipeline_batches([c.nbytes for _, c in chunks], self.pipeline_bytes):
            async with self.client.pipeline(transaction=False) as pipe:
                for i in batch:
                    index, chunk = chunks[i]
                    pipe.set(self._chunk_key(version, index), chunk)
                await pipe.execute()

    async def pin(self, version: int) -> None:
        """Keep ``version`` past ``keep_versions`` until :meth:`unpin` (the evaluator reads it later)."""
        with converted(lambda: f"pinning weights version {version}", into=WeightStoreError):
            await self.client.sadd(f"{self.prefix}pinned", str(version))

    async def unpin(self, version: int) -> None:
        """Let ``version`` expire again (now, if it is past ``keep_versions``)."""
        with converted(lambda: f"unpinning weights version {version}", into=WeightStoreError):
            await self.client.srem(f"{self.prefix}pinned", str(version))
            newest = await self.latest_version()
            if newest is not None:
                await self._expire_old(newest)

    async def pinned(self) -> set[int]:
        return {int(v) for v in await self.client.smembers(f"{self.prefix}pinned")}

    async def _expire_old(self, newest: int) -> None:
        versions = [int(v) for v in await self.client.zrange(f"{self.prefix}versions", 0, -1)]
        pinned = await self.pinned()
        doomed = [v for v in versions if v <= newest - self.keep_versions and v not in pinned]
        if not doomed:
            return
        async with self.client.pipeline(transaction=False) as pipe:
            for v in doomed:
                keys = [self._manifest_key(v)]
                raw = await self.client.get(self._manifest_key(v))
                if raw is not None:
                    keys += self._data_keys(v, raw)
                for key in keys:
                    if self.expire_grace_s > 0:
                        pipe.expire(key, max(1, int(self.expire_grace_s)))
                    else:
                        pipe.unlink(key)  # Redis frees the chunks in the background
                pipe.zrem(f"{self.prefix}versions", str(v))
            await pipe.execute()

    def _data_keys(self, version: int, manifest: bytes) -> list[str]:
        """The keys holding a version's tensors (its chunks), besides its manifest."""
        return [self._chunk_key(version, i) for i in range(len(_decode_manifest(version, manifest).chunks))]

    async def latest_version(self) -> int | None:
        return await published_version(self.client, self.key_prefix)

    async def manifest(self, version: int) -> Manifest:
        raw = await self.client.get(self._manifest_key(version))
        if raw is None:
            raise WeightStoreError(f"weights version {version} has no manifest (never published, or expired)")
        return _decode_manifest(version, raw)

    async def fetch(self, version: int | None = None) -> tuple[int, dict[str, torch.Tensor]]:
        """Read and verify a whole version (default: latest). Raises WeightStoreError, loads nothing, on any fault."""
        with converted(lambda: f"fetching weights version {version}", into=WeightStoreError):
            if version is None:
                version = await self.latest_version()
                if version is None:
                    raise WeightStoreError("no weights have been published yet")
            manifest = await self.manifest(version)
            sizes = [c.nbytes for c in manifest.chunks]
            chunks: list[bytes] = []
            for batch in pipeline_batches(sizes, self.pipeline_bytes):
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
                    if chunk_digest(value) != entry.digest:
                        raise WeightStoreError(f"weights version {version}: chunk {i} is corrupted (digest mismatch)")
                    chunks.append(value)
        return version, unpack(manifest, chunks)

    async def updates(self, poll_s: float = 5.0) -> AsyncIterator[int]:
        """Yield each new version number once, newest first seen: pub/sub, with polling as fallback.

        A Redis fault ends it with WeightStoreError; the caller resubscribes (with backoff)."""
        last = -1
        pubsub = self.client.pubsub()
        try:
            with converted("subscribing to weight announcements", into=WeightStoreError):
                await pubsub.subscribe(self.channel)
            while True:
                with converted("waiting for weight announcements", into=WeightStoreError):
                    await pubsub.get_message(ignore_subscribe_messages=True, timeout=poll_s)
                latest = await self.latest_version()  # also catches announcements missed while away
                if latest is not None and latest > last:
                    last = latest
                    yield latest
        finally:
            with converted("closing the announcement subscription", into=WeightStoreError):
                await pubsub.aclose()

