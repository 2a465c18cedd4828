"""The API feed: Nodes and Pods (and the autoscalers' pools) from the Kubernetes API, kept current by
list+watch, fed into the cluster index (the live cluster view of docs/operations/replicas.md).

Names, so that "view" means one thing: the `ClusterIndex` is the state placement reads, a
constrained subset is the part of it one request may use (filters.py), and the `ApiFeed` is what
keeps an index current from the API. `ApiFeed` owns one `ClusterIndex` for its whole life and
feeds it event by event, so whoever holds `feed.index` (the admission path, through the placer)
always sees the same object, and reservations made in it survive reconnects and relists.

Per kind (nodes, pods) one daemon thread runs the reflector loop:

1. list all objects in pages (`limit`/`continue`) and apply them: upsert every listed object,
   then forget what the index counts that the list no longer has. The index is changed in
   place, never rebuilt, so reservations survive a relist. Remember the list's resourceVersion.
   The next page is fetched and decoded while this one is applied; a page is applied in one
   `ClusterIndex.batch()`; while any list is applied the cyclic collector is off (see
   `_CollectorPause`): so 100,000 nodes and 1M pods list in about half a minute on one core.
2. watch from that resourceVersion with bookmarks and a server-side timeout; apply every event
   and remember the newest resourceVersion (bookmarks included). When the watch ends at its
   timeout, watch again from there.
3. a watch that breaks, or a list or watch that fails, is retried from the last resourceVersion
   after a capped exponential backoff with jitter; `410 Gone` (an HTTP 410, or an ERROR event
   with code 410) means that resourceVersion is compacted away: relist (step 1) at once.

A third thread expires reservations whose time-to-live has passed. When replicas share their
claims (`claims_namespace`), a third stream lists and watches the claims Lease in that namespace
the same way and applies each version to the ledger (webhook/kube/shared_claims.py).

Objects are handled as the plain dicts the API sends (the shape `ClusterIndex` reads): watch
events are not turned into client model objects, which would cost far more than the index
update itself. Nothing happens at import time.
"""
from __future__ import annotations

import contextlib
import functools
import gc
import logging
import random
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterator

import orjson
from kubernetes import client as k8s_client
from kubernetes import watch as k8s_watch
from kubernetes.client.exceptions import ApiException

from ..settings.config import Config
from ..state import dra
from ..state.growth import CA_STATUS_NAME, CA_STATUS_NAMESPACE, NODEPOOL_GROUP, NODEPOOL_KIND, object_key
from ..state.index import ClusterIndex, out_of_the_collectors_way, pod_key
from .shared_claims import DEFAULT_BUDGET_SECONDS, LEASE_NAME, ApiClaims, describe
from .releaser import Releaser
from .scaleups import ApiScaleUps

log = logging.getLogger(__name__)

GONE = 410
FORBIDDEN = 403
NOT_FOUND = 404
GROWTH_STREAMS = ("nodepools", "autoscaler-status")
NODEPOOL_VERSION = "v1"
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


class _CollectorPause:
    """The cyclic collector off while any full list is applied. A list builds much of the index,
    and each collection on the way walks all of it: at 1M pods they took more of the sync than
    the pods' own accounting. When the last list in progress ends, what they left behind is
    collected once and the index frozen out of the collector's reach (it stays for good)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lists = 0
        self._was_enabled = True

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        with self._lock:
            if not self._lists:
                self._was_enabled = gc.isenabled()
                gc.disable()
            self._lists += 1
        try:
            yield
        finally:
            with self._lock:
                self._lists -= 1
                if not self._lists:
                    out_of_the_collectors_way()
                    if self._was_enabled:
                        gc.enable()


_collector_paused = _CollectorPause()


class Backoff:
    """Capped exponential backoff with jitter: delay n is uniform in [d/2, d], d = min(cap, base*2^n)."""

    def __init__(self, base: float = 0.5, cap: float = 30.0, rng: random.Random | None = None) -> None:
        self.base = base
        self.cap = cap
        self._rng = rng or random.Random()
        self._failures = 0

    def next_delay(self) -> float:
        ceiling = min(self.cap, self.base * 2 ** self._failures)
        self._failures += 1
        return ceiling / 2 + self._rng.uniform(0, ceiling / 2)

    def reset(self) -> None:
        self._failures = 0


@dataclass(frozen=True)
class StreamStatus:
    """One kind's list+watch state, for readiness, metrics and logs."""

    kind: str  # "nodes", "pods", "leases", "nodepools" or "autoscaler-status"
    synced: bool  # a full list has been applied at least once
    resource_version: str | None  # where the next watch starts; None means a relist is due
    seconds_since_progress: float | None  # None before the first successful list
    objects: int  # in the last full list
    events: int  # watch events applied (bookmarks excluded)
    lists: int  # full lists applied, the first one included
    failures: int  # lists or watches that ended in an error
    last_error: str | None


