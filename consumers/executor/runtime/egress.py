"""The egress proxy: the only way out of a sandbox whose task lists ``RewardSpec.network``.

Standard library only: it runs in a container of its own (from the sandbox image, on a network
with a route out), started by the executor (consumers/executor/keyed.py), which drives it over
the container's stdin and reads its records from stdout, one JSON object a line:

* in: ``{"op": "listen", "source": S}`` for each sandbox (answered ``{"op": "listening", "source": S,
  "path": P}``: the sandbox's own socket, see :class:`Proxy`), ``{"op": "unlisten", "source": S}``
  when it goes; ``{"op": "job", "token": T, "job": J, "source": S, "allow": ["host:port",
  ".domain:port", ...]}`` before a job may connect (answered ``{"op": "begun", "token": T}``), ``{"op": "end", "token": T}`` after it; the proxy then closes the job's
  connections and answers ``{"op": "ended", "token": T, "connections": [...]}``: one record per
  connection the job made (``host``, ``port``, ``method``, ``verdict`` allowed / denied / failed,
  ``reason``, ``sent`` and ``received`` bytes, ``duration_s``).
* Clients (the relay in each sandbox, consumers/executor/runtime/relay.py) connect to their
  sandbox's Unix socket and first send ``ROLLSTREAM-TOKEN <T>\\r\\n``; then one HTTP request:
  ``CONNECT host:port`` (HTTPS: the tunnel's contents are never inspected) or a request in
  absolute form (``GET http://host:port/path``: plain HTTP, forwarded with ``Connection: close``).
  A connection whose token is not the current job's of the sandbox whose socket it came through,
  whose host and port are not in the job's allowlist, or that is not one of these requests is
  refused (403 / 400) and recorded as that sandbox's current job's. Names are resolved here, never in the sandbox.

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
DEFAULT_SOCKET = "/egress/sock/proxy.sock"
# Per sandbox (per source socket): what one container's code may hold of the proxy. The relay opens
# at most 32 of a job's connections at once (runtime/relay.py RELAY_MAX_CONNECTIONS) and sends its
# token at once; past these the proxy stops accepting from that sandbox until it is back under them.
SOURCE_MAX_CONNECTIONS = 40
SOURCE_MAX_PENDING = 8  # accepted, token not yet read
SOURCE_RATE_PER_S = 50  # new connections a second, sustained ...
SOURCE_BURST = 100  # ... after a burst of this many
SOURCE_BACKLOG = 16
AUTH_TIMEOUT_S = 2.0  # the relay sends the token as it connects: a silent connection is dropped soon
REFUSALS_RECORDED = 16  # a job's refusals listed one by one; past it, counted per reason


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
    """The proxy's state: the sandboxes' sockets (one per container: its *source*), the current
    job of each, and each job's records.

    One container's code cannot take what another container's job needs (issue 52): every limit
    below is per source, and a source over one of them is simply not accepted from (its own
    socket's backlog fills, nobody else's) until it is back under it. Each refusal is recorded as
    a denied connection of the job that was current on that source when it came."""

    def __init__(self, out=None, directory=None):
        self.jobs = {}  # token -> {"job", "allow", "records", "refused", "writers", "tasks", "private", "source"}
        self.sources = {}  # source -> {"sock", "path", "job", "open", "pending", "allowance", "at", "paused"}
        self.out = out or sys.stdout
        self.directory = directory or os.path.dirname(DEFAULT_SOCKET)
        self.unattributed = []

    def emit(self, message):
        self.out.write(json.dumps(message, separators=(",", ":")) + "\n")
        self.out.flush()

    async def control(self, message):
        op, token = message.get("op"), str(message.get("token", ""))
        if op == "listen":
            self.emit({"op": "listening", "source": str(message.get("source", "")),
                       "path": self.listen(str(message.get("source", "")))})
        elif op == "unlisten":
            self.unlisten(str(message.get("source", "")))
        elif op == "job" and token:
            allow = [parse_entry(entry) for entry in message.get("allow", [])]
            source = str(message.get("source", ""))
            self.jobs[token] = {"job": str(message.get("job", "")), "allow": allow, "records": [], "refused": {},
                                "writers": set(), "tasks": set(), "private": bool(message.get("private", False)),
                                "source": source}
            if source in self.sources:
                self.sources[source]["job"] = token
            self.emit({"op": "begun", "token": token})  # the host sends the job only after this
        elif op == "end":
            job = self.jobs.pop(token, None)
            if job is not None:
                for writer in list(job["writers"]):
                    writer.close()
                if job["tasks"]:  # their records are written as they finish
                    await asyncio.wait(list(job["tasks"]), timeout=CONNECT_TIMEOUT_S)
                source = self.sources.get(job["source"])
                if source is not None and source["job"] == token:
                    self._drain(job["source"], source, job)  # what its code left queued was its own
                    source["job"] = None
            records = _with_refusals(job) if job is not None else []
            self.emit({"op": "ended", "token": token, "connections": records[:MAX_RECORDS],
                       "unrecorded": max(0, len(records) - MAX_RECORDS) + (job or {}).get("unrecorded", 0)})
        elif op == "unattributed":
            records, self.unattributed = self.unattributed, []
            self.emit({"op": "unattributed", "connections": records})

    def listen(self, source):
        """A socket for one sandbox (``source``: a name only the host and that sandbox's PID 1 know;
        the directory is not listable), with its own backlog and limits. Returns its path."""
        if not source or not all(c.isalnum() for c in source) or len(source) > 64:
            raise ValueError(f"bad source name {source[:80]!r}")
        self.unlisten(source)
        path = os.path.join(self.directory, source + ".sock")
        if os.path.exists(path):
            os.unlink(path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(path)
        os.chmod(path, 0o666)  # the sandboxes' uid connects (it cannot list the directory: 0300)
        sock.listen(SOURCE_BACKLOG)
        sock.setblocking(False)
        self.sources[source] = {"sock": sock, "path": path, "job": None, "open": 0, "pending": 0,
                                "allowance": float(SOURCE_BURST), "at": time.monotonic(), "paused": None}
        self._resume(source)
        return path

    def unlisten(self, source):
        entry = self.sources.pop(source, None)
        if entry is None:
            return
        loop = asyncio.get_running_loop()
        loop.remove_reader(entry["sock"].fileno())
        entry["sock"].close()
        try:
            os.unlink(entry["path"])
        except OSError:
            pass

    def _over(self, entry):
        """Why ``entry`` may not be accepted from now (None: it may), refilling its allowance."""
        now = time.monotonic()
        entry["allowance"] = min(float(SOURCE_BURST), entry["allowance"] + (now - entry["at"]) * SOURCE_RATE_PER_S)
        entry["at"] = now
        if entry["open"] >= SOURCE_MAX_CONNECTIONS:
            return f"over the sandbox's {SOURCE_MAX_CONNECTIONS} connections at once"
        if entry["pending"] >= SOURCE_MAX_PENDING:
            return f"over the sandbox's {SOURCE_MAX_PENDING} connections waiting for their token"
        if entry["allowance"] < 1.0:
            return f"over the sandbox's {SOURCE_RATE_PER_S} new connections a second"
        return None

    def _accept(self, source):
        entry = self.sources.get(source)
        while entry is not None:
            reason = self._over(entry)
            if reason is not None:  # not accepted from until it is back under the limit
                self._pause(source, entry, reason)
                return
            try:
                conn, _ = entry["sock"].accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # out of descriptors: this source waits, the others go on
                self._pause(source, entry, "the proxy is out of descriptors")
                return
            entry["allowance"] -= 1.0
            entry["open"] += 1
            entry["pending"] += 1
            conn.setblocking(False)
            asyncio.get_running_loop().create_task(self._serve(source, entry, conn))

    def _pause(self, source, entry, reason):
        loop = asyncio.get_running_loop()
        if entry["paused"] is None:
            loop.remove_reader(entry["sock"].fileno())
            if "waiting for their token" not in reason:  # that one passes in a moment: the relay sends it first
                self._refuse_record(self.jobs.get(entry["job"] or ""), f"accepting paused: {reason}")
        entry["paused"] = reason
        if entry["allowance"] < 1.0:  # nothing else wakes it: the allowance refills with time
            loop.call_later((1.0 - entry["allowance"]) / SOURCE_RATE_PER_S + 0.001, self._resume, source)

    def _resume(self, source):
        entry = self.sources.get(source)
        if entry is None:
            return
        if entry["paused"] is not None and self._over(entry) is None:
            entry["paused"] = None
        if entry["paused"] is None:
            loop = asyncio.get_running_loop()
            loop.remove_reader(entry["sock"].fileno())
            loop.add_reader(entry["sock"].fileno(), self._accept, source)

    def _drain(self, source, entry, job):
        """Accept and close what waits in ``source``'s backlog: connections the ended job's code
        made (every process of it is gone), refused as its own, never the next job's."""
        while True:
            try:
                conn, _ = entry["sock"].accept()
            except OSError:
                break
            conn.close()
            self._refuse_record(job, "never accepted: the sandbox was over its limits until its job ended")
        self._resume(source)

    def _refuse_record(self, job, reason):
        """One refused connection: the first REFUSALS_RECORDED of a job each a record, then a count."""
        if job is None:
            self.unattributed.append({"host": "", "port": 0, "method": "", "verdict": "denied", "reason": reason,
                                      "sent": 0, "received": 0, "duration_s": 0.0})
            del self.unattributed[:-1000]
            return
        listed = sum(1 for r in job["records"] if r.get("refusal"))
        if listed < REFUSALS_RECORDED:
            job["records"].append({"host": "", "port": 0, "method": "", "verdict": "denied", "reason": reason,
                                   "sent": 0, "received": 0, "duration_s": 0.0, "refusal": True})
        else:
            job["refused"][reason] = job["refused"].get(reason, 0) + 1

    async def _serve(self, source, entry, conn):
        try:
            reader, writer = await asyncio.open_unix_connection(sock=conn, limit=HEADER_LIMIT)
        except OSError:
            conn.close()
            entry["open"] -= 1
            entry["pending"] -= 1
            self._resume(source)
            return
        await self.handle(reader, writer, source, entry)

    async def handle(self, reader, writer, source="", entry=None):
        started = time.monotonic()
        record = {"host": "", "port": 0, "method": "", "verdict": "denied", "reason": "", "sent": 0, "received": 0}
        job = None
        current = self.jobs.get(entry["job"] or "") if entry is not None else None  # the source's job now
        pending = entry is not None
        try:
            try:
                line = await asyncio.wait_for(reader.readline(), AUTH_TIMEOUT_S)
            except TimeoutError:
                record["reason"] = f"no token within {AUTH_TIMEOUT_S} s"
                raise
            if pending:
                pending = False
                entry["pending"] -= 1
                self._resume(source)
            token = line[len(TOKEN_PREFIX):].strip().decode(errors="replace") if line.startswith(TOKEN_PREFIX) else ""
            job = self.jobs.get(token)
            if job is not None and entry is not None and job["source"] != source:
                job = None  # another sandbox's token: never valid here
            if job is not None:
                job["writers"].add(writer)
                job["tasks"].add(asyncio.current_task())
            else:
                record["reason"] = "no current job of this sandbox holds this connection's token"
                await _refuse(writer, 403, record["reason"])
                return
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
            if entry is not None:
                entry["open"] -= 1
                if pending:
                    entry["pending"] -= 1
                self._resume(source)
            owner = job if job is not None else current  # a refused one: the job then current on its sandbox
            if job is not None:
                job["writers"].discard(writer)
                job["tasks"].discard(asyncio.current_task())
            if job is None:  # refused before it named a job: counted past the first few
                self._refuse_record(current, record["reason"])
            elif len(owner["records"]) < MAX_RECORDS:
                owner["records"].append(record)
            else:
                owner["unrecorded"] = owner.get("unrecorded", 0) + 1


