"""The machinery of one list+watch stream, whatever its kind: the `Stream` itself (how to read and
change its kind in the index, and how far it got), the watch that yields plain dicts, the page
fetched ahead of the one applied, the backoff between failures, the status callers read, and the
cyclic collector paused while lists are applied. The loops that drive streams are the `ApiFeed`'s
(webhook/kube/clusterview.py); which streams there are, per kind, is webhook/kube/kind_streams.py.
Nothing happens at import time.
"""
from __future__ import annotations

import contextlib
import gc
import random
import threading
from dataclasses import dataclass
from typing import Callable, Iterator

import orjson
from kubernetes import watch as k8s_watch

from ..state.index import out_of_the_collectors_way

GONE = 410
FORBIDDEN = 403
NOT_FOUND = 404


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


collector_paused = _CollectorPause()


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



class DictWatch(k8s_watch.Watch):
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


class Ahead(threading.Thread):
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


class Stream:
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
        self.watch: DictWatch | None = None

