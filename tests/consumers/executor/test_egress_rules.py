"""The egress allowlist's rules and the proxy's protocol, on loopback sockets (no Docker, no outside
address): what an entry allows, what the operator's cap covers, what the proxy lets through and
records for which job. The sandbox side: test_egress.py."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import tempfile

import msgspec
import pytest

from rollstream.consumers.executor.egress import EgressError, check_allowed, network_key
from rollstream.consumers.executor.runtime.egress import Proxy, allows, covers, parse_entry
from rollstream.schemas.events import RewardSpec

pytestmark = pytest.mark.unit


def test_an_entry_is_a_host_or_a_domain_suffix_with_one_port() -> None:
    assert parse_entry("api.example.com:443") == ("api.example.com", 443, False)
    assert parse_entry(".Example.COM.:80") == ("example.com", 80, True)
    for bad in ("example.com", "*.example.com:443", "example.com:0", "example.com:70000", "exa_mple.com:80",
                ".com:443", "a..b:80", "-a.com:80", "example.com:80-90", ":80", "[::1]:80"):
        with pytest.raises(ValueError):
            parse_entry(bad)


def test_what_an_allowlist_lets_through() -> None:
    entries = [parse_entry("api.example.com:443"), parse_entry(".files.example.org:80")]
    assert allows(entries, "api.example.com", 443) and allows(entries, "API.example.com.", 443)
    assert not allows(entries, "api.example.com", 80)  # another port
    assert not allows(entries, "evil.api.example.com", 443)  # an exact host has no subdomains
    assert not allows(entries, "api.example.com.evil.net", 443)
    assert allows(entries, "a.files.example.org", 80) and allows(entries, "b.a.files.example.org", 80)
    assert not allows(entries, "files.example.org", 80)  # the suffix, not the domain itself
    assert not allows(entries, "evilfiles.example.org", 80)


def test_the_operators_cap_covers_the_tasks_entries() -> None:
    check_allowed([], [])
    check_allowed(["api.example.com:443", "x.files.example.org:80"], ["api.example.com:443", ".example.org:80"])
    check_allowed([".files.example.org:80"], [".example.org:80"])
    for wanted, cap in ((["api.example.com:443"], []), (["api.example.com:80"], ["api.example.com:443"]),
                        ([".example.com:443"], ["api.example.com:443"]), ([".example.org:80"], [".files.example.org:80"]),
                        (["example.org:80"], [".example.org:80"])):
        with pytest.raises(EgressError, match="beyond executor.egress_allowed"):
            check_allowed(wanted, cap)
    with pytest.raises(EgressError, match="executor.egress_allowed"):
        check_allowed(["a.com:80"], ["*:80"])
    assert covers(parse_entry(".example.org:80"), parse_entry(".a.example.org:80"))
    assert network_key(["b:1", "a:2"]) == network_key(["a:2", "b:1"]) != network_key(["a:2"])


def test_a_reward_spec_lists_plain_entries_only() -> None:
    assert RewardSpec(network=["api.example.com:443"]).network == ["api.example.com:443"]
    for bad in ("*.example.com:443", "http://example.com", "example.com", "a b:80"):
        with pytest.raises(msgspec.ValidationError):
            msgspec.json.decode(msgspec.json.encode({"network": [bad]}), type=RewardSpec)


async def _server(body: bytes) -> tuple[asyncio.AbstractServer, int]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


SOURCE = "box"


@contextlib.asynccontextmanager
async def listening(proxy: Proxy, *sources: str):
    """The proxy's sockets for ``sources`` (one sandbox each; ``box`` by default) in a temporary
    directory: their paths (one path for one source)."""
    proxy.directory = tempfile.mkdtemp()
    paths = [proxy.listen(source) for source in sources or (SOURCE,)]
    try:
        yield paths[0] if len(paths) == 1 else paths
    finally:
        for source in sources or (SOURCE,):
            proxy.unlisten(source)


async def _ask(path: str, token: str, request: bytes) -> bytes:
    reader, writer = await asyncio.open_unix_connection(path)
    writer.write(b"ROLLSTREAM-TOKEN " + token.encode() + b"\r\n" + request)
    await writer.drain()
    data = await reader.read()
    writer.close()
    return data


async def test_the_proxy_lets_a_job_through_to_its_entries_and_records_each_connection() -> None:
    server, port = await _server(b"hello")
    out = io.StringIO()
    proxy = Proxy(out)
    async with listening(proxy) as path:
        await proxy.control({"op": "job", "token": "t1", "job": "job-1", "allow": [f"127.0.0.1:{port}"],
                             "private": True, "source": SOURCE})
        ok = await _ask(path, "t1", f"GET http://127.0.0.1:{port}/x HTTP/1.1\r\nHost: a\r\nProxy-Authorization: "
                                    "secret\r\n\r\n".encode())
        assert ok.startswith(b"HTTP/1.1 200") and ok.endswith(b"hello")
        denied = await _ask(path, "t1", f"GET http://127.0.0.1:{port + 1}/ HTTP/1.1\r\n\r\n".encode())
        assert denied.startswith(b"HTTP/1.1 403")
        tunnel = await _ask(path, "t1", f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\nGET / HTTP/1.1\r\n\r\n".encode())
        assert tunnel.startswith(b"HTTP/1.1 200 Connection established") and tunnel.endswith(b"hello")
        forged = await _ask(path, "nope", f"GET http://127.0.0.1:{port}/ HTTP/1.1\r\n\r\n".encode())
        assert forged.startswith(b"HTTP/1.1 403")
        garbage = await _ask(path, "t1", b"HELLO\r\n\r\n")
        assert garbage.startswith(b"HTTP/1.1 400")
        await proxy.control({"op": "end", "token": "t1"})
        ended = json.loads(out.getvalue().splitlines()[-1])
        assert ended["op"] == "ended" and ended["token"] == "t1"
        records = ended["connections"]
        assert [(r["method"], r["verdict"]) for r in records] == [
            ("GET", "allowed"), ("GET", "denied"), ("CONNECT", "allowed"), ("", "denied"), ("", "denied")]
        assert records[0]["received"] > len(b"hello") and "Proxy-Authorization" not in str(records)
        assert "not in the task's network allowlist" in records[1]["reason"]
        # a forged token on this sandbox's socket: refused, and the sandbox's current job's record
        assert records[3]["reason"].startswith("no current job of this sandbox")
        after = await _ask(path, "t1", f"GET http://127.0.0.1:{port}/ HTTP/1.1\r\n\r\n".encode())
        assert after.startswith(b"HTTP/1.1 403")  # the job has ended: its token opens nothing
        assert proxy.unattributed and proxy.unattributed[0]["reason"].startswith("no current job")
    server.close()


async def test_ending_a_job_closes_its_open_tunnels_and_still_records_them() -> None:
    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # never answers: a tunnel left open by the job
        writer.close()

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    out = io.StringIO()
    proxy = Proxy(out)
    async with listening(proxy) as path:
        await proxy.control({"op": "job", "token": "t", "job": "j", "allow": [f"127.0.0.1:{port}"], "private": True,
                             "source": SOURCE})
        reader, writer = await asyncio.open_unix_connection(path)
        writer.write(f"ROLLSTREAM-TOKEN t\r\nCONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\nsome bytes".encode())
        await writer.drain()
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
        await asyncio.wait_for(proxy.control({"op": "end", "token": "t"}), 5)
        records = json.loads(out.getvalue().splitlines()[-1])["connections"]
        assert [(r["verdict"], r["sent"]) for r in records] == [("allowed", len(b"some bytes"))]
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by the proxy
        writer.close()
    server.close()


async def test_without_private_addresses_an_allowed_entry_that_resolves_to_one_is_refused() -> None:
    server, port = await _server(b"host service")
    out = io.StringIO()
    proxy = Proxy(out)
    async with listening(proxy) as path:  # the host's own service, allowed by name and by address: still not a public address
        await proxy.control({"op": "job", "token": "t", "job": "j", "allow": [f"localhost:{port}", f"127.0.0.1:{port}"],
                             "source": SOURCE})
        for host in ("localhost", "127.0.0.1"):
            answer = await _ask(path, "t", f"GET http://{host}:{port}/ HTTP/1.1\r\n\r\n".encode())
            assert answer.startswith(b"HTTP/1.1 403") and b"not a public address" in answer
        await proxy.control({"op": "end", "token": "t"})
        records = json.loads(out.getvalue().splitlines()[-1])["connections"]
        assert [r["verdict"] for r in records] == ["denied", "denied"]
        assert "resolves to 127.0.0.1" in records[0]["reason"]
    server.close()


async def test_a_token_opens_nothing_on_another_sandboxs_socket() -> None:
    server, port = await _server(b"hello")
    out = io.StringIO()
    proxy = Proxy(out)
    async with listening(proxy, "a", "b") as (path_a, path_b):
        await proxy.control({"op": "job", "token": "ta", "job": "ja", "allow": [f"127.0.0.1:{port}"],
                             "private": True, "source": "a"})
        await proxy.control({"op": "job", "token": "tb", "job": "jb", "allow": [f"127.0.0.1:{port}"],
                             "private": True, "source": "b"})
        request = f"GET http://127.0.0.1:{port}/ HTTP/1.1\r\n\r\n".encode()
        assert (await _ask(path_a, "tb", request)).startswith(b"HTTP/1.1 403")
        assert (await _ask(path_a, "ta", request)).endswith(b"hello")
        await proxy.control({"op": "end", "token": "tb"})
        assert json.loads(out.getvalue().splitlines()[-1])["connections"] == []  # b made none
        await proxy.control({"op": "end", "token": "ta"})
        records = json.loads(out.getvalue().splitlines()[-1])["connections"]
        assert [r["verdict"] for r in records] == ["denied", "allowed"]  # the forged one is a's, whose socket it used
    server.close()


async def test_one_sandbox_flooding_its_socket_neither_starves_another_nor_goes_unrecorded() -> None:
    """Silent connections (no token) and a burst of new ones on sandbox a's socket: the proxy stops
    accepting from a (its own backlog fills), drops the silent ones after AUTH_TIMEOUT_S, and keeps
    serving sandbox b at once; a's job's record lists the refusals, counted past the first few."""
    from rollstream.consumers.executor.runtime import egress

    server, port = await _server(b"hello")
    out = io.StringIO()
    proxy = Proxy(out)
    async with listening(proxy, "a", "b") as (path_a, path_b):
        for source in ("a", "b"):
            await proxy.control({"op": "job", "token": f"t{source}", "job": f"j{source}",
                                 "allow": [f"127.0.0.1:{port}"], "private": True, "source": source})
        silent = []
        for _ in range(egress.SOURCE_MAX_PENDING + egress.SOURCE_BACKLOG):  # past a's pending cap and backlog
            with contextlib.suppress(OSError, TimeoutError):
                silent.append(await asyncio.wait_for(asyncio.open_unix_connection(path_a), 0.2))

        async def burst() -> None:
            for _ in range(2 * egress.SOURCE_BURST):
                with contextlib.suppress(OSError, TimeoutError):
                    _, writer = await asyncio.wait_for(asyncio.open_unix_connection(path_a), 0.05)
                    writer.close()

        flooding = asyncio.create_task(burst())
        request = f"GET http://127.0.0.1:{port}/ HTTP/1.1\r\n\r\n".encode()
        served = await asyncio.wait_for(_ask(path_b, "tb", request), 1.0)  # well within a's token timeout
        assert served.startswith(b"HTTP/1.1 200") and served.endswith(b"hello")
        await flooding
        for reader, _ in silent[: egress.SOURCE_MAX_PENDING]:  # the ones accepted are dropped, unanswered
            assert (await asyncio.wait_for(reader.read(), egress.AUTH_TIMEOUT_S + 2)).startswith(b"HTTP/1.1 400")
        await proxy.control({"op": "end", "token": "ta"})
        records = json.loads(out.getvalue().splitlines()[-1])["connections"]
        reasons = [r["reason"] for r in records]
        assert all(r["verdict"] == "denied" for r in records) and len(records) <= egress.REFUSALS_RECORDED + 8
        assert any(reason.startswith("never accepted") or "never accepted" in reason for reason in reasons), reasons
        assert any("no token within" in reason for reason in reasons), reasons
        assert any(reason.split()[1:4] == ["more", "connections", "refused:"] for reason in reasons), reasons
        await proxy.control({"op": "end", "token": "tb"})
        assert [r["verdict"] for r in json.loads(out.getvalue().splitlines()[-1])["connections"]] == ["allowed"]
        for _, writer in silent:
            writer.close()
    server.close()