def _growth_streams(index: ClusterIndex, core: k8s_client.CoreV1Api,
                    custom: k8s_client.CustomObjectsApi) -> tuple[_Stream, ...]:
    """What autoscalers publish about how the cluster can grow (webhook/state/growth.py): Karpenter
    NodePools, and cluster-autoscaler's status ConfigMap (only that one, by name). Either may be
    missing: a cluster without that autoscaler."""
    nodepools = functools.partial(custom.list_cluster_custom_object, NODEPOOL_GROUP, NODEPOOL_VERSION, "nodepools")
    status = functools.partial(core.list_namespaced_config_map, CA_STATUS_NAMESPACE,
                               field_selector=f"metadata.name={CA_STATUS_NAME}")
    calls: tuple[tuple[str, Callable], ...] = ((NODEPOOL_KIND, nodepools), ("ConfigMap", status))
    return tuple(_Stream(kind, call, object_key, index.upsert_growth, index.delete_growth,
                         functools.partial(index.growth_keys, object_kind), index.forget_growth, optional=True)
                 for kind, (object_kind, call) in zip(GROWTH_STREAMS, calls))


class _DictWatch(k8s_watch.Watch):
    """`kubernetes.watch.Watch` yielding events as plain dicts, with ERROR handling intact.

    The stock `deserialize=False` path skips the `raw_object` key that the ERROR branch reads,
    so a 410 ERROR event would surface as KeyError; this keeps the event shape and skips only
    the model conversion.
    """

    def unmarshal_event(self, data: str, return_type: object) -> dict | None:  # noqa: ARG002 - objects stay dicts
        if not data or data.isspace():
            return None
        try:
            event = orjson.loads(data)
        except orjson.JSONDecodeError:
            return None
        event["raw_object"] = event.get("object")
        return event


class _Ahead(threading.Thread):
    """One call run on its own daemon thread, its answer (or its exception) read with result().
    A daemon, so that a feed stopped in the middle of a list leaves it to end with its request."""

    def __init__(self, call: Callable[[], dict], name: str) -> None:
        super().__init__(name=name, daemon=True)
        self._call = call
        self._answer: dict = {}
        self._error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            self._answer = self._call()
        except BaseException as err:  # noqa: BLE001 - raised again in the caller's thread by result()
            self._error = err

    def result(self) -> dict:
        self.join()
        if self._error is not None:
            raise self._error
        return self._answer


class _Stream:
    """List+watch of one kind into the index: how to read and change it, and how far it got."""

    def __init__(self, kind: str, list_call: Callable, key: Callable[[dict], str],
                 upsert: Callable[[dict], None], delete: Callable[[dict], None],
                 counted: Callable[[], set[str]], forget: Callable[[str], None], optional: bool = False) -> None:
        self.kind = kind
        # An API the cluster may not serve (or the chart's RBAC may not grant): its absence is an
        # empty list, checked again at each watch interval, never a readiness failure.
        self.optional = optional
        self.list_call = list_call
        self.key = key  # the key the index counts an object under
        self.upsert = upsert
        self.delete = delete
        # After a relist, whatever the index counts that the list did not have is forgotten.
        # The keys come from the index itself, so the view keeps no copy of 100k pods.
        self.counted = counted
        self.forget = forget
        self.resource_version: str | None = None
        self.synced = False
        self.last_progress: float | None = None
        self.listed = 0  # objects in the last full list
        self.events = 0
        self.lists = 0
        self.failures = 0
        self.last_error: str | None = None
        self.watch: _DictWatch | None = None


