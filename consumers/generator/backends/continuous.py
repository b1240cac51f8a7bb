"""The driver of a continuous decode loop, shared by the transformers and the simulated backends.

A backend built on :class:`ContinuousBackend` takes requests one by one (``submit``: one future
per request, resolved the moment its row finishes) and runs one loop for all of them: rows join
between two iterations while they fit the loop's bounds, finished rows leave at once. Overlapping
``generate`` calls share the loop. A weight swap holds the same lock as an iteration, so it falls
between two of them: at once, rows in progress continuing under the new weights
(``update = "in_flight"``), or once the loop has drained, admitting nothing meanwhile
(``"between_batches"``). A cancelled future's row leaves at the next iteration; an iteration
that raises fails the futures of every row in the loop with BackendError, and the loop goes on
with the rows still waiting.

What a loop must offer (:class:`Loop`): ``fits(rows)``, ``admit(rows, version)``,
``step(version) -> rows that left``, ``abandon() -> rows``, ``len()``; and its rows a settable
``abandoned`` flag. The backend says how one iteration runs (``iterate``: in a worker thread for
a real model, a sleep for the simulated one), how a row is made and how it becomes a Completion.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Protocol

from rollstream.consumers.generator.backends.base import (
    Completion,
    GenerationBackend,
    GenerationRequest,
    error_completion,
    prompt_too_long,
)
from rollstream.errors import BackendError

UpdateMode = Literal["between_batches", "in_flight"]


class Loop(Protocol):
    """The rows being decoded (decode.DecodeLoop; scripted.SimLoop)."""

    def __len__(self) -> int: ...

    def fits(self, rows: Sequence[Any]) -> bool: ...

    def abandon(self) -> list[Any]: ...


class ContinuousBackend(GenerationBackend):
    """See the module docstring. Subclasses set ``self.loop``, ``self.max_context`` and
    ``self.tokenizer`` and implement ``new_row``, ``completion``, ``iterate`` and ``swap``."""

    continuous = True  # overlapping calls share one decode loop (the stage keeps several in flight)
    loop: Loop
    max_context: int

    def __init__(self, *, policy_version: int = 0, update: UpdateMode = "in_flight") -> None:
        self.update = update
        self._version = policy_version
        self._lock = asyncio.Lock()  # one iteration of the loop, or one weight swap: never both
        self._waiting: deque[tuple[Any, asyncio.Future[Completion]]] = deque()
        self._futures: dict[int, asyncio.Future[Completion]] = {}  # id(row) -> its caller's future
        self._driver: asyncio.Task[None] | None = None
        self._empty = asyncio.Event()  # the loop holds no row (a between-batches swap waits for it)
        self._empty.set()
        self._draining = 0  # swaps waiting for an empty loop: nothing is admitted meanwhile

    # --- what a backend supplies

    def new_row(self, request: GenerationRequest) -> Any:
        raise NotImplementedError

    def completion(self, row: Any) -> Completion:
        raise NotImplementedError

    async def iterate(self, admit: list[Any], version: int) -> list[Any]:
        """Admit ``admit``, run one iteration; the rows that left."""
        raise NotImplementedError

    async def swap(self, version: int, state_dict: Mapping[str, Any]) -> None:
        """Load the weights (the lock is held: no iteration runs meanwhile) and set the version."""
        raise NotImplementedError

    # --- the driver

    @property
    def policy_version(self) -> int:
        return self._version

    async def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        futures = self.submit(requests)
        try:
            return list(await asyncio.gather(*futures))
        finally:
            for future in futures:
                future.cancel()  # after a failure or a cancellation: the other rows leave the loop

    def submit(self, requests: Sequence[GenerationRequest]) -> list[asyncio.Future[Completion]]:
        """One future per request, resolved when its row finishes (a prompt that does not fit the
        context at once, as an error completion); a broken backend fails them with BackendError."""
        running = asyncio.get_running_loop()
        futures = []
        for request in requests:
            future: asyncio.Future[Completion] = running.create_future()
            problem = prompt_too_long(request, self.max_context)
            if problem:
                future.set_result(error_completion(request, problem, self._version))
            else:
                row = self.new_row(request)
                self._waiting.append((row, future))
                self._futures[id(row)] = future
                future.add_done_callback(functools.partial(_abandon_if_cancelled, row))
            futures.append(future)
        self._start()
        return futures

    def _start(self) -> None:
        if self._waiting and not self._draining and (self._driver is None or self._driver.done()):
            self._driver = asyncio.get_running_loop().create_task(self._drive(), name="decode-loop")

    def _admissible(self) -> list[Any]:
        """The waiting rows that join at this iteration (in arrival order, as many as fit)."""
        admit: list[Any] = []
        while self._waiting and not self._draining:
            row, future = self._waiting[0]
            if future.done():  # cancelled before it started
                self._waiting.popleft()
                self._futures.pop(id(row), None)
                continue
            if not self.loop.fits([*admit, row]):
                break
            admit.append(row)
            self._waiting.popleft()
        return admit

    async def _drive(self) -> None:
        """Iterate while the loop has rows or rows can join it."""
        while True:
            async with self._lock:
                admit = self._admissible()
                if not admit and not len(self.loop):
                    self._empty.set()
                    return
                self._empty.clear()
                try:
                    left = await self.iterate(admit, self._version)
                except (RuntimeError, ValueError, IndexError) as exc:
                    self._fail([*admit, *self.loop.abandon()], BackendError(f"generation failed: {exc}"))
                    continue
                if not len(self.loop):
                    self._empty.set()
            for row in left:
                future = self._futures.pop(id(row), None)
                if future is not None and not future.done():
                    future.set_result(self.completion(row))

    def _fail(self, rows: Sequence[Any], error: BaseException) -> None:
        for row in rows:
            future = self._futures.pop(id(row), None)
            if future is not None and not future.done():
                future.set_exception(error)

    async def load_weights(self, version: int, state_dict: Mapping[str, Any]) -> None:
        """Swap between two iterations of the loop: at once (``update = "in_flight"``), or once the
        rows in the loop have finished, admitting none meanwhile (``"between_batches"``)."""
        state_dict = await self.prepare(state_dict)  # checked before anything waits
        if self.update == "in_flight":
            async with self._lock:
                await self.swap(version, state_dict)
            return
        self._draining += 1
        try:
            while True:
                await self._empty.wait()
                async with self._lock:
                    if not len(self.loop):
                        await self.swap(version, state_dict)
                        return
        finally:
            self._draining -= 1
            self._start()

    async def prepare(self, state_dict: Mapping[str, Any]) -> Mapping[str, Any]:
        """Check (and convert) weights before a swap waits for its turn; raises BackendError."""
        return state_dict

    async def aclose(self) -> None:
        """Stop the loop: rows in progress and waiting fail with BackendError."""
        if self._driver is not None and not self._driver.done():
            self._driver.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._driver
        self._fail([*self.loop.abandon(), *(row for row, _ in self._waiting)], BackendError("backend closed"))
        self._waiting.clear()


def _abandon_if_cancelled(row: Any, future: asyncio.Future[Completion]) -> None:
    if future.cancelled():
        row.abandoned = True
