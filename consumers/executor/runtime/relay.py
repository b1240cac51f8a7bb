"""The sandbox's way to its egress proxy (a task with ``RewardSpec.network``), inside PID 1.

A sandbox with a network allowlist still runs with network ``none``: no interface but loopback,
no resolver, no route to anything. Its only way out is a Unix socket of the egress proxy's
container (consumers/executor/runtime/egress.py), mounted at ``/egress``. PID 1 runs this relay as
one thread: it listens on ``127.0.0.1:3128`` (``HTTP_PROXY`` and ``HTTPS_PROXY`` of every job
point there) and joins each connection a job makes to a new connection to the proxy, which it
opens with the current job's token (``ROLLSTREAM-TOKEN <token>``): the proxy attributes the
connection to the job and applies its allowlist. The token is PID 1's (from the host's request,
never in a job's memory): code that connects to the proxy's socket itself has none and is
refused. Between jobs there is no token: a connection is closed at once, and every connection
of a job is closed when it ends, once its processes are gone (with what still waits in the
listener's backlog: never opened with the next job's token). The socket is this container's own
(a random name the host gave PID 1 alone, in a directory nobody can list): the proxy counts what
comes through it against this container, under limits of its own (runtime/egress.py).

At most ``RELAY_MAX_CONNECTIONS`` of a job's connections are open at once (PID 1's descriptors
are the container's 256). The thread is a task of the container's pids cgroup: cleanup counts it
(``Host.threads``).
"""

import os
import socket

# selectors and threading are imported by the relay alone (start_relay): in a sandbox without egress
# nothing of them is loaded, so no fork of a job's process runs threading's after-fork hooks.

RELAY_PORT = 3128
RELAY_CHUNK = 65536
RELAY_MAX_CONNECTIONS = 32  # at once, per job: two descriptors each, within the container's 256
RELAY_SEND_TIMEOUT_S = 2.0  # a job that stops reading its replies stalls only its own connections
RELAY_CONNECT_TIMEOUT_S = 1.0  # the proxy stops accepting from a sandbox over its limits: the job's, not the next


class Relay:
    def __init__(self, proxy_path, port=RELAY_PORT):
        import selectors
        import threading

        self._selectors, self._threading = selectors, threading
        self.proxy_path = proxy_path
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", port))
        self.listener.listen(64)
        self.listener.setblocking(False)
        self.wake_r, self.wake_w = socket.socketpair()
        self.wake_r.setblocking(False)
        self.lock = threading.Lock()
        self.token = None
        self.pairs = {}  # socket -> its peer
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.listener, selectors.EVENT_READ, "accept")
        self.selector.register(self.wake_r, selectors.EVENT_READ, "wake")
        self.thread = threading.Thread(target=self._loop, name="egress-relay", daemon=True)

    def start(self):
        self.thread.start()

    def begin(self, token):
        with self.lock:
            self.token = token

    def end(self):
        """No token from now on; every connection of the job that ended is closed."""
        with self.lock:
            self.token = None
        done = self._threading.Event()
        self._ended = done
        self.wake_w.send(b"e")
        done.wait(2.0)

    def _close(self, sock):
        peer = self.pairs.pop(sock, None)
        for s in (sock, peer):
            if s is None:
                continue
            self.pairs.pop(s, None)
            try:
                self.selector.unregister(s)
            except (KeyError, ValueError):
                pass
            s.close()

    def _accept(self):
        try:
            client, _ = self.listener.accept()
        except OSError:
            return
        with self.lock:
            token = self.token
        if token is None or len(self.pairs) >= 2 * RELAY_MAX_CONNECTIONS:
            client.close()  # between jobs, or past the cap: refused (the job sees its connection reset)
            return
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            upstream.settimeout(RELAY_CONNECT_TIMEOUT_S)
            upstream.connect(self.proxy_path)
            upstream.sendall(b"ROLLSTREAM-TOKEN " + token.encode() + b"\r\n")
        except OSError:
            upstream.close()
            client.close()
            return
        for s in (client, upstream):
            s.setblocking(False)
        self.pairs[client], self.pairs[upstream] = upstream, client
        self.selector.register(client, self._selectors.EVENT_READ, "data")
        self.selector.register(upstream, self._selectors.EVENT_READ, "data")

    def _refuse_queued(self):
        """Close what waits in the listener's backlog: connections of the job that ended (every
        process of it is gone by now), never to be opened with the next job's token."""
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            client.close()

    def _move(self, sock):
        peer = self.pairs.get(sock)
        if peer is None:
            return
        try:
            data = sock.recv(RELAY_CHUNK)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            try:
                peer.shutdown(socket.SHUT_WR)  # half-close: the other way may still carry a reply
            except OSError:
                pass
            try:
                self.selector.unregister(sock)
            except (KeyError, ValueError):
                pass
            if peer not in self.selector.get_map():
                self._close(sock)
            return
        try:
            peer.setblocking(True)
            peer.settimeout(RELAY_SEND_TIMEOUT_S)
            peer.sendall(data)
            peer.setblocking(False)
        except OSError:
            self._close(sock)

    def _loop(self):
        while True:
            try:
                self._once()
            except Exception:  # a relay bug must not end the thread: the job's connections fail, no more
                for sock in list(self.pairs):
                    self._close(sock)

    def _once(self):
        if True:
            for key, _ in self.selector.select():
                if key.data == "accept":
                    self._accept()
                elif key.data == "wake":
                    try:
                        self.wake_r.recv(64)
                    except BlockingIOError:
                        pass
                    for sock in list(self.pairs):
                        self._close(sock)
                    self._refuse_queued()
                    ended = getattr(self, "_ended", None)
                    if ended is not None:
                        ended.set()
                else:
                    self._move(key.fileobj)


def start_relay(host, path):
    """The relay of a sandbox with egress (its own socket at the pool's proxy, under ``/egress``), else None."""
    if not path or not os.path.exists(path):
        return None
    relay = Relay(path)
    relay.start()
    host.threads += 1
    return relay
