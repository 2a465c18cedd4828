"""gunicorn as a library: TLS settings, worker model and hooks, with the app built in the worker.

A `BaseApplication` rather than a gunicorn config file, because the command line hands over
Python objects (the app builder, the certificate reloader, the metrics directory) directly:
no settings file on disk and no environment variables to pass them through, and `load()` runs
in each worker after the fork, so no thread (a future cluster watch) exists before forking.
"""
from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import Any, Callable

from gunicorn.app.base import BaseApplication

from .certs import ReloadingContext
from .metrics import mark_worker_dead

THREADS_PER_WORKER = 8
# The apiserver keeps connections to webhooks open and idles them out after 90 s.
KEEPALIVE_SECONDS = 75


@dataclass(frozen=True)
class ServeOptions:
    bind: str  # HOST:PORT
    cert: str
    key: str
    workers: int = 1
    threads: int = THREADS_PER_WORKER
    multiprocess_dir: str | None = None  # shared metrics directory when workers > 1


class WebhookServer(BaseApplication):
    """Runs `build_app()` in every gunicorn worker, serving it over TLS 1.2+."""

    def __init__(self, build_app: Callable[[], Any], options: ServeOptions) -> None:
        self._build_app = build_app
        self.options = options
        # Loaded now so a bad certificate stops start-up with a clear message; workers inherit it.
        self.tls = ReloadingContext(options.cert, options.key)
        super().__init__()

    def _ssl_context(self, _config: Any, _default_factory: Callable[[], ssl.SSLContext]) -> ssl.SSLContext:
        # gunicorn asks for a context on every new connection: hand out the current one.
        return self.tls.current()

    def _child_exit(self, _server: Any, worker: Any) -> None:
        if self.options.multiprocess_dir:
            mark_worker_dead(worker.pid, self.options.multiprocess_dir)

    def load_config(self) -> None:
        settings = {
            "bind": [self.options.bind],
            "workers": self.options.workers,
            "worker_class": "gthread",
            "threads": self.options.threads,
            "keepalive": KEEPALIVE_SECONDS,
            "certfile": self.options.cert,
            "keyfile": self.options.key,
            "ssl_context": self._ssl_context,
            "child_exit": self._child_exit,
            "accesslog": None,  # the app logs one JSON line per admission instead
            "errorlog": "-",
            "loglevel": "info",
            "proc_name": "topology-webhook",
        }
        if "control_socket_disable" in self.cfg.settings:  # gunicorn >= 25.1
            # Unused, and one per user (~/.gunicorn/gunicorn.ctl): a second server would take it over.
            settings["control_socket_disable"] = True
        for key, value in settings.items():
            self.cfg.set(key, value)

    def load(self) -> Any:
        return self._build_app()