class ApiFeed:
    """Nodes and Pods from the API, applied incrementally to one `ClusterIndex`.

    `clock` is what `readiness()` measures time with, and the index's holds expire by.
    """

    def __init__(self, config: Config, api_client: k8s_client.ApiClient,
                 clock: Callable[[], float] = time.monotonic, *, backoff_base: float = 0.5,
                 backoff_cap: float = 30.0, rng: random.Random | None = None,
                 watch_timeout_seconds: int | None = None, page_size: int = LIST_PAGE_SIZE,
                 expire_interval_seconds: float = EXPIRE_INTERVAL_SECONDS, claims_namespace: str | None = None,
                 claims_budget_seconds: float = DEFAULT_BUDGET_SECONDS,
                 on_alone: Callable[[], None] = lambda: None,
                 on_scale_up: Callable[[str], None] = lambda _: None,
                 on_release: Callable[[str], None] = lambda _: None,
                 release_interval_seconds: float = RELEASE_INTERVAL_SECONDS) -> None:
        self.config = config
        self.clock = clock
        self.index = ClusterIndex(config, clock=clock)
        # The server ends each watch well inside the staleness limit, so a quiet but healthy
        # stream still shows progress (the clean end) before it would be called stale.
        self.watch_timeout_seconds = watch_timeout_seconds or max(1, min(300, int(config.stale_after_seconds / 3)))
        self.page_size = page_size
        self.expire_interval_seconds = expire_interval_seconds
        rng = rng or random.Random()
        self._backoff = {kind: Backoff(backoff_base, backoff_cap, random.Random(rng.random()))
                         for kind in ("nodes", "pods", "leases", *GROWTH_STREAMS,
                                      *(plural for plural, _, _ in DRA_LISTS))}
        core = k8s_client.CoreV1Api(api_client)
        index = self.index
        self._streams: tuple[_Stream, ...] = (
            _Stream("nodes", core.list_node, lambda node: (node.get("metadata") or {}).get("name", ""),
                    self._upsert_node, lambda node: self._delete_node(node["metadata"]["name"]),
                    lambda: set(index.nodes), self._delete_node),
            _Stream("pods", core.list_pod_for_all_namespaces, pod_key, index.upsert_pod, index.delete_pod,
                    index.counted_pods, lambda key: index.delete_pod({"metadata": {"uid": key}})),
        )
        self._streams += _growth_streams(index, core, k8s_client.CustomObjectsApi(api_client))
        if config.provisioning_request_class:
            index.scale_ups = ApiScaleUps(api_client, on_scale_up)
        if claims_namespace:
            claims = ApiClaims(index, api_client, claims_namespace, claims_budget_seconds, on_alone=on_alone)
            index.share_claims(claims)
            # Only the claims Lease: other Leases of the namespace (leader elections) are none of ours.
            leases = functools.partial(k8s_client.CoordinationV1Api(api_client).list_namespaced_lease,
                                       claims_namespace, field_selector=f"metadata.name={LEASE_NAME}")
            self._streams += (_Stream(
                "leases", leases, lambda lease: (lease.get("metadata") or {}).get("name", ""), claims.apply,
                claims.deleted, claims.names, claims.forget),)
        self._streams += dra_streams(api_client, index)
        # Gated waits are started by a pass after the cluster changed, at most once an interval.
        self.releaser = Releaser.over_api(index, api_client, on_release) if config.gate_waits else None
        self.release_interval_seconds = release_interval_seconds
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._levels_said: str | None = None

    def _upsert_node(self, node: dict) -> None:
        self.index.upsert_node(node)
        self._say_levels()

    def _delete_node(self, name: str) -> None:
        self.index.delete_node(name)
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
    def _run(self, stream: _Stream) -> None:
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

    def _failed(self, stream: _Stream, err: BaseException, backoff: Backoff) -> None:
        stream.failures += 1
        stream.last_error = describe(err)
        delay = backoff.next_delay()
        log.warning("%s list/watch failed (%s); retrying in %.1fs", stream.kind, stream.last_error, delay)
        self._stop.wait(delay)

    def _absent(self, stream: _Stream, err: ApiException) -> None:
        """An optional API is not served, or not granted: nothing of its kind is there. Said once
        in the log; the list is tried again after a watch interval."""
        why = "not served" if err.status == NOT_FOUND else "not granted by RBAC"
        if stream.last_error != why:
            log.info("%s: the API is %s (%s); the view goes on without them", stream.kind, why, err.status)
        with self.index.lock:
            for key in stream.counted():
                stream.forget(key)
        stream.last_error = why
        stream.resource_version = None
        stream.listed = 0
        stream.synced = True
        self._progress(stream)
        self._stop.wait(self.watch_timeout_seconds)

    def _progress(self, stream: _Stream) -> None:
        stream.last_progress = self.clock()

    def _timeouts(self) -> tuple[float, float]:
        return CONNECT_TIMEOUT_SECONDS, self.watch_timeout_seconds + READ_GRACE_SECONDS

    def _pages(self, stream: _Stream) -> Iterator[tuple[str | None, list[dict]]]:
        """(resourceVersion, items) per page of one consistent list. Each next page is asked for
        and decoded on its own thread while the caller applies this one: the server's time and
        the wire's overlap the index's, rather than adding to it."""
        def page(token: str | None) -> dict:
            response = stream.list_call(limit=self.page_size, _continue=token, _preload_content=False,
                                        _request_timeout=self._timeouts())
            return orjson.loads(response.data)

        ahead = _Ahead(functools.partial(page, None), f"clusterview-{stream.kind}-page")
        while True:
            body = ahead.result()
            metadata = body.get("metadata") or {}
            token = metadata.get("continue")
            if token and not self._stop.is_set():
                ahead = _Ahead(functools.partial(page, token), f"clusterview-{stream.kind}-page")
            yield metadata.get("resourceVersion"), body.get("items") or []
            if not token or self._stop.is_set():
                return

    def _relist(self, stream: _Stream) -> None:
        """Apply a full list: upsert everything listed, forget what the list no longer has."""
        seen: set[str] = set()
        resource_version = None
        with _collector_paused():
            for resource_version, items in self._pages(stream):
                with self.index.batch():
                    for obj in items:
                        self._apply(stream, stream.upsert, obj)
                        seen.add(stream.key(obj))
        if self._stop.is_set():
            return
        with self.index.lock:
            for key in stream.counted() - seen:
                stream.forget(key)
        stream.listed = len(seen)
        stream.resource_version = resource_version
        stream.lists += 1
        stream.synced = True
        stream.last_error = None
        self._progress(stream)
        log.info("%s: listed %d at resourceVersion %s", stream.kind, len(seen), resource_version)
        if stream.kind == "resourceslices":
            for warning in self.index.inventory_warnings():
                log.warning("%s", warning)

    def _watch(self, stream: _Stream, backoff: Backoff) -> None:
        """One watch call from the last resourceVersion until the server ends it."""
        stream.watch = _DictWatch(return_type=dict)  # objects stay dicts: no model lookup by name
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

    def _on_event(self, stream: _Stream, event: dict) -> None:
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

    def _apply(self, stream: _Stream, change: Callable[[dict], None], obj: dict) -> None:
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


