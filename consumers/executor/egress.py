"""Network for the tasks that ask for it (``RewardSpec.network``): an egress proxy per pool, host side.

A sandbox whose task lists hosts still runs with network ``none`` (no interface but loopback, no
resolver, no route: no raw socket, DNS query, gateway service or other sandbox can be reached).
Its only way out is the Unix socket of an egress proxy container (consumers/executor/runtime/egress.py)
started for the pool keyed by that allowlist, on ``executor.egress_network`` (its route out and its
resolver): the sockets' directory is a volume of the pool's own, mounted read-only at ``/egress``
in the pool's sandboxes, where the runner relays ``127.0.0.1:3128`` (``HTTP(S)_PROXY``) to it with
the current job's token (consumers/executor/runtime/relay.py). Each sandbox has a socket of its own
there, under a random name only its PID 1 is given (the directory cannot be listed): what reaches
the proxy through it is that sandbox's, under limits of its own, and what the proxy refuses of it
is recorded as that sandbox's current job's. The proxy lets through exactly the
task's entries, HTTP and HTTPS ``CONNECT``, and records every connection, allowed or not, for
the job whose token opened it: they reach that execution's ``SandboxAudit.connections``.

The operator caps what tasks may ask for (``executor.egress_allowed``): a task asking beyond it
raises :class:`EgressError` (a ``ValueError``: the executor dead-letters the action with the reason).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import logging
import tarfile
from collections.abc import Sequence
from typing import Any

from rollstream.consumers.executor.runtime.egress import MAX_RECORDS, covers, parse_entry

log = logging.getLogger(__name__)

SOCKET = "/egress/sock/proxy.sock"  # its directory: the proxy's (rw, 0300) and the sandboxes' (read-only)
PROXY_UID = 65534
READY_TIMEOUT_S = 30.0
END_TIMEOUT_S = 15.0


class EgressError(ValueError):
    """A task's network allowlist that this executor does not grant (the reason says why)."""


def check_allowed(network: Sequence[str], allowed: Sequence[str]) -> None:
    """Every entry of the task's ``network`` within one of the operator's ``allowed`` entries."""
    try:
        operator = [parse_entry(entry) for entry in allowed]
    except ValueError as exc:
        raise EgressError(f"executor.egress_allowed: {exc}") from exc
    for entry in network:
        try:
            wanted = parse_entry(entry)
        except ValueError as exc:
            raise EgressError(str(exc)) from exc
        if not any(covers(outer, wanted) for outer in operator):
            raise EgressError(
                f"the task asks to reach {entry!r}, beyond executor.egress_allowed "
                f"({', '.join(allowed) or 'none: no task may reach a network'}); the operator lists the hosts "
                "tasks may reach (docs/executor.md, \"Network\")")


def network_key(network: Sequence[str]) -> str:
    return hashlib.sha256("\n".join(sorted(network)).encode()).hexdigest()[:24] if network else ""


def socket_dir_archive() -> bytes:
    """The volume's one directory, the proxy's to write its socket in."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo("sock")
        info.type, info.mode, info.uid, info.gid = tarfile.DIRTYPE, 0o300, PROXY_UID, PROXY_UID  # no listing
        tar.addfile(info)
    return buffer.getvalue()




def proxy_config(image: str, labels: dict[str, str], volume: str, network: str, cmd: list[str]) -> dict[str, Any]:
    """The proxy's container: on the egress network, otherwise as bare as a sandbox."""
    return {
        "Image": image,
        "Cmd": cmd,
        "User": f"{PROXY_UID}:{PROXY_UID}",
        "WorkingDir": "/",
        "Env": ["PATH=/usr/bin:/bin", "LANG=C.UTF-8"],
        "Hostname": "egress",
        "Labels": labels,
        "AttachStdin": True,
        "AttachStdout": True,
        "AttachStderr": True,
        "OpenStdin": True,
        "StdinOnce": True,  # the proxy exits when its executor goes away
        "Tty": False,
        "HostConfig": {
            "NetworkMode": network,
            "ReadonlyRootfs": True,
            "CapDrop": ["ALL"],
            "SecurityOpt": ["no-new-privileges"],
            "Privileged": False,
            "PidsLimit": 64,
            "Memory": 256 << 20,
            "MemorySwap": 256 << 20,
            "Mounts": [{"Type": "volume", "Source": volume, "Target": "/egress"}],
            "Ulimits": [{"Name": "nofile", "Soft": 4096, "Hard": 4096}],
            "LogConfig": {"Type": "none", "Config": {}},
            "AutoRemove": True,
        },
    }


