"""The API feed: Nodes and Pods (and the autoscalers' pools) from the Kubernetes API, kept current by
list+watch, fed into the cluster index (the live cluster view of docs/operations/replicas.md).

Names, so that "view" means one thing: the `ClusterIndex` is the state placement reads, a
constrained subset is the part of it one request may use (filters.py), and the `ApiFeed` is what
keeps an index current from the API. `ApiFeed` is handed one `ClusterIndex` for its whole life
(webhook/cli/live.py builds it, and the adapters over it) and feeds it event by event, so whoever
holds that index (the admission path, through the placer) always sees the same object, and
reservations made in it survive reconnects and relists.

Per kind (nodes, pods) one daemon thread runs the reflector loop:

1. list all objects in pages (`limit`/`continue`) and apply them: upsert every listed object,
   then forget what the index counts that the list no longer has. The index is changed in
   place, never rebuilt, so reservations survive a relist. Remember the list's resourceVersion.
   The next page is fetched and decoded while this one is applied; a page is applied in one
   `ClusterIndex.batch()`; while any list is applied the cyclic collector is off (see
   `_CollectorPause` in streams.py): so 100,000 nodes and 1M pods list in about half a minute on one core.
2. watch from that resourceVersion with bookmarks and a server-side timeout; apply every event
   and remember the newest resourceVersion (bookmarks included). When the watch ends at its
   timeout, watch again from there.
3. a watch that breaks, or a list or watch that fails, is retried from the last resourceVersion
   after a capped exponential backoff with jitter; `410 Gone` (an HTTP 410, or an ERROR event
   with code 410) means that resourceVersion is compacted away: relist (step 1) at once.

A third thread expires reservations whose time-to-live has passed. When replicas share their
claims (`claims_namespace`), a third stream lists and watches the claims Lease in that namespace
the same way and applies each version to the ledger (webhook/kube/shared_claims.py); with
`decision_records`, one more watches the replicas' records of their recent decisions
(webhook/kube/shared_decisions.py, whose own thread writes this replica's).

Objects are handled as the plain dicts the API sends (the shape `ClusterIndex` reads): watch
events are not turned into client model objects, which would cost far more than the index
update itself. Nothing happens at import time.

The streams of the kinds besides the nodes are made in webhook/kube/kinds.py; what every stream
runs on (its state, the dict watch, the page fetched ahead, the backoff, the collector's pause) is
webhook/kube/streams.py.
"""
from __future__ import annotations

import functools
import logging
import random
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterator

import orjson
from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException

from ..objects import feed
from ..state.index import ClusterIndex, NodeGone
from .kinds import claims_stream, decisions_stream, dra_streams, growth_streams, pod_stream, stored_streams
from .shared_claims import ApiClaims, describe
from .shared_decisions import ApiDecisionRecords
from .releaser import Releaser
from .streams import FORBIDDEN, GONE, NOT_FOUND, Ahead, Backoff, DictWatch, Stream, StreamStatus, collector_paused

log = logging.getLogger(__name__)

LIST_PAGE_SIZE = 500  # as client-go's reflector: big lists arrive in pages, not one huge response
CONNECT_TIMEOUT_SECONDS = 10.0
READ_GRACE_SECONDS = 15.0  # how long past a watch's own timeout the socket may stay silent
EXPIRE_INTERVAL_SECONDS = 5.0
RELEASE_INTERVAL_SECONDS = 1.0  # a pass decides only the gated workloads whose pods all exist
SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def own_namespace() -> str | None:
    """The namespace of the pod this runs in (its service account's), None outside a pod."""
    try:
        with open(SERVICE_ACCOUNT_NAMESPACE) as file:
            return file.read().strip() or None
    except OSError:
        return None


@dataclass(frozen=True)
class Pacing:
    """How often the feed's loops act and how long its calls wait (the defaults serve; tests shorten them).
    `watch_timeout_seconds` None: a third of the staleness limit, at most 300."""

    backoff_base: float = 0.5
    backoff_cap: float = 30.0
    watch_timeout_seconds: int | None = None
    page_size: int = LIST_PAGE_SIZE
    expire_interval_seconds: float = EXPIRE_INTERVAL_SECONDS
    release_interval_seconds: float = RELEASE_INTERVAL_SECONDS


