"""gunicorn as a library: TLS settings, worker model and hooks, with the app built in the worker.

A `BaseApplication` rather than a gunicorn config file, because the command line hands over
Python objects (the app builder, the certificate reloader, the metrics directory) directly:
no settings file on disk and no environment variables to pass them through, and `load()` runs
in each worker after the fork, so no thread (a future cluster watch) exists before forking.

Worker model: gunicorn's gthread, with one change (`GuardedThreadWorker`). Stock gthread gives a
connection a thread before its TLS handshake and reads the request there with blocking calls,
so a client that completes a handshake and says nothing, or trickles its headers, holds one of
the few threads for as long as it likes: eight of them stopped every admission. Here the
handshake and the whole request (headers and body, up to the body limit) are received in the
worker's event loop without blocking, with one deadline per request; a thread only ever gets a
request that has fully arrived, and its socket calls are bounded too. Held connections then cost
a file descriptor, not a thread. gevent would give the same, but monkey-patches the `kubernetes`
client's watch threads and is a dependency more; asyncio would mean leaving Flask.
"""
from __future__ import annotations

import errno
import logging
import re
import selectors
import ssl
import time
from collections import deque
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable

from gunicorn import http
from gunicorn import sock as gunicorn_sock
from gunicorn.app.base import BaseApplication
from gunicorn.workers.gthread import TConn, ThreadWorker

from ..credentials.certs import ReloadingContext
from .logs import GunicornLogger
from .metrics import mark_worker_dead

log = logging.getLogger(__name__)

THREADS_PER_WORKER = 8
# The apiserver keeps connections to webhooks open and idles them out after 90 s.
KEEPALIVE_SECONDS = 75
# From accepting a connection (or a kept-alive connection's next byte) to a complete request:
# the apiserver sends a review in one go, well inside its own 10 s default timeout.
REQUEST_SECONDS = 10.0
# Any one blocking socket call of a thread (reading what was already received, writing the answer).
SOCKET_CALL_SECONDS = 5.0
# Headers longer than this are handed to gunicorn unread, which refuses them (its default limits).
MAX_HEADER_BYTES = 64 * 1024
MAX_CONNECTIONS = 2000  # gunicorn's worker_connections: held connections beyond it wait in the backlog
_CONTENT_LENGTH = re.compile(rb"\r\ncontent-length:[ \t]*(\d+)")
_CHUNKED = re.compile(rb"\r\ntransfer-encoding:[^\r]*chunked")


@dataclass(frozen=True)
class ServeOptions:
    bind: str  # HOST:PORT
    cert: str
    key: str
    client_ca: str | None = None  # require client certificates signed by this CA
    threads: int = THREADS_PER_WORKER
    max_body_bytes: int = 3 * 1024 * 1024  # a longer body is handed over at once, for the app's 413
    multiprocess_dir: str | None = None  # shared metrics directory (kept over worker restarts)
    on_reload: Callable[[], None] | None = None  # SIGHUP, in the server process, before new workers start


def request_complete(received: bytes | bytearray, max_body_bytes: int) -> bool:
    """Whether `received` holds a whole HTTP/1.1 request, or enough for gunicorn or the app to
    refuse it (headers over the limit, a body over the limit)."""
    end = received.find(b"\r\n\r\n")
    if end < 0:
        return len(received) > MAX_HEADER_BYTES
    head = received[:end].lower()
    body = len(received) - end - 4
    if _CHUNKED.search(head):
        return received.endswith(b"0\r\n\r\n") or body > max_body_bytes
    length = _CONTENT_LENGTH.search(head)
    wanted = int(length.group(1)) if length else 0
    return wanted > max_body_bytes or body >= wanted


def receive_request(sock: Any, received: bytearray, max_body_bytes: int) -> None:
    """Read what a non-blocking socket has into `received` until a whole request is there (see
    `request_complete`). Raises what the socket raises when more is to come (BlockingIOError,
    ssl.SSLWantReadError), and ConnectionResetError when the client closes first."""
    while not request_complete(received, max_body_bytes):
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionResetError("closed before a whole request arrived")
        received += chunk


class BoundedSSLSocket(ssl.SSLSocket):
    """gthread sets the socket blocking before a thread uses it: here "blocking" has a limit."""

    def setblocking(self, flag: bool) -> None:
        self.settimeout(SOCKET_CALL_SECONDS if flag else 0.0)


