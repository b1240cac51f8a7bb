"""The pools keyed by a set of assets and a network allowlist, beside the executor's warm pool.

A job with assets (``RewardSpec.assets``, consumers/executor/assets.py) or a network allowlist
(``RewardSpec.network``, consumers/executor/egress.py) runs in a pool of its own key: started when a
task first asks for it, its containers mount the set's volume read-only at ``/assets`` and reach
the network only through the key's egress proxy; the pool is retired with its volumes and its proxy
after ``executor.keyed_pool_idle_s`` idle, or at once when its proxy dies. Jobs with neither never
wait on it: they take the warm pool (consumers/executor/pool.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from typing import TYPE_CHECKING

from rollstream.consumers.executor.assets import AssetCache, archive, set_key
from rollstream.consumers.executor.egress import (
    READY_TIMEOUT_S as PROXY_READY_TIMEOUT_S,
)
from rollstream.consumers.executor.egress import (
    SOCKET,
    EgressProxy,
    check_allowed,
    network_key,
    proxy_config,
    socket_dir_archive,
)
from rollstream.consumers.executor.hardening import runner_command, runner_preamble
from rollstream.consumers.executor.image import PYTHON
from rollstream.consumers.executor.jobs import Job, RunResult
from rollstream.consumers.executor.runner import Warm
from rollstream.consumers.executor.runtime import importer
from rollstream.errors import SandboxError
from rollstream.schemas.events import Asset

if TYPE_CHECKING:
    from rollstream.consumers.executor.pool import DockerSandboxPool

log = logging.getLogger(__name__)


class _Keyed:
    """A pool keyed by a set of assets and a network allowlist, with its volumes and its proxy."""

    def __init__(self, key: str, pool: DockerSandboxPool, volumes: list[str], proxy: EgressProxy | None) -> None:
        self.key, self.pool, self.volumes, self.proxy = key, pool, volumes, proxy
        self.in_flight = 0
        self.last_used = time.monotonic()


class KeyedPools:
    """The keyed pools of one warm pool (``owner``): its engine, its labels, its owner's containers.
    ``len()``: how many are started."""

    def __init__(self, owner: DockerSandboxPool) -> None:
        self.owner = owner
        self.config = owner.config
        self.assets: AssetCache | None = None  # made when a job first has assets
        self._pools: dict[str, _Keyed] = {}  # "<set_key(assets)>/<network_key(network)>" -> its pool
        self._starting: dict[str, asyncio.Lock] = {}
        self._reaper: asyncio.Task[None] | None = None

    def __len__(self) -> int:
        return len(self._pools)

    async def execute(self, job: Job) -> RunResult:
        keyed = await self._pool_for(job.assets, job.network, job.language)
        if keyed.proxy is not None and not keyed.proxy.alive:  # its proxy died: the pool goes, a new one comes
            async with self._starting[keyed.key]:
                if self._pools.get(keyed.key) is keyed and keyed.in_flight == 0:
                    log.warning("the egress proxy of pool %s is gone: retiring the pool", keyed.key)
                    del self._pools[keyed.key]
                    await self._retire(keyed)
            keyed = await self._pool_for(job.assets, job.network, job.language)
        keyed.in_flight += 1
        try:
            return await keyed.pool.execute(job)
        finally:
            keyed.in_flight -= 1
            keyed.last_used = time.monotonic()

    async def aclose(self) -> None:
        keyed, self._pools = list(self._pools.values()), {}
        await asyncio.gather(*(self._retire(k) for k in keyed), return_exceptions=True)
        if self._reaper is not None:
            self._reaper.cancel()
            await asyncio.gather(self._reaper, return_exceptions=True)

    async def _pool_for(self, assets: list[Asset], network: list[str], language: str = PYTHON) -> _Keyed:
        """The pool of this set of assets and network allowlist, started when first asked for: its
        assets fetched, verified and copied into a volume of its own, its egress proxy started.
        AssetError or EgressError (ValueErrors: the action's) when what it asks for cannot be had."""
        check_allowed(network, self.config.egress_allowed)
        assets_key = set_key(assets) if assets else ""
        key = f"{assets_key}/{network_key(network)}" + (f"/{language}" if language != PYTHON else "")
        async with self._starting.setdefault(key, asyncio.Lock()):
            keyed = self._pools.get(key)
            if keyed is not None:
                return keyed
            volumes: list[str] = []
            proxy: EgressProxy | None = None
            try:
                volume = ""
                if assets:
                    if self.assets is None:
                        self.assets = AssetCache.from_config(self.config)
                    resolved = await self.assets.resolve_all(assets)
                    volume = f"rollstream-assets-{assets_key[:16]}-{secrets.token_hex(3)}"
                    volumes.append(volume)
                    await self._fill_volume(volume, archive(resolved))
                egress = None
                if network:
                    proxy, socket_volume = await self._start_proxy(network_key(network), volumes)
                    egress = (proxy, socket_volume)
                pool = self.owner.keyed_pool(volume, egress, language)
                await pool.__aenter__()
            except BaseException:
                if proxy is not None:
                    await self._stop_proxy(proxy)
                for name in volumes:
                    await self._delete_volume(name)
                raise
            keyed = self._pools[key] = _Keyed(key, pool, volumes, proxy)
            log.info("started the pool of %s%s%s", f"asset set {assets_key} ({', '.join(a.path for a in assets)})"
                     if assets else "", f" network {', '.join(network)}" if network else "",
                     f" language {language}" if language != PYTHON else "")
            if self._reaper is None or self._reaper.done():
                self._reaper = asyncio.create_task(self._reap(), name="asset-pools-reaper")
            return keyed

    async def _fill_volume(self, volume: str, tar: bytes) -> None:
        """A volume of its own holding ``tar``: written through the engine's archive API into a
        container that never starts (no bind mount of the executor's files: works from compose)."""
        docker, labels = self.owner.docker, self.owner.labels()
        await docker.volumes.create({"Name": volume, "Labels": labels})
        try:
            helper = await docker.containers.create(
                {"Image": self.config.image, "Cmd": ["true"], "NetworkDisabled": True, "Labels": labels,
                 "HostConfig": {"NetworkMode": "none", "Mounts": [{"Type": "volume", "Source": volume,
                                                                    "Target": "/fill"}]}},
                name=f"{volume}-fill")
            try:
                await helper.put_archive("/fill", tar)
            finally:
                await self.owner.delete(helper)
        except BaseException:
            await self._delete_volume(volume)
            raise

    async def _start_proxy(self, key: str, volumes: list[str]) -> tuple[EgressProxy, str]:
        """An egress proxy container (runtime/egress.py) and the volume its socket lives in."""
        volume = f"rollstream-egress-{key[:16]}-{secrets.token_hex(3)}"
        volumes.append(volume)
        await self._fill_volume(volume, socket_dir_archive())
        name = f"{volume}-proxy"
        container = await self.owner.docker.containers.create(
            proxy_config(self.config.image, self.owner.labels(), volume, self.config.egress_network,
                         runner_command(SOCKET)), name=name)
        stream = container.attach(stdin=True, stdout=True, stderr=True)
        try:
            await stream.__aenter__()
            await container.start()
        except BaseException:
            await stream.close()
            await self.owner.delete(container)
            raise
        warm = Warm(container, stream, name)
        try:
            await stream.write_in(runner_preamble(importer.EGRESS_ENTRY))
            ready = await warm.receive(PROXY_READY_TIMEOUT_S)
        except TimeoutError:
            ready = None
        proxy = EgressProxy(warm)
        if not ready or ready.get("op") != "ready":
            await self._stop_proxy(proxy)
            raise SandboxError(f"egress proxy {name} did not start on network {self.config.egress_network!r}: "
                               f"{ready!r} {bytes(warm.runner_stderr).decode(errors='replace')}")
        return proxy, volume

    async def _stop_proxy(self, proxy: EgressProxy) -> None:
        await proxy.aclose()
        warm = proxy.warm
        warm.reader.cancel()
        with contextlib.suppress(Exception):
            await warm.stream.close()
        await self.owner.delete(warm.container)

    async def _delete_volume(self, volume: str) -> None:
        import aiodocker

        try:
            await aiodocker.volumes.DockerVolume(self.owner.docker, volume).delete()
        except Exception as exc:  # in use by a container still being removed, or the engine gone
            log.warning("could not delete asset volume %s: %s (the next start removes it)", volume, exc)

    async def _retire(self, keyed: _Keyed) -> None:
        await keyed.pool.aclose()
        if keyed.proxy is not None:
            await self._stop_proxy(keyed.proxy)
        for volume in keyed.volumes:
            await self._delete_volume(volume)

    async def _reap(self) -> None:
        """Retire the keyed pools idle for ``keyed_pool_idle_s``."""
        idle_s = self.config.keyed_pool_idle_s
        while self._pools:
            await asyncio.sleep(min(10.0, idle_s / 4))
            now = time.monotonic()
            for key, keyed in list(self._pools.items()):
                if keyed.in_flight == 0 and now - keyed.last_used >= idle_s:
                    async with self._starting.setdefault(key, asyncio.Lock()):
                        if keyed.in_flight == 0 and self._pools.get(key) is keyed:
                            log.info("retiring the idle pool of asset set %s", key)
                            await self._retire(keyed)
                            del self._pools[key]
