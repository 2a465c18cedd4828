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
import socket
import ssl
import threading
import time
from collections import deque
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable
from wsgiref.simple_server import WSGIRequestHandler

from gunicorn import http
from gunicorn import sock as gunicorn_sock
from gunicorn.app.base import BaseApplication
from gunicorn.workers.gthread import TConn, ThreadWorker
from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from ..core.config import HEALTHZ_PATH, METRICS_PATH, READYZ_PATH, TOPOLOGY_JSON_PATH, TOPOLOGY_PATH
from .certs import ReloadingContext
from .logs import GunicornLogger
from .metrics import mark_worker_dead

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
# The metrics port (scrapes, kubelet's probes): connections handled at once, and how many more
# wait in the listen backlog for one of them; each is closed REQUEST_SECONDS after it is accepted.
METRICS_THREADS = 16
METRICS_BACKLOG = 1024
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


def request_complete(received: bytes, max_body_bytes: int) -> bool:
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
            while not request_complete(conn.received, self.app.options.max_body_bytes):
                chunk = conn.sock.recv(65536)
                if not chunk:
                    raise ConnectionResetError("closed before a whole request arrived")
                conn.received += chunk
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


class _MetricsHandler(WSGIRequestHandler):
    timeout = SOCKET_CALL_SECONDS  # each socket call; the watchdog bounds the connection as a whole
    server: MetricsServer

    def setup(self) -> None:
        super().setup()
        self.server.deadlines.start(self.connection)

    def finish(self) -> None:
        self.server.deadlines.end(self.connection)
        super().finish()

    def log_message(self, *_args: Any) -> None:  # a scrape or probe is not worth a log line
        pass


class ConnectionDeadlines:
    """Shuts down connections open longer than `seconds`: one thread watches them all, so a
    trickling client holds a handler thread for `seconds` at most."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds = seconds
        self._clock = clock
        self._open: dict[socket.socket, float] = {}
        self._lock = threading.Lock()

    def start(self, sock: socket.socket) -> None:
        with self._lock:
            self._open[sock] = self._clock() + self.seconds

    def end(self, sock: socket.socket) -> None:
        with self._lock:
            self._open.pop(sock, None)

    def watch(self, interval: float) -> None:
        while True:
            time.sleep(interval)
            now = self._clock()
            with self._lock:
                overdue = [sock for sock, deadline in self._open.items() if deadline <= now]
            for sock in overdue:
                try:
                    sock.shutdown(socket.SHUT_RDWR)  # the handler's blocked read returns, and it ends
                except OSError:
                    pass  # already closed


class MetricsServer(ThreadingWSGIServer):
    """The metrics port's server on a socket bound and listening already, with at most
    `threads` connections handled at once: further ones wait in the listen backlog (a scrape or
    probe waits for a slot, at most the connection deadline) instead of each taking a thread."""

    daemon_threads = True

    def __init__(self, listener: socket.socket, app: Any, threads: int, deadline_seconds: float) -> None:
        self.deadlines = ConnectionDeadlines(deadline_seconds)
        self._slots = threading.BoundedSemaphore(threads)
        super().__init__(listener.getsockname()[:2], _MetricsHandler, bind_and_activate=False)
        self.socket.close()  # the one BaseServer made; the listener is inherited from the server process
        self.socket = listener
        self.address_family = listener.family
        self.server_bind_done(listener)
        self.set_app(app)

    def server_bind_done(self, listener: socket.socket) -> None:
        """What binding would have recorded: the name and port wsgiref puts in the environ."""
        host, port = listener.getsockname()[:2]
        self.server_address = (host, port)
        self.server_name, self.server_port = socket.getfqdn(host), port
        self.setup_environ()

    def process_request(self, request: Any, client_address: Any) -> None:
        self._slots.acquire()  # blocks the accept loop: later connections wait in the backlog
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


def start_metrics_server(listener: socket.socket, registry: CollectorRegistry, webhook_app: Any,
                         topology_app: Any | None = None, threads: int = METRICS_THREADS,
                         deadline_seconds: float = REQUEST_SECONDS) -> None:
    """/metrics over plain HTTP on its own port, in a daemon thread of the worker: scrapers reach
    this port and the apiserver the TLS one, so a NetworkPolicy can tell them apart. /healthz and
    /readyz answer here too (from the webhook app): with --client-ca, kubelet's probes carry no
    client certificate, so they are pointed at this port. The topology page (topology_page.py)
    is here, beside the metrics it draws, and read-only (None: not served). /mutate is never
    served here."""
    metrics_app = make_wsgi_app(registry)
    paths = [METRICS_PATH, HEALTHZ_PATH, READYZ_PATH] + ([TOPOLOGY_PATH, TOPOLOGY_JSON_PATH] if topology_app else [])
    not_found = f"not found: this port serves {', '.join(paths)}\n".encode()

    def app(environ: dict, start_response: Callable) -> Any:
        path = environ.get("PATH_INFO")
        if path == METRICS_PATH:
            return metrics_app(environ, start_response)
        if path in (HEALTHZ_PATH, READYZ_PATH):
            return webhook_app(environ, start_response)
        if path in (TOPOLOGY_PATH, TOPOLOGY_JSON_PATH) and topology_app is not None:
            return topology_app(environ, start_response)
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [not_found]

    httpd = MetricsServer(listener, app, threads, deadline_seconds)
    threading.Thread(target=httpd.deadlines.watch, args=(min(1.0, deadline_seconds / 4),),
                     name="metrics-deadlines", daemon=True).start()
    threading.Thread(target=httpd.serve_forever, name="metrics-server", daemon=True).start()


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