class EgressProxy:
    """One proxy container and its control channel (an attach stream, as with the runner)."""

    def __init__(self, warm: Any) -> None:
        self.warm = warm  # runner.Warm: the container, its stream, the reader of its lines
        self.lock = asyncio.Lock()  # one control exchange at a time
        self.pending: dict[str, asyncio.Future[list[dict[str, Any]]]] = {}
        self.listening: dict[str, asyncio.Future[str]] = {}  # source -> its socket's path, once made
        self.begun: dict[str, asyncio.Future[str]] = {}  # token -> done once the proxy knows the job
        self.reader = asyncio.create_task(self._route(), name=f"egress-{warm.sandbox_id}")

    async def _route(self) -> None:
        while (message := await self.warm.replies.get()) is not None:
            if message.get("op") == "ended":
                if message.get("unrecorded"):
                    log.warning("egress proxy %s: a job made %s connections more than the %d its audit record holds",
                                self.warm.sandbox_id, message["unrecorded"], MAX_RECORDS)
                future = self.pending.pop(str(message.get("token")), None)
                if future is not None and not future.done():
                    future.set_result([c for c in message.get("connections", []) if isinstance(c, dict)])
            elif message.get("op") == "begun":
                begun = self.begun.pop(str(message.get("token")), None)
                if begun is not None and not begun.done():
                    begun.set_result("")
            elif message.get("op") == "listening":
                made = self.listening.pop(str(message.get("source")), None)
                if made is not None and not made.done():
                    made.set_result(str(message.get("path", "")))
            elif message.get("op") == "error":
                log.warning("egress proxy %s: %s", self.warm.sandbox_id, message.get("error"))
                made = self.listening.pop(str(message.get("source")), None)
                if made is not None and not made.done():
                    made.set_exception(ConnectionError(f"egress proxy: {message.get('error')}"))
        for future in [*self.pending.values(), *self.listening.values(), *self.begun.values()]:  # gone
            if not future.done():
                future.set_exception(ConnectionError(f"egress proxy {self.warm.sandbox_id} is gone"))

    @property
    def alive(self) -> bool:
        return not self.reader.done()

    async def listen(self, source: str) -> str:
        """A socket of its own for one sandbox (``source``, a random name the host gives that
        sandbox's PID 1 alone): the path the sandbox connects to. Whatever reaches the proxy through
        it is that sandbox's, and its limits are its own (runtime/egress.py)."""
        made = self.listening[source] = asyncio.get_running_loop().create_future()
        await self.warm.send({"op": "listen", "source": source})
        async with asyncio.timeout(END_TIMEOUT_S):
            return await made

    async def unlisten(self, source: str) -> None:
        with contextlib.suppress(Exception):
            await self.warm.send({"op": "unlisten", "source": source})

    async def begin(self, token: str, job_id: str, allow: Sequence[str], private: bool = False,
                    source: str = "") -> None:
        """The job is known to the proxy when this returns: its first connection may come at once."""
        self.pending[token] = asyncio.get_running_loop().create_future()
        begun = self.begun[token] = asyncio.get_running_loop().create_future()
        await self.warm.send({"op": "job", "token": token, "job": job_id, "allow": list(allow), "private": private,
                              "source": source})
        try:
            async with asyncio.timeout(END_TIMEOUT_S):
                await begun
        finally:
            self.begun.pop(token, None)

    async def end(self, token: str) -> list[dict[str, Any]]:
        """The job's connections, once the proxy has closed them."""
        future = self.pending.get(token)
        if future is None:
            return []
        try:
            await self.warm.send({"op": "end", "token": token})
            async with asyncio.timeout(END_TIMEOUT_S):
                return await future
        except (Exception, TimeoutError) as exc:
            log.warning("egress proxy %s: no record of job token %s: %s", self.warm.sandbox_id, token[:8], exc)
            return []
        finally:
            self.pending.pop(token, None)

    async def aclose(self) -> None:
        self.reader.cancel()
        with contextlib.suppress(BaseException):
            await self.reader
