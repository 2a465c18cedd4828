"""The metrics port: scrapes, kubelet's probes and the topology page, beside the webhook's port.

`MetricsServer` receives requests as the webhook's port does (server.py), but in a thread of the
worker rather than in gunicorn: one loop (a selector) accepts connections,
does the TLS handshake when the port speaks HTTPS, and receives each request, all without
blocking; a connection that has not sent its whole request line and headers within
METRICS_REQUEST_SECONDS (1 s: Prometheus and kubelet send theirs at once) is closed unanswered.
Only a request that has fully arrived goes to one of METRICS_THREADS threads, which answers it
(each socket call bounded, the whole answer closed at the connection deadline) and closes the
connection. So silent or trickling clients cost a file descriptor for a second each, never a
thread: /metrics answers at once beside hundreds of them, where a thread per connection held 16
threads for 10 s each. Past METRICS_MAX_CONNECTIONS open connections the loop stops accepting
and the rest wait in the listen backlog. Every answer on the port, errors included, carries
SECURITY_HEADERS (no MIME sniffing; the topology page's Content-Security-Policy).
"""
from __future__ import annotations

import errno
import io
import logging
import queue
import selectors
import socket
import ssl
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import IO, Any, Callable, cast
from wsgiref.simple_server import ServerHandler, WSGIRequestHandler, WSGIServer

from prometheus_client import CollectorRegistry, make_wsgi_app

from ..credentials.access import Access, guarded
from .page.render import CONTENT_SECURITY_POLICY
from .paths import HEALTHZ_PATH, METRICS_PATH, READYZ_PATH, TOPOLOGY_JSON_PATH, TOPOLOGY_PATH
from .server import REQUEST_SECONDS, SOCKET_CALL_SECONDS, receive_request

log = logging.getLogger(__name__)

# The metrics port (scrapes, kubelet's probes, the page): requests answered at once; the listen
# backlog; how long a connection may take to send its whole request (else it is closed unanswered);
# the body taken with a request (GET only: a longer one is not read); connections held at once
# (beyond them, the rest wait in the backlog). An answer is cut REQUEST_SECONDS after it starts.
METRICS_THREADS = 16
METRICS_BACKLOG = 1024
METRICS_REQUEST_SECONDS = 1.0
METRICS_MAX_BODY_BYTES = 64 * 1024
METRICS_MAX_CONNECTIONS = 1024
# On every answer of the metrics port, whatever its path or status.
SECURITY_HEADERS = (("X-Content-Type-Options", "nosniff"), ("Content-Security-Policy", CONTENT_SECURITY_POLICY))
_PLAIN_ANSWER_BODY = b"this port speaks HTTPS: use https:// (with a bearer token: see docs/topology-page.md)\n"
PLAIN_HTTP_ON_TLS_ANSWER = (b"HTTP/1.0 400 Bad Request\r\nContent-Type: text/plain\r\nConnection: close\r\n"
                            + b"".join(f"{name}: {value}\r\n".encode() for name, value in SECURITY_HEADERS)
                            + f"Content-Length: {len(_PLAIN_ANSWER_BODY)}\r\n\r\n".encode() + _PLAIN_ANSWER_BODY)


class ConnectionDeadlines:
    """Shuts down connections open longer than `seconds`: one thread watches them all, so a client
    that reads an answer slowly holds a handler thread for `seconds` at most."""

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
                    sock.shutdown(socket.SHUT_RDWR)  # the handler's blocked call returns, and it ends
                except OSError:
                    pass  # already closed


@dataclass(eq=False)
class _Arrival:
    """A metrics-port connection whose request is still arriving (then: has arrived)."""

    sock: socket.socket
    address: Any
    deadline: float  # time.monotonic() by which the whole request must be here
    received: bytearray = field(default_factory=bytearray)
    tls: str = ""  # "" plain, "sniff" (TLS port: the first byte not seen yet), "handshake", "done"