def _with_refusals(job):
    """A job's records, refusals past the first REFUSALS_RECORDED counted in one record per reason."""
    records = [{k: v for k, v in r.items() if k != "refusal"} for r in job["records"]]
    for reason, count in sorted(job["refused"].items()):
        records.append({"host": "", "port": 0, "method": "", "verdict": "denied", "sent": 0, "received": 0,
                        "duration_s": 0.0, "reason": f"{count} more connections refused: {reason}"[:300]})
    return records


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
    """Serve the sandboxes' sockets in ``path``'s directory (one per sandbox, made on the host's
    ``listen``: the directory is 0300, so none can list another's name) and follow ``control`` lines
    (stdin by default) until it closes."""
    directory = os.path.dirname(path)
    os.chmod(directory, 0o300)  # the proxy's uid is the sandboxes' (65534): no read bit, no listing
    proxy = Proxy(directory=directory)
    proxy.emit({"op": "ready", "path": directory})
    loop = asyncio.get_running_loop()
    stream = control or sys.stdin.buffer
    while line := await loop.run_in_executor(None, stream.readline):
        message = {}
        try:
            message = json.loads(line)
            await proxy.control(message)
        except (ValueError, TypeError, AttributeError, OSError) as exc:
            source = message.get("source", "") if isinstance(message, dict) else ""
            proxy.emit({"op": "error", "error": str(exc)[:300], "source": str(source)})
    for source in list(proxy.sources):
        proxy.unlisten(source)


def main():
    """The proxy container's entry point (runtime/importer.py ``EGRESS_ENTRY``): the socket's path
    is the command line's first argument."""
    asyncio.run(serve(sys.argv[1] if len(sys.argv) > 1 else DEFAULT_SOCKET))
