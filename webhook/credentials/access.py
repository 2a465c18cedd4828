"""Who may read the metrics port, and what: each request's bearer token authenticated and its
reader authorized by the cluster, as controller-runtime's secure metrics serving and
kube-rbac-proxy do.

- Every request but kubelet's probes (/healthz, /readyz) carries `Authorization: Bearer TOKEN`,
  and the cluster says whose token it is (a TokenReview). No token, or one the cluster does not
  accept: 401.
- /metrics, and any path but the page's: the reader must be allowed `get` on that non-resource
  URL (a SubjectAccessReview), else 403.
- /topology and /topology.json: a reader allowed `get` on the page's own URL sees everything. Any
  other authenticated reader sees the cluster's capacity (used, held and free GPUs per domain and
  node: no workload names) plus the workloads and holds of the namespaces in which a
  SubjectAccessReview allows them to `list pods` (`PageScope`, `visible_namespaces`).

This module decides and never calls the API: the calls are the two functions `Access` is given
(webhook/kube/access.py makes them with the `kubernetes` client; tests give fakes). Answers are
cached per token and per (reader, question): ALLOWED_SECONDS when yes, DENIED_SECONDS when no, at
most CACHE_ENTRIES of each (least recently used dropped first); a failed call is not cached. So a
scrape or a page view asks the API nothing most of the time, and a revoked role or token stops
working within 10 s. Failures are reported through `on_failure(reason)`, one of FAILURE_REASONS
(the counter topology_metrics_access_failures_total).
"""
from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Iterable, Mapping, Union

log = logging.getLogger(__name__)

ALLOWED_SECONDS = 10.0
DENIED_SECONDS = 2.0
CACHE_ENTRIES = 4096
# A page view of a reader who may not see everything asks about at most this many namespaces
# (those with workloads or holds on the page, in name order); the others' workloads are left out,
# and the page says how many. A `namespace=` filter asks about that one only.
MAX_NAMESPACE_CHECKS = 100
# Where the page finds its reader's scope in the WSGI environ (absent: everything, no cluster to ask).
SCOPE_ENVIRON_KEY = "topology_webhook.page_scope"
# Why a request was refused or not checked, and what it was answered (topology_metrics_access_failures_total's
# `reason`; docs/reference/metrics.md is generated from it).
FAILURE_REASONS: Mapping[str, str] = {
    "no_token": "401: no bearer token",
    "bad_token": "401: the cluster's TokenReview did not accept the token",
    "forbidden": "403: no `get` on that URL (SubjectAccessReview)",
    "review_error": "a TokenReview or SubjectAccessReview call failed: 503, or a namespace left off a tenant's page",
}
_LOG_EVERY_SECONDS = 60.0
_VERBS = {"GET": "get", "HEAD": "get", "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


@dataclass(frozen=True)
class Reader:
    """An authenticated user as the TokenReview named them: what a SubjectAccessReview asks about."""

    name: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()


@dataclass(frozen=True)
class NonResourceURL:
    """May the reader `verb` this path (nonResourceURLs in RBAC)?"""

    path: str
    verb: str = "get"


@dataclass(frozen=True)
class ResourceAction:
    """May the reader `verb` `resource` (of API `group`) in `namespace`?"""

    namespace: str
    verb: str
    resource: str
    group: str = ""


Question = Union[NonResourceURL, ResourceAction]


class ReviewError(Exception):
    """The cluster could not be asked: unreachable, an error answer, or our own RBAC missing."""


class _Cache:
    """A bounded map whose entries expire: least recently used dropped first when full."""

    def __init__(self, entries: int) -> None:
        self._entries = entries
        self._items: OrderedDict[Hashable, tuple[float, Any]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable, now: float) -> tuple[bool, Any]:
        with self._lock:
            found = self._items.get(key)
            if found is None:
                return False, None
            if found[0] <= now:
                del self._items[key]
                return False, None
            self._items.move_to_end(key)
            return True, found[1]

    def put(self, key: Hashable, value: Any, expires: float) -> None:
        with self._lock:
            self._items[key] = (expires, value)
            self._items.move_to_end(key)
            while len(self._items) > self._entries:
                self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)


