"""The egress proxy: the only way out of a sandbox whose task lists ``RewardSpec.network``.

Standard library only: it runs in a container of its own (from the sandbox image, on a network
with a route out), started by the executor (consumers/executor/sandbox.py), which drives it over
the container's stdin and reads its records from stdout, one JSON object a line:

* in: ``{"op": "job", "token": T, "job": J, "allow": ["host:port", ".domain:port", ...]}`` before a
  job may connect, ``{"op": "end", "token": T}`` after it; the proxy then closes the job's
  connections and answers ``{"op": "ended", "token": T, "connections": [...]}``: one record per
  connection the job made (``host``, ``port``, ``method``, ``verdict`` allowed / denied / failed,
  ``reason``, ``sent`` and ``received`` bytes, ``duration_s``).
* Clients (the relay in each sandbox, consumers/executor/runtime/supervisor.py) connect to the
  Unix socket it listens on and first send ``ROLLSTREAM-TOKEN <T>\\r\\n``; then one HTTP request:
  ``CONNECT host:port`` (HTTPS: the tunnel's contents are never inspected) or a request in
  absolute form (``GET http://host:port/path``: plain HTTP, forwarded with ``Connection: close``).
  A connection whose token is not a current job's, whose host and port are not in the job's
  allowlist, or that is not one of these requests is refused (403 / 400) and recorded (an unknown
  token as the job ``""``). Names are resolved here, never in the sandbox.

An allowlist entry is ``host:port`` (that host exactly) or ``.domain:port`` (any host under the
domain, not the domain itself); hosts compare case-insensitively without a trailing dot. Nothing
wider exists: no wildcard, no port range.
"""

import asyncio
import ipaddress
import json
import os
import socket
import sys
import time

HEADER_LIMIT = 64 << 10
MAX_RECORDS = 1000  # a job's connections recorded (SandboxAudit.connections' bound); past it, counted
CONNECT_TIMEOUT_S = 10.0
TOKEN_PREFIX = b"ROLLSTREAM-TOKEN "


def parse_entry(entry):
    """``(host, port, suffix)`` of an allowlist entry; ValueError when it is not one."""
    host, sep, port = str(entry).rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{entry!r}: an egress entry is host:port or .domain:port")
    suffix = host.startswith(".")
    name = host[1:] if suffix else host
    name = name.lower().rstrip(".")
    labels = name.split(".")
    if not name or any(not label or len(label) > 63 or not all(c.isalnum() or c == "-" for c in label)
                       or label.startswith("-") or label.endswith("-") for label in labels):
        raise ValueError(f"{entry!r}: {host!r} is not a host name (no wildcards, no ranges)")
    if suffix and len(labels) < 2:
        raise ValueError(f"{entry!r}: a domain suffix names at least two labels (.example.com), nothing wider")
    return name, int(port), suffix


def allows(entries, host, port):
    """Whether ``host:port`` is in the allowlist ``entries`` (parsed with :func:`parse_entry`)."""
    host = str(host).lower().rstrip(".")
    for name, allowed_port, suffix in entries:
        if port == allowed_port and (host.endswith("." + name) if suffix else host == name):
            return True
    return False


def covers(outer, inner):
    """Whether the entry ``inner`` allows nothing the entry ``outer`` does not (both parsed)."""
    name, port, suffix = inner
    outer_name, outer_port, outer_suffix = outer
    if port != outer_port:
        return False
    if not outer_suffix:
        return not suffix and name == outer_name
    return name.endswith("." + outer_name)