# ----- Dynamic Resource Allocation and PodGroups ------------------------------------------------------

# The scheduling.k8s.io versions that serve PodGroups, newest first: v1beta1 from Kubernetes 1.37,
# v1alpha2 in 1.36 only. What we read of them (gang minCount, annotations, resourceClaims) is the same in both.
POD_GROUP_VERSIONS = ("v1beta1", "v1alpha2")


class _FirstServed:
    """The list call of a kind that one of several API versions serves: each list (its first page)
    asks the versions in order until one is served (a 404 means not served), so a cluster
    upgraded in place moves on at its next relist; the list's further pages and the watch after
    it ask the version that list found. Not served by any: the last 404, as for any optional kind."""

    def __init__(self, calls: tuple[Callable, ...]) -> None:
        self.calls = calls
        self.served = 0  # index in `calls` of the version the last list found

    def __call__(self, **kwargs: object) -> object:
        if kwargs.get("watch") or kwargs.get("_continue"):
            return self.calls[self.served](**kwargs)
        for at, call in enumerate(self.calls[:-1]):
            try:
                response = call(**kwargs)
            except ApiException as err:
                if err.status != NOT_FOUND:
                    raise
                continue
            self.served = at
            return response
        self.served = len(self.calls) - 1
        return self.calls[-1](**kwargs)


def _pod_group_lists(api: k8s_client.ApiClient) -> _FirstServed:
    custom = k8s_client.CustomObjectsApi(api)
    return _FirstServed(tuple(functools.partial(custom.list_cluster_custom_object, dra.SCHEDULING_GROUP, version,
                                                "podgroups") for version in POD_GROUP_VERSIONS))


# (stream name, the kind, the API's list-for-all-namespaces call) per kind the inventory reads
# (state/dra.py); NVIDIA's ComputeDomains name their channel templates before these exist
DRA_LISTS = (
    ("resourceslices", "ResourceSlice", lambda api: k8s_client.ResourceV1Api(api).list_resource_slice),
    ("deviceclasses", "DeviceClass", lambda api: k8s_client.ResourceV1Api(api).list_device_class),
    ("resourceclaims", "ResourceClaim",
     lambda api: k8s_client.ResourceV1Api(api).list_resource_claim_for_all_namespaces),
    ("resourceclaimtemplates", "ResourceClaimTemplate",
     lambda api: k8s_client.ResourceV1Api(api).list_resource_claim_template_for_all_namespaces),
    ("podgroups", "PodGroup", _pod_group_lists),
    ("computedomains", "ComputeDomain", lambda api: functools.partial(
        k8s_client.CustomObjectsApi(api).list_cluster_custom_object, "resource.nvidia.com", "v1beta1", "computedomains")),
)


def dra_streams(api_client: k8s_client.ApiClient, index: ClusterIndex) -> tuple[_Stream, ...]:
    """List+watch of every DRA kind and PodGroups, each optional (an API the cluster does not
    serve has none). List items carry no kind, so each stream names its own."""
    def stream(plural: str, kind: str, list_call: Callable) -> _Stream:
        def forget(key: str) -> None:
            namespace, _, name = key.rpartition("/")
            index.put_dra(kind, {"metadata": {"name": name, "namespace": namespace or None}}, present=False)
        return _Stream(plural, list_call, dra.object_key, lambda obj: index.put_dra(kind, obj, present=True),
                       lambda obj: index.put_dra(kind, obj, present=False), lambda: index.dra_keys(kind),
                       forget, optional=True)
    return tuple(stream(plural, kind, make(api_client)) for plural, kind, make in DRA_LISTS)