class _Writer(io.BufferedIOBase):
    """The handler's wfile: every write sent whole (each socket call bounded by the socket's timeout)."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__()
        self._sock = sock

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self._sock.sendall(data)
        with memoryview(data) as view:
            return view.nbytes


class _ServerHandler(ServerHandler):
    """wsgiref's handler, whose own error answer (an app that raised) carries the port's headers too."""

    error_headers = [("Content-Type", "text/plain"), *SECURITY_HEADERS]


class _MetricsHandler(WSGIRequestHandler):
    """Answers one request that has fully arrived (`_Arrival.received`); the connection then closes
    (HTTP/1.0, as before: scrapes and probes open one connection each)."""

    server: MetricsServer
    request: _Arrival

    def setup(self) -> None:
        self.connection = self.request.sock
        self.connection.settimeout(SOCKET_CALL_SECONDS)  # each socket call; the watchdog bounds the whole answer
        self.rfile = io.BytesIO(bytes(self.request.received))
        self.wfile = _Writer(self.connection)
        self.server.deadlines.start(self.connection)

    def handle(self) -> None:
        """WSGIRequestHandler.handle, with the handler above."""
        self.raw_requestline = self.rfile.readline(65537)
        if len(self.raw_requestline) > 65536:
            self.requestline = self.request_version = self.command = ""
            self.send_error(414)
            return
        if not self.parse_request():  # it has answered 400
            return
        handler = _ServerHandler(self.rfile, cast("IO[bytes]", self.wfile), self.get_stderr(), self.get_environ(),
                                 multithread=True)
        handler.request_handler = self  # type: ignore[attr-defined]
        app = self.server.get_app()
        assert app is not None  # set when the server was made
        handler.run(app)

    def end_headers(self) -> None:
        """Only http.server's own error answers (a malformed request) pass here: add the headers."""
        for name, value in SECURITY_HEADERS:
            self.send_header(name, value)
        super().end_headers()

    def finish(self) -> None:
        self.server.deadlines.end(self.connection)

    def log_message(self, *_args: Any) -> None:  # a scrape or probe is not worth a log line
        pass


class MetricsServer(WSGIServer):
    """The metrics port's server on a socket bound and listening already (see the module
    docstring): one loop receives every request without blocking, `threads` threads answer."""

    def __init__(self, listener: socket.socket, app: Any, threads: int, deadline_seconds: float,
                 request_seconds: float = METRICS_REQUEST_SECONDS, tls: Callable[[], ssl.SSLContext] | None = None,
                 max_connections: int = METRICS_MAX_CONNECTIONS) -> None:
        self.deadlines = ConnectionDeadlines(deadline_seconds)
        self.request_seconds = request_seconds
        self.threads = threads
        self.max_connections = max_connections
        self._tls = tls
        self._arriving: deque[_Arrival] = deque()  # oldest deadline first (all have the same length)
        self._ready: queue.SimpleQueue[_Arrival | None] = queue.SimpleQueue()
        self._open = 0  # accepted and not closed yet: arriving, waiting for a thread, or being answered
        self._open_lock = threading.Lock()
        self._paused_until = 0.0  # out of file descriptors: accept nothing until then
        self._stopping = False
        self._wake_read, self._wake_write = socket.socketpair()  # a thread closed one: the loop may accept again
        self._wake_read.setblocking(False)
        self._wake_write.setblocking(False)
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

    # ----- the receiving loop (one thread) -----------------------------------------------------
    def serve_forever(self, poll_interval: float = 0.5) -> None:
        for number in range(self.threads):
            threading.Thread(target=self._answer, name=f"metrics-{number}", daemon=True).start()
        self.socket.setblocking(False)  # a worker started on SIGHUP accepts from the same socket
        selector = selectors.DefaultSelector()
        selector.register(self._wake_read, selectors.EVENT_READ, None)
        accepting = False
        try:
            while not self._stopping:
                now = time.monotonic()
                with self._open_lock:
                    room = self._open < self.max_connections and now >= self._paused_until
                if room != accepting:
                    if room:
                        selector.register(self.socket, selectors.EVENT_READ, self.socket)
                    else:
                        selector.unregister(self.socket)
                    accepting = room
                wait = poll_interval  # a closed connection wakes the loop (the wake socket) when it is full
                if now < self._paused_until:
                    wait = self._paused_until - now
                if self._arriving:
                    wait = min(wait, max(0.0, self._arriving[0].deadline - now))
                for key, _ in selector.select(wait):
                    if key.data is None:
                        self._drain_wakeups()
                    elif key.data is self.socket:
                        self._accept(selector)
                    else:
                        self._receive(selector, key.data)
                now = time.monotonic()
                while self._arriving and self._arriving[0].deadline <= now:
                    self._drop(selector, self._arriving[0])  # no whole request in time: closed unanswered
        finally:
            for arrival in list(self._arriving):
                self._drop(selector, arrival)
            selector.close()
            for _ in range(self.threads):
                self._ready.put(None)

    def stop(self) -> None:
        """Ends the loop and the threads (connections being answered are finished)."""
        self._stopping = True
        self._wake()

    def _accept(self, selector: selectors.BaseSelector) -> None:
        try:
            sock, address = self.socket.accept()
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            return  # another worker took it, or the client left
        except OSError as err:
            if err.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                self._paused_until = time.monotonic() + 0.1  # held connections close, then accept again
                return
            raise
        sock.setblocking(False)
        arrival = _Arrival(sock, address, time.monotonic() + self.request_seconds,
                           tls="sniff" if self._tls is not None else "")
        with self._open_lock:
            self._open += 1
        self._arriving.append(arrival)
        selector.register(sock, selectors.EVENT_READ, arrival)

    def _receive(self, selector: selectors.BaseSelector, arrival: _Arrival) -> None:
        """Take what the connection has sent so far; hand the request to a thread once complete."""
        try:
            if arrival.tls == "sniff":
                first = arrival.sock.recv(1, socket.MSG_PEEK)
                if not first:
                    raise ConnectionResetError("closed before a request")
                if first != b"\x16":  # not a TLS handshake record: plain HTTP on the TLS port
                    _discard(arrival.sock)  # closing with its request unread would reset our answer away
                    arrival.sock.send(PLAIN_HTTP_ON_TLS_ANSWER)  # short: fits the socket buffer
                    raise ConnectionResetError("plain HTTP on the TLS port")
                assert self._tls is not None
                arrival.sock = self._tls().wrap_socket(arrival.sock, server_side=True, do_handshake_on_connect=False)
                selector.modify(arrival.sock, selectors.EVENT_READ, arrival)
                arrival.tls = "handshake"
            if arrival.tls == "handshake":
                arrival.sock.do_handshake()  # type: ignore[attr-defined]
                arrival.tls = "done"
            receive_request(arrival.sock, arrival.received, METRICS_MAX_BODY_BYTES)
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError):
            return  # more to come; the selector calls again (a handshake write fits the socket buffer)
        except OSError:  # ssl.SSLError included: a bad handshake, a reset
            self._drop(selector, arrival)
            return
        selector.unregister(arrival.sock)
        self._arriving.remove(arrival)
        self._ready.put(arrival)

    def _drop(self, selector: selectors.BaseSelector, arrival: _Arrival) -> None:
        selector.unregister(arrival.sock)
        self._arriving.remove(arrival)
        arrival.sock.close()
        self._closed()

    def _closed(self) -> None:
        with self._open_lock:
            self._open -= 1

    def _wake(self) -> None:
        try:
            self._wake_write.send(b"\0")
        except OSError:
            pass  # its buffer is full: the loop is awake already

    def _drain_wakeups(self) -> None:
        try:
            while self._wake_read.recv(4096):
                pass
        except OSError:
            pass

    # ----- the answering threads ---------------------------------------------------------------
    def _answer(self) -> None:
        while True:
            arrival = self._ready.get()
            if arrival is None:
                return
            try:
                self.finish_request(arrival, arrival.address)  # type: ignore[arg-type]
            except Exception:
                self.handle_error(arrival.sock, arrival.address)
            finally:
                self.shutdown_request(arrival.sock)
                self._closed()
                self._wake()

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], OSError):  # a client that went away, or a deadline, is no error
            log.exception("metrics port: answering %s failed", client_address)