class Proxy:
    def __init__(self, out=None):
        self.jobs = {}  # token -> {"job", "allow", "records", "writers"}
        self.out = out or sys.stdout
        self.unattributed = []

    def emit(self, message):
        self.out.write(json.dumps(message, separators=(",", ":")) + "\n")
        self.out.flush()

    async def control(self, message):
        op, token = message.get("op"), str(message.get("token", ""))
        if op == "job" and token:
            allow = [parse_entry(entry) for entry in message.get("allow", [])]
            self.jobs[token] = {"job": str(message.get("job", "")), "allow": allow, "records": [], "writers": set(),
                                "tasks": set(), "private": bool(message.get("private", False))}
        elif op == "end":
            job = self.jobs.pop(token, None)
            if job is not None:
                for writer in list(job["writers"]):
                    writer.close()
                if job["tasks"]:  # their records are written as they finish
                    await asyncio.wait(list(job["tasks"]), timeout=CONNECT_TIMEOUT_S)
            records = job["records"] if job is not None else []
            self.emit({"op": "ended", "token": token, "connections": records[:MAX_RECORDS],
                       "unrecorded": max(0, len(records) - MAX_RECORDS)})
        elif op == "unattributed":
            records, self.unattributed = self.unattributed, []
            self.emit({"op": "unattributed", "connections": records})

    async def handle(self, reader, writer):
        started = time.monotonic()
        record = {"host": "", "port": 0, "method": "", "verdict": "denied", "reason": "", "sent": 0, "received": 0}
        job = None
        try:
            line = await asyncio.wait_for(reader.readline(), CONNECT_TIMEOUT_S)
            token = line[len(TOKEN_PREFIX):].strip().decode(errors="replace") if line.startswith(TOKEN_PREFIX) else ""
            job = self.jobs.get(token)
            if job is not None:
                job["writers"].add(writer)
                job["tasks"].add(asyncio.current_task())
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), CONNECT_TIMEOUT_S)
            if len(head) > HEADER_LIMIT:
                raise ValueError("request head too large")
            method, target, version, headers = _request(head)
            record["method"] = method
            if method == "CONNECT":
                host, port = _host_port(target, None)
            elif target.startswith("http://"):
                rest = target[len("http://"):]
                authority, _, path = rest.partition("/")
                host, port = _host_port(authority, 80)
                target = "/" + path
            else:
                raise ValueError("not a proxy request: CONNECT host:port, or an absolute http:// URL")
            record.update(host=host, port=port)
            if job is None:
                record["reason"] = "no current job holds this connection's token"
                await _refuse(writer, 403, record["reason"])
                return
            if not allows(job["allow"], host, port):
                record["reason"] = f"{host}:{port} is not in the task's network allowlist"
                await _refuse(writer, 403, record["reason"])
                return
            try:
                address = await asyncio.wait_for(_resolve(host, port), CONNECT_TIMEOUT_S)
            except (TimeoutError, OSError) as exc:
                record.update(verdict="failed", reason=f"cannot resolve {host}: {exc}")
                await _refuse(writer, 502, record["reason"])
                return
            if not job["private"] and not _public(address):
                record["reason"] = (f"{host} resolves to {address}, not a public address (the host's, the gateway's "
                                    "or a private network's: executor.egress_private)")
                await _refuse(writer, 403, record["reason"])
                return
            try:  # to the address checked, not the name again (a second answer could differ)
                up_reader, up_writer = await asyncio.wait_for(asyncio.open_connection(address, port), CONNECT_TIMEOUT_S)
            except (TimeoutError, OSError) as exc:
                record.update(verdict="failed", reason=f"cannot reach {host}:{port} ({address}): {exc}")
                await _refuse(writer, 502, record["reason"])
                return
            record["verdict"] = "allowed"
            job["writers"].add(up_writer)
            if method == "CONNECT":
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                await writer.drain()
            else:
                kept = [(k, v) for k, v in headers if not k.lower().startswith("proxy-") and k.lower() != "connection"]
                request = f"{method} {target} {version}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in kept)
                request += "Connection: close\r\n\r\n"
                up_writer.write(request.encode("latin-1"))
                record["sent"] += len(request)
            sent, received = await asyncio.gather(_pump(reader, up_writer), _pump(up_reader, writer))
            record["sent"] += sent
            record["received"] += received
        except (TimeoutError, ValueError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
            record["reason"] = record["reason"] or f"bad request: {exc}"[:300]
            await _refuse(writer, 400, record["reason"])
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            record["duration_s"] = round(time.monotonic() - started, 4)
            writer.close()
            if job is not None:
                job["writers"].discard(writer)
                job["tasks"].discard(asyncio.current_task())
                job["records"].append(record)
            else:
                self.unattributed.append(record)
                del self.unattributed[:-1000]


async def _resolve(host, port):
    """The first IPv4 address of ``host`` (resolved here: the sandbox has no resolver)."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, family=socket.AF_INET, type=socket.SOCK_STREAM)
    if not infos:
        raise OSError(f"no address for {host}")
    return infos[0][4][0]


def _public(address):
    """Whether ``address`` is a public one: not loopback, private, link-local, shared (CGNAT), reserved
    or multicast (where the host's own services, the gateway's and other containers live)."""
    ip = ipaddress.ip_address(address)
    return ip.is_global and not ip.is_multicast


def _request(head):
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise ValueError(f"bad request line {lines[0][:100]!r}")
    headers = []
    for line in lines[1:]:
        if line:
            key, sep, value = line.partition(":")
            if not sep:
                raise ValueError(f"bad header line {line[:100]!r}")
            headers.append((key.strip(), value.strip()))
    return parts[0].upper(), parts[1], parts[2], headers


def _host_port(authority, default):
    if authority.startswith("["):
        raise ValueError("IPv6 literals are not allowed")
    host, sep, port = authority.rpartition(":")
    if not sep:
        host, port = authority, str(default) if default else ""
    if not port.isdigit() or not host or len(host) > 253 or not 0 < int(port) < 65536:
        raise ValueError(f"bad authority {authority[:100]!r}")
    return host.lower().rstrip("."), int(port)


async def _refuse(writer, status, reason):
    text = {400: "Bad Request", 403: "Forbidden", 502: "Bad Gateway"}[status]
    body = (reason + "\n").encode()
    try:
        writer.write(f"HTTP/1.1 {status} {text}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n"
                     f"Content-Type: text/plain\r\n\r\n".encode() + body)
        await writer.drain()
    except OSError:
        pass


async def _pump(reader, writer):
    moved = 0
    try:
        while chunk := await reader.read(65536):
            writer.write(chunk)
            moved += len(chunk)
            await writer.drain()
    except OSError:
        pass
    finally:
        try:
            writer.write_eof()
        except (OSError, RuntimeError):
            pass
    return moved


async def serve(path, control=None):
    """Listen on the Unix socket ``path`` (0666: the sandboxes' uid connects) and follow ``control``
    lines (stdin by default) until it closes."""
    proxy = Proxy()
    if os.path.exists(path):
        os.unlink(path)
    server = await asyncio.start_unix_server(proxy.handle, path=path, limit=HEADER_LIMIT)
    os.chmod(path, 0o666)
    proxy.emit({"op": "ready", "path": path})
    loop = asyncio.get_running_loop()
    stream = control or sys.stdin.buffer
    while line := await loop.run_in_executor(None, stream.readline):
        try:
            await proxy.control(json.loads(line))
        except (ValueError, TypeError) as exc:
            proxy.emit({"op": "error", "error": str(exc)[:300]})
    server.close()


if __name__ == "__main__":
    asyncio.run(serve(sys.argv[1] if len(sys.argv) > 1 else "/egress/proxy.sock"))