class Access:
    """Authentication and authorization through the cluster, cached (see the module docstring).

    `review_token(token)`: the Reader the cluster says the token belongs to, or None when it does
    not accept it. `authorize(reader, question)`: whether the cluster allows it. Both raise
    ReviewError when the cluster cannot be asked."""

    def __init__(self, review_token: Callable[[str], Reader | None], authorize: Callable[[Reader, Question], bool],
                 on_failure: Callable[[str], None] = lambda _reason: None, clock: Callable[[], float] = time.monotonic,
                 allowed_seconds: float = ALLOWED_SECONDS, denied_seconds: float = DENIED_SECONDS,
                 entries: int = CACHE_ENTRIES) -> None:
        self._review_token = review_token
        self._authorize = authorize
        self._on_failure = on_failure
        self._clock = clock
        self.allowed_seconds, self.denied_seconds = allowed_seconds, denied_seconds
        self._readers = _Cache(entries)
        self._answers = _Cache(entries)
        self._last_logged = -_LOG_EVERY_SECONDS

    def reader(self, token: str) -> Reader | None:
        """Whose token this is, or None when the cluster does not accept it. Tokens are kept only
        as their SHA-256."""
        key = hashlib.sha256(token.encode()).digest()
        now = self._clock()
        found, reader = self._readers.get(key, now)
        if not found:
            reader = self._ask(self._review_token, token)
            self._readers.put(key, reader, now + (self.allowed_seconds if reader is not None else self.denied_seconds))
        return reader

    def allows(self, reader: Reader, question: Question) -> bool:
        now = self._clock()
        found, allowed = self._answers.get((reader, question), now)
        if not found:
            allowed = bool(self._ask(self._authorize, reader, question))
            self._answers.put((reader, question), allowed, now + (self.allowed_seconds if allowed else self.denied_seconds))
        return allowed

    def may_list_pods(self, reader: Reader, namespace: str) -> bool:
        """Whether the reader may list pods in `namespace`; no when the cluster cannot be asked."""
        try:
            return self.allows(reader, ResourceAction(namespace, "list", "pods"))
        except ReviewError:
            return False

    def failed(self, reason: str) -> None:
        self._on_failure(reason)

    def _ask(self, call: Callable[..., Any], *args: Any) -> Any:
        try:
            return call(*args)
        except ReviewError as err:
            self.failed("review_error")
            now = self._clock()
            if now - self._last_logged >= _LOG_EVERY_SECONDS:  # one line a minute, however many readers
                self._last_logged = now
                log.warning("metrics port: cannot check a reader's access: %s", err)
            raise


@dataclass(frozen=True)
class PageScope:
    """What the topology page may show one reader: everything (`may_list` None), or the cluster's
    capacity plus the workloads of the namespaces that `may_list(namespace)` allows."""

    may_list: Callable[[str], bool] | None = None

    @property
    def everything(self) -> bool:
        return self.may_list is None


EVERYTHING = PageScope()


def visible_namespaces(present: Iterable[str], may_list: Callable[[str], bool],
                       limit: int = MAX_NAMESPACE_CHECKS) -> tuple[frozenset[str], int]:
    """The namespaces among `present` whose workloads a reader sees: those `may_list` allows, of
    the first `limit` in name order; and how many were left unasked (their workloads not shown)."""
    ordered = sorted(set(present))
    return frozenset(namespace for namespace in ordered[:limit] if may_list(namespace)), max(0, len(ordered) - limit)


def bearer_token(header: str | None) -> str | None:
    """The token of an `Authorization: Bearer TOKEN` header, else None."""
    scheme, _, token = (header or "").strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def _refuse(start_response: Callable, status: str, message: str, *headers: tuple[str, str]) -> list[bytes]:
    body = message.encode()
    start_response(status, [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body))),
                            ("Cache-Control", "no-store"), *headers])
    return [body]


def guarded(app: Callable, access: Access, open_paths: Iterable[str], page_paths: Iterable[str]) -> Callable:
    """`app` (WSGI) behind the checks of the module docstring: `open_paths` pass unchecked,
    `page_paths` get a PageScope in the environ (SCOPE_ENVIRON_KEY), every other path needs
    `get` on its own URL."""
    open_set, page_set = frozenset(open_paths), frozenset(page_paths)

    def checked(environ: dict, start_response: Callable) -> Any:
        path = environ.get("PATH_INFO") or "/"
        if path in open_set:
            return app(environ, start_response)
        token = bearer_token(environ.get("HTTP_AUTHORIZATION"))
        if token is None:
            access.failed("no_token")
            return _refuse(start_response, "401 Unauthorized",
                           "unauthorized: send a Kubernetes bearer token (Authorization: Bearer TOKEN, e.g. from "
                           "`kubectl create token`): see docs/topology-page.md\n",
                           ("WWW-Authenticate", 'Bearer realm="topology-webhook"'))
        verb = _VERBS.get(environ.get("REQUEST_METHOD") or "GET", "get")
        try:
            reader = access.reader(token)
            if reader is None:
                access.failed("bad_token")
                return _refuse(start_response, "401 Unauthorized", "unauthorized: the cluster does not accept this "
                               "token\n", ("WWW-Authenticate", 'Bearer realm="topology-webhook", error="invalid_token"'))
            allowed = access.allows(reader, NonResourceURL(path, verb))
        except ReviewError:
            return _refuse(start_response, "503 Service Unavailable", "cannot check access now: the Kubernetes API "
                           "did not answer; try again\n", ("Retry-After", "5"))
        if path in page_set:
            environ[SCOPE_ENVIRON_KEY] = EVERYTHING if allowed else PageScope(
                lambda namespace: access.may_list_pods(reader, namespace))
        elif not allowed:
            access.failed("forbidden")
            return _refuse(start_response, "403 Forbidden", f"forbidden: user {reader.name!r} may not {verb} {path} "
                           "(RBAC: nonResourceURLs)\n")
        return app(environ, start_response)

    return checked