class ApiFeed:
    """Nodes and Pods from the API, applied incrementally to one `ClusterIndex`.

    It builds nothing but its streams: the index, the claims Lease it feeds (`claims`), the
    replicas' decision records it feeds (`decision_records`) and the releaser whose passes follow
    the view (`releaser`) are made and wired by the composition root (webhook/cli/live.py).
    `clock` is what `readiness()` measures time with.
    """

    def __init__(self, index: ClusterIndex, api_client: k8s_client.ApiClient, *, claims: ApiClaims | None = None,
                 decision_records: ApiDecisionRecords | None = None, releaser: Releaser | None = None,
                 clock: Callable[[], float] = time.monotonic, pacing: Pacing = Pacing(),
                 rng: random.Random | None = None) -> None:
        self.index = index
        self.config = index.config
        self.clock = clock
        # The server ends each watch well inside the staleness limit, so a quiet but healthy
        # stream still shows progress (the clean end) before it would be called stale.
        self.watch_timeout_seconds = pacing.watch_timeout_seconds or max(
            1, min(300, int(self.config.stale_after_seconds / 3)))
        self.page_size = pacing.page_size
        self.expire_interval_seconds = pacing.expire_interval_seconds
        rng = rng or random.Random()
        core = k8s_client.CoreV1Api(api_client)
        self._streams: tuple[Stream, ...] = (
            Stream("nodes", core.list_node, lambda node: (node.get("metadata") or {}).get("name", ""),
                   self._upsert_node, lambda node: self._delete_node(node["metadata"]["name"]),
                   lambda: set(index.nodes), self._delete_node),
            pod_stream(index, core),
        )
        self._streams += growth_streams(index, core, k8s_client.CustomObjectsApi(api_client))
        self.claims = claims
        if claims is not None:
            self._streams += (claims_stream(claims, api_client, claims.namespace),)
        self._streams += dra_streams(api_client, index) + stored_streams(index, api_client)
        self._streams += (decisions_stream(decision_records, api_client),) if decision_records is not None else ()
        self._backoff = {stream.kind: Backoff(pacing.backoff_base, pacing.backoff_cap, random.Random(rng.random()))
                         for stream in self._streams}
        # Gated waits are started by a pass after the cluster changed, at most once an interval.
        self.releaser = releaser
        self.release_interval_seconds = pacing.release_interval_seconds
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._levels_said: str | None = None

    def _upsert_node(self, node: dict) -> None:
        feed.upsert(self.index, node, "Node")
        self._say_levels()

    def _delete_node(self, name: str) -> None:
        self.index.apply(NodeGone(name))
        self._say_levels()

    def _say_levels(self) -> None:
        """Log each preset `levels: auto` moves to, as the nodes' labels call for it."""
        preset = self.index.preset
        if preset is not None and preset != self._levels_said:
            self._levels_said = preset
            log.info("levels: auto chose the %s preset: %s%s", preset,
                     ", ".join(lv.label for lv in self.index.config.levels),
                     f" ({self.index.levels_warning})" if self.index.levels_warning else "")

    # ---- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        self._stop.clear()
        self._threads = [threading.Thread(target=self._run, args=(stream,), name=f"clusterview-{stream.kind}",
                                          daemon=True) for stream in self._streams]
        self._threads.append(threading.Thread(target=self._expire_loop, name="clusterview-expire", daemon=True))
        if self.releaser is not None:
            self._threads.append(threading.Thread(target=self._release_loop, name="clusterview-release", daemon=True))
        if self.claims is not None and self.claims.allotment.share:  # without allotments it has nothing to do
            self._threads.append(threading.Thread(target=self.claims.keep_allotment, args=(self._stop,),
                                                  name="clusterview-allotment", daemon=True))
        for thread in self._threads:
            thread.start()

    def stop(self, timeout: float = 5.0) -> bool:
        """Stop the threads; True when all of them ended within `timeout` seconds."""
        self._stop.set()
        for stream in self._streams:
            if stream.watch is not None:
                stream.watch.stop()  # shuts the socket down, so a blocked read returns now
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return not any(thread.is_alive() for thread in self._threads)

    def wait_synced(self, timeout: float) -> bool:
        """Block until every kind has been listed once, or `timeout` seconds pass."""
        deadline = time.monotonic() + timeout
        while not all(s.synced for s in self._streams):
            if time.monotonic() >= deadline or self._stop.wait(0.02):
                return False
        return True

    # ---- what callers read -----------------------------------------------------------------
    def readiness(self) -> tuple[bool, str]:
        """(ready, why): not ready until every kind is listed, or once any makes no progress."""
        for stream in self._streams:
            if not stream.synced:
                detail = f"last error: {stream.last_error}" if stream.last_error else "list in progress"
                return False, f"cluster view not synced yet: waiting for the first list of {stream.kind} ({detail})"
        now = self.clock()
        limit = self.config.stale_after_seconds
        for stream in self._streams:
            age = now - (stream.last_progress or 0.0)  # every stream is synced here, so it made progress
            if age > limit:
                detail = f"; last error: {stream.last_error}" if stream.last_error else ""
                return False, (f"cluster view is stale: no list or watch progress on {stream.kind} for "
                               f"{age:.0f}s (limit {limit:.0f}s){detail}")
        return True, "cluster view in sync"

    def age(self) -> float | None:
        """Seconds since the stream heard from least recently made progress (None before every
        stream has been listed once): how stale the index may be."""
        progress = [s.last_progress for s in self._streams]
        if None in progress:
            return None
        return self.clock() - min(p for p in progress if p is not None)

    def status(self) -> tuple[StreamStatus, ...]:
        now = self.clock()
        return tuple(StreamStatus(
            kind=s.kind, synced=s.synced, resource_version=s.resource_version,
            seconds_since_progress=None if s.last_progress is None else now - s.last_progress,
            objects=s.listed, events=s.events, lists=s.lists, failures=s.failures,
            last_error=s.last_error) for s in self._streams)

    # ---- the reflector loop ----------------------------------------------------------------
    def _run(self, stream: Stream) -> None:
        backoff = self._backoff[stream.kind]
        while not self._stop.is_set():
            try:
                if stream.resource_version is None:
                    self._relist(stream)
                    backoff.reset()
                self._watch(stream, backoff)
            except ApiException as err:
                if err.status == GONE:
                    log.info("%s: resourceVersion %s is gone (410); relisting", stream.kind,
                             stream.resource_version)
                    stream.resource_version = None
                    continue
                if stream.optional and err.status in (FORBIDDEN, NOT_FOUND):
                    self._absent(stream, err)
                    continue
                self._failed(stream, err, backoff)
            except Exception as err:  # noqa: BLE001 - any transport failure means: back off, retry
                if self._stop.is_set():
                    break
                self._failed(stream, err, backoff)

    def _failed(self, stream: Stream, err: BaseException, backoff: Backoff) -> None:
        stream.failures += 1
        stream.last_error = describe(err)
        delay = backoff.next_delay()
        log.warning("%s list/watch failed (%s); retrying in %.1fs", stream.kind, stream.last_error, delay)
        self._stop.wait(delay)

    def _absent(self, stream: Stream, err: ApiException) -> None:
        """An optional API is not served, or not granted: nothing of its kind is there. Said once
        in the log; the list is tried again after a watch interval."""
        why = "not served" if err.status == NOT_FOUND else "not granted by RBAC"
        if stream.last_error != why:
            log.info("%s: the API is %s (%s); the view goes on without them", stream.kind, why, err.status)
        with self.index.batch():
            for key in stream.counted():
                stream.forget(key)
        stream.last_error = why
        stream.resource_version = None
        stream.listed = 0
        stream.synced = True
        self._progress(stream)
        self._stop.wait(self.watch_timeout_seconds)

    def _progress(self, stream: Stream) -> None:
        stream.last_progress = self.clock()

    def _timeouts(self) -> tuple[float, float]:
        return CONNECT_TIMEOUT_SECONDS, self.watch_timeout_seconds + READ_GRACE_SECONDS

    def _pages(self, stream: Stream) -> Iterator[tuple[str | None, list[dict]]]:
        """(resourceVersion, items) per page of one consistent list. Each next page is asked for
        and decoded on its own thread while the caller applies this one: the server's time and
        the wire's overlap the index's, rather than adding to it."""
        def page(token: str | None) -> dict:
            response = stream.list_call(limit=self.page_size, _continue=token, _preload_content=False,
                                        _request_timeout=self._timeouts())
            return orjson.loads(response.data)

        ahead = Ahead(functools.partial(page, None), f"clusterview-{stream.kind}-page")
        while True:
            body = ahead.result()
            metadata = body.get("metadata") or {}
            token = metadata.get("continue")
            if token and not self._stop.is_set():
                ahead = Ahead(functools.partial(page, token), f"clusterview-{stream.kind}-page")
            yield metadata.get("resourceVersion"), body.get("items") or []
            if not token or self._stop.is_set():
                return

    def _relist(self, stream: Stream) -> None:
        """Apply a full list: upsert everything listed, forget what the list no longer has."""
        # With nothing of its kind counted before, nothing can be missing from the list: the first
        # list of a million pods keeps no set of their keys.
        seen: set[str] | None = set() if stream.counted() else None
        listed = 0
        resource_version = None
        with collector_paused():
            for resource_version, items in self._pages(stream):
                with self.index.batch():
                    for obj in items:
                        self._apply(stream, stream.upsert, obj)
                    if seen is not None:
                        seen.update(map(stream.key, items))
                listed += len(items)
        if self._stop.is_set():
            return
        if seen is not None:
            with self.index.batch():
                for key in stream.counted() - seen:
                    stream.forget(key)
        stream.listed = listed
        stream.resource_version = resource_version
        stream.lists += 1
        stream.synced = True
        stream.last_error = None
        self._progress(stream)
        log.info("%s: listed %d at resourceVersion %s", stream.kind, listed, resource_version)
        if stream.kind == "resourceslices":
            for warning in self.index.inventory_warnings():
                log.warning("%s", warning)

    def _watch(self, stream: Stream, backoff: Backoff) -> None:
        """One watch call from the last resourceVersion until the server ends it."""
        stream.watch = DictWatch(return_type=dict)  # objects stay dicts: no model lookup by name
        try:
            for event in stream.watch.stream(stream.list_call, resource_version=stream.resource_version,
                                             allow_watch_bookmarks=True,
                                             timeout_seconds=self.watch_timeout_seconds,
                                             _request_timeout=self._timeouts()):
                if self._stop.is_set():
                    return
                self._on_event(stream, event)
                backoff.reset()
        finally:
            stream.watch = None
        if not self._stop.is_set():
            self._progress(stream)  # the server ended the watch at its timeout: reachable and current

    def _on_event(self, stream: Stream, event: dict) -> None:
        obj = event.get("raw_object") or {}
        version = (obj.get("metadata") or {}).get("resourceVersion")
        if event.get("type") in ("ADDED", "MODIFIED"):
            self._apply(stream, stream.upsert, obj)
            stream.events += 1
        elif event.get("type") == "DELETED":
            self._apply(stream, stream.delete, obj)
            stream.events += 1
        if version:
            stream.resource_version = version
        self._progress(stream)

    def _apply(self, stream: Stream, change: Callable[[dict], None], obj: dict) -> None:
        """One index update. An object the index cannot read is logged and skipped: retrying
        would fail on it again and again, and stop every later event of its kind."""
        try:
            change(obj)
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            name = (obj.get("metadata") or {}).get("name", "?")
            log.warning("ignoring %s %s the index cannot read: %s", stream.kind[:-1], name, err)

    # ---- reservations ----------------------------------------------------------------------
    def _expire_loop(self) -> None:
        while not self._stop.wait(self.expire_interval_seconds):
            self.index.expire_reservations()

    def _release_loop(self) -> None:
        """Start gated waits once the view is whole: before that, the room a pass sees may be taken."""
        assert self.releaser is not None
        while not self._stop.wait(self.release_interval_seconds):
            if all(s.synced for s in self._streams):
                try:
                    self.releaser.run_once()
                except Exception:  # noqa: BLE001 - the next pass tries again; the webhook keeps serving
                    log.exception("the releaser's pass failed")
