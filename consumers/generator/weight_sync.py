"""Weight sync of a generator: follow the weight store, prefetch, swap between batches.

Consumes: new-version announcements of :class:`rollstream.weights.WeightStore` (``updates()``:
Redis pub/sub with polling of ``latest`` as fallback). Produces: weight swaps of the backend.

Guarantees:

* A version is fetched and verified in full (every chunk checksum) in the background,
  while the current weights keep generating; only a complete, verified state dict is handed
  to the backend, and the backend swaps it between two forwards or between batches (its own
  lock), after checking every name and shape. A forward never sees a half-loaded model. With
  ``swap_when_ready`` (a backend that swaps in flight, ``generator.update = "in_flight"``) the
  swap follows the fetch at once, not the next batch: rows in progress continue under it.
* A failed fetch or a refused load keeps the current weights serving; the fetch is retried
  with bounded exponential backoff for as long as the store announces something newer.
* Before a batch, :meth:`WeightSync.catch_up` loads the version its prompts were issued at (or
  newer), waiting up to ``generator.weight_wait_s`` for it: the learner publishes a version
  before it lets the sampler issue the groups it should be sampled with, so without the wait
  a generator that has not fetched it yet would sample a whole batch with the old weights,
  and the learner would drop them as stale.
* Optionally (``generator.max_staleness_refuse``) :meth:`WeightSync.wait_until_fresh` holds
  generation while the loaded weights are ``rl.max_staleness`` or more versions behind the
  learner (Redis ``policy:version``): a sample generated that far behind is too old once the
  learner takes one more step. Weights of the learner's own version always generate. The
  learner moves that version only when it broadcasts, so a refusal lasts until the broadcast
  version is fetched and loaded.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Protocol

from rollstream.consumers.generator.backends.base import GenerationBackend
from rollstream.errors import BackendError, WeightStoreError
from rollstream.retry import Backoff, retry
from rollstream.weights import versions_past

log = logging.getLogger(__name__)


class WeightSource(Protocol):
    """The part of :class:`rollstream.weights.WeightStore` a generator uses."""

    async def latest_version(self) -> int | None: ...

    async def fetch(self, version: int | None = None) -> tuple[int, dict[str, Any]]: ...

    def updates(self, poll_s: float = 5.0) -> AsyncIterator[int]: ...


class WeightSync:
    """See the module docstring. ``learner_version`` reads the learner's policy version."""

    def __init__(self, store: WeightSource, backend: GenerationBackend, *, poll_s: float = 5.0,
                 max_staleness: int | None = None,
                 learner_version: Callable[[], Awaitable[int]] | None = None,
                 max_backoff_s: float = 60.0,
                 observe: Callable[[str, float], None] | None = None, swap_when_ready: bool = False) -> None:
        self.store = store
        self.swap_when_ready = swap_when_ready  # the backend swaps between two forwards: do not wait for a batch
        self.backend = backend
        self.poll_s = poll_s
        self.max_staleness = max_staleness  # None: never refuse
        self.learner_version = learner_version
        self.max_backoff_s = max_backoff_s
        self.observe = observe  # (phase, seconds): "fetch" (fetch + verify + prepare), "swap"
        self.announced = -1  # newest version the store has told us about
        self.fetch_failures = 0
        self.load_failures = 0
        self.swaps = 0
        self.last_swap: tuple[int, float] | None = None  # (version, time.time() when it was loaded)
        self._ready: tuple[int, Mapping[str, Any]] | None = None
        self._rejected = -1  # newest version the backend refused (bad names/shapes/values)
        self._fetched = asyncio.Event()  # set whenever no fetch is in progress
        self._fetched.set()
        self._wake = asyncio.Event()

    @property
    def ready_version(self) -> int | None:
        return self._ready[0] if self._ready else None

    def _have(self) -> int:
        """Newest version loaded, ready, or found unusable (not fetched again until a newer one)."""
        return max(self.backend.policy_version, self.ready_version if self._ready else -1, self._rejected)

    async def load_initial(self, attempts: int = 3) -> None:
        """Before the first batch: load the store's latest version, if any (keep the base on failure)."""
        try:
            await retry(self._load_latest, what="initial weights fetch", retry_on=(WeightStoreError,),
                        attempts=attempts, first_delay_s=1.0, max_delay_s=self.max_backoff_s)
        except WeightStoreError as exc:
            log.warning("no initial weights after %d attempts (%s); serving v%d", attempts, exc,
                        self.backend.policy_version)

    async def _load_latest(self) -> None:
        latest = await self.store.latest_version()
        if latest is None or latest <= self.backend.policy_version:
            return
        self.announced = max(self.announced, latest)
        await self._fetch()
        await self.apply_pending()

    async def run(self) -> None:
        """Follow announcements and prefetch forever (cancel to stop)."""
        follower = asyncio.create_task(self._follow())
        backoff = Backoff(self.poll_s, self.max_backoff_s)
        try:
            while True:
                if self.announced <= self._have():
                    try:
                        await asyncio.wait_for(self._wake.wait(), timeout=self.poll_s)
                    except TimeoutError:
                        pass
                    self._wake.clear()
                    if follower.done():  # surface a crash of the follower instead of going deaf
                        follower.result()
                    continue
                try:
                    await self._fetch()
                    backoff.reset()
                    if self.swap_when_ready:
                        await self.apply_pending()
                except WeightStoreError as exc:
                    self.fetch_failures += 1
                    delay = backoff.next_delay()
                    log.warning("fetching weights v%d failed (%s); serving v%d, retrying in %.1fs",
                                self.announced, exc, self.backend.policy_version, delay)
                    await asyncio.sleep(delay)
        finally:
            follower.cancel()

    async def _follow(self) -> None:
        backoff = Backoff(self.poll_s, self.max_backoff_s)
        while True:
            try:
                async for version in self.store.updates(poll_s=self.poll_s):
                    backoff.reset()
                    if version > self.announced:
                        self.announced = version
                        self._wake.set()
                problem = "ended"
            except (WeightStoreError, OSError, ConnectionError) as exc:
                problem = f"interrupted ({exc})"
            delay = backoff.next_delay()
            log.warning("weight announcements %s; resubscribing in %.1fs", problem, delay)
            await asyncio.sleep(delay)

    async def _fetch(self) -> None:
        """Fetch and verify the newest version into the ready slot (only the newest is kept)."""
        self._fetched.clear()
        try:
            await self._fetch_and_prepare()
        finally:
            self._fetched.set()

    async def _fetch_and_prepare(self) -> None:
        started = time.perf_counter()
        version, state_dict = await self.store.fetch(None)
        self.announced = version  # what the store really has (an announcement may have been stale)
        if version <= self._have():
            return
        try:  # check + cast now, off the swap's critical path
            state_dict = await self.backend.prepare_weights(state_dict)
        except BackendError as exc:
            self.load_failures += 1
            self._rejected = version
            log.error("weights v%d do not fit the model (%s); still serving v%d", version, exc,
                      self.backend.policy_version)
            return
        self._ready = (version, state_dict)
        if self.observe is not None:
            self.observe("fetch", time.perf_counter() - started)
        log.info("weights v%d fetched and verified; swapping before the next batch", version)

    async def apply_pending(self, wait_s: float = 0.0) -> int | None:
        """Swap to the prefetched version, if newer. Call between batches. Returns the version loaded.

        With ``wait_s`` > 0 and a fetch of a newer version in progress, wait that long for it first
        (a batch on the new weights is worth a short pause more than a whole batch on old ones)."""
        if self._ready is None and wait_s > 0 and not self._fetched.is_set():
            try:
                await asyncio.wait_for(self._fetched.wait(), timeout=wait_s)
            except TimeoutError:
                pass
        if self._ready is None:
            return None
        version, state_dict = self._ready
        self._ready = None
        if version <= self.backend.policy_version:
            return None
        started = time.time()
        try:
            await self.backend.load_weights(version, state_dict)
        except BackendError as exc:
            self.load_failures += 1
            self._rejected = max(self._rejected, version)
            log.error("loading weights v%d failed (%s); still serving v%d", version, exc, self.backend.policy_version)
            return None
        self.swaps += 1
        self.last_swap = (version, time.time())
        if self.observe is not None:
            self.observe("swap", time.time() - started)
        log.info("swapped to weights v%d in %.3fs", version, time.time() - started)
        return version

    async def catch_up(self, version: int, wait_s: float, check_s: float = 0.02) -> int:
        """Load ``version`` (the learner's when the batch's prompts were issued) or newer, if the
        store has it, waiting up to ``wait_s``; returns the version that will generate."""
        if self.backend.policy_version >= version:
            return self.backend.policy_version
        deadline = time.monotonic() + wait_s
        latest = await self.store.latest_version()  # the prompt's claim is not trusted: the store decides
        if latest is not None and latest > self.announced:
            self.announced = latest
            self._wake.set()
        while self.backend.policy_version < min(version, self.announced):
            await self.apply_pending()
            if self.backend.policy_version >= min(version, self.announced) or time.monotonic() >= deadline:
                break
            await asyncio.sleep(check_s)
        if self.backend.policy_version < version:
            log.warning("generating with weights v%d for prompts issued at learner version %d (not loaded "
                        "within %.1fs)", self.backend.policy_version, version, wait_s)
        return self.backend.policy_version

    async def wait_until_fresh(self, stop: asyncio.Event | None = None, check_s: float = 0.2) -> float:
        """Hold while ``max_staleness`` or more versions behind the learner (and behind at all);
        returns seconds held."""
        if self.max_staleness is None or self.learner_version is None:
            return 0.0
        started = time.monotonic()
        warned = False
        while True:
            learner = await self.learner_version()
            lag = learner - self.backend.policy_version
            # what it would start now is trained at the learner's next step at the earliest
            fresh = not versions_past(learner, self.backend.policy_version, self.max_staleness, ahead=1)
            if lag <= 0 or fresh or (stop is not None and stop.is_set()):
                return time.monotonic() - started
            if not warned:
                log.warning("refusing to generate: weights v%d are %d versions behind the learner (max %d)",
                            self.backend.policy_version, lag, self.max_staleness)
                warned = True
            self._wake.set()  # look at the store now rather than at the next poll
            await self.apply_pending()
            await asyncio.sleep(check_s)