class GuardedThreadWorker(ThreadWorker):
    """gthread whose threads only get requests that have fully arrived (see the module docstring)."""

    def init_process(self) -> None:
        self.arriving: deque = deque()  # connections still receiving a request, oldest deadline first
        super().init_process()

    def accept(self, listener: Any) -> None:
        try:
            client, address = listener.accept()
        except OSError as err:
            if err.errno in (errno.EAGAIN, errno.ECONNABORTED, errno.EWOULDBLOCK):
                return
            raise
        self.nr_conns += 1
        conn = TConn(self.cfg, client, address, listener.getsockname())  # non-blocking from here
        conn.tls_pending = self.cfg.is_ssl
        if self.cfg.is_ssl:
            conn.sock = gunicorn_sock.ssl_context(self.cfg).wrap_socket(
                conn.sock, server_side=True, do_handshake_on_connect=False,
                suppress_ragged_eofs=self.cfg.suppress_ragged_eofs)
        conn.parser = http.get_parser(self.cfg, conn.sock, conn.client)
        conn.initialized = True  # gthread's own init would handshake in a thread, blocking
        self._await_request(conn)

    def on_client_socket_readable(self, conn: TConn, client: Any) -> None:
        """A kept-alive connection has a next request coming: receive it here, not in a thread."""
        self.poller.unregister(client)
        self.keepalived_conns.remove(conn)
        self._await_request(conn)
        self._receive(conn)

    def _await_request(self, conn: TConn) -> None:
        conn.received = bytearray()
        conn.timeout = time.monotonic() + REQUEST_SECONDS
        self.arriving.append(conn)
        self.poller.register(conn.sock, selectors.EVENT_READ, partial(self._on_readable, conn))

    def _on_readable(self, conn: TConn, _client: Any) -> None:
        self._receive(conn)

    def _receive(self, conn: TConn) -> None:
        """Take what the connection has sent so far; hand the request to a thread once complete."""
        try:
            if conn.tls_pending:
                conn.sock.do_handshake()
                conn.tls_pending = False
            receive_request(conn.sock, conn.received, self.app.options.max_body_bytes)
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError):
            return  # more to come; the poller calls again (a handshake write fits the socket buffer)
        except OSError:  # ssl.SSLError included: not TLS, a bad certificate, a reset
            self._drop(conn)
            return
        self.poller.unregister(conn.sock)
        self.arriving.remove(conn)
        conn.parser.unreader.unread(bytes(conn.received))
        self.enqueue_req(conn)

    def _drop(self, conn: TConn) -> None:
        self.poller.unregister(conn.sock)
        self.arriving.remove(conn)
        self.nr_conns -= 1
        conn.close()

    def murder_pending(self) -> None:
        """gthread calls this every loop turn: also close connections whose request is overdue."""
        super().murder_pending()
        now = time.monotonic()
        while self.arriving and self.arriving[0].timeout <= now:
            self._drop(self.arriving[0])



class WebhookServer(BaseApplication):
    """Runs `build_app()` in one gunicorn worker, serving it over TLS 1.2+."""

    def __init__(self, build_app: Callable[[], Any], options: ServeOptions) -> None:
        self._build_app = build_app
        self.options = options
        # Loaded now so a bad certificate stops start-up with a clear message; workers inherit it.
        self.tls = ReloadingContext(options.cert, options.key, client_ca=options.client_ca)
        self._started = False
        super().__init__()  # loads the config the first time
        self._started = True

    def _ssl_context(self, _config: Any, _default_factory: Callable[[], ssl.SSLContext]) -> ssl.SSLContext:
        # gunicorn asks for a context on every new connection: hand out the current one.
        context = self.tls.current()
        context.sslsocket_class = BoundedSSLSocket
        return context

    def _child_exit(self, _server: Any, worker: Any) -> None:
        if self.options.multiprocess_dir:
            mark_worker_dead(worker.pid, self.options.multiprocess_dir)

    def load_config(self) -> None:
        """gunicorn's settings; called again on SIGHUP, when our own settings are re-read too."""
        if self._started and self.options.on_reload is not None:
            self.options.on_reload()
        settings = {
            "bind": [self.options.bind],
            # One process: the cluster view and the reservation ledger live in it, so a second
            # worker would book the same GPUs again (replicas share holds only through the API:
            # docs/operations/replicas.md).
            "workers": 1,
            "worker_class": GuardedThreadWorker,
            "threads": self.options.threads,
            "worker_connections": MAX_CONNECTIONS,
            "keepalive": KEEPALIVE_SECONDS,
            "certfile": self.options.cert,
            "keyfile": self.options.key,
            "ssl_context": self._ssl_context,
            "child_exit": self._child_exit,
            "accesslog": None,  # the app logs one line per admission instead
            "errorlog": "-",
            "logger_class": GunicornLogger,  # through the root handler: one format for every line
            "loglevel": logging.getLevelName(logging.getLogger().getEffectiveLevel()).lower(),
            "proc_name": "topology-webhook",
        }
        if "control_socket_disable" in self.cfg.settings:  # gunicorn >= 25.1
            # Unused, and one per user (~/.gunicorn/gunicorn.ctl): a second server would take it over.
            settings["control_socket_disable"] = True
        for key, value in settings.items():
            self.cfg.set(key, value)

    def load(self) -> Any:
        return self._build_app()