def _discard(sock: socket.socket) -> None:
    """Read and drop what a non-blocking socket has received so far."""
    try:
        while sock.recv(65536):
            pass
    except OSError:
        pass  # nothing more now


def with_security_headers(app: Callable) -> Callable:
    """`app` with SECURITY_HEADERS on every answer, replacing any of the same names."""
    names = {name.lower() for name, _ in SECURITY_HEADERS}

    def secured(environ: dict, start_response: Callable) -> Any:
        def start(status: str, headers: list, exc_info: Any = None) -> Any:
            kept = [(name, value) for name, value in headers if name.lower() not in names]
            return start_response(status, kept + list(SECURITY_HEADERS), exc_info)

        return app(environ, start)

    return secured


def start_metrics_server(listener: socket.socket, registry: CollectorRegistry, webhook_app: Any,
                         topology_app: Any | None = None, threads: int = METRICS_THREADS,
                         deadline_seconds: float = REQUEST_SECONDS, *,
                         tls: Callable[[], ssl.SSLContext] | None = None, access: Access | None = None,
                         request_seconds: float = METRICS_REQUEST_SECONDS) -> MetricsServer:
    """/metrics on its own port, in daemon threads of the worker: scrapers reach this port and the
    apiserver the TLS one, so a NetworkPolicy can tell them apart. /healthz and /readyz answer here
    too (from the webhook app), without authentication: with --client-ca, kubelet's probes carry
    no client certificate, so they are pointed at this port. The topology page (page/render.py)
    is here, beside the metrics it draws, and read-only (None: not served). /mutate is never
    served here.

    `tls`: the current server context (ReloadingContext.current), for HTTPS; None: plain HTTP.
    `access`: every other path needs a bearer token that the cluster authenticates and
    authorizes (access.py); None: open to whoever reaches the port (no cluster to ask)."""
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

    served = app if access is None else guarded(app, access, open_paths=(HEALTHZ_PATH, READYZ_PATH),
                                                page_paths=(TOPOLOGY_PATH, TOPOLOGY_JSON_PATH))
    httpd = MetricsServer(listener, with_security_headers(served), threads, deadline_seconds,
                          request_seconds=request_seconds, tls=tls)
    threading.Thread(target=httpd.deadlines.watch, args=(min(1.0, deadline_seconds / 4),),
                     name="metrics-deadlines", daemon=True).start()
    threading.Thread(target=httpd.serve_forever, name="metrics-server", daemon=True).start()
    return httpd

