"""Claims shared by replicas through the Kubernetes API: one Lease, written with compare-and-swap.

Between admitting a workload and its controller creating pods, the only record of its GPUs is
the hold in the replica that placed it. To make every replica count it, the placing replica
writes it into one `coordination.k8s.io/v1` Lease in the release namespace (annotation
`topology.scheduler/claims`: reservation key -> node -> GPU sets, and when the claim lapses),
replacing the Lease at the resourceVersion its decision was made against. A 409 means another
replica wrote first: read the Lease, decide again. Every replica watches the Lease (the view's
third stream), so reading it costs nothing on the admission path, and applies each new version
to its ledger: a claim it has not seen becomes a hold (for what is left of its time), a claim it
had seen that is gone is released (deleted through another replica, or done there).

A writer keeps the claims of the version it replaces, less those its own ledger no longer holds
(pods bound, expired, released): so the Lease carries only what is still in the gap, and at most
one write per placed workload is all it costs. Pods carry the placement afterwards (holds from the
pod watch), so a claim need not outlive its pods' creation by much.

A replica that places claims GPUs ahead for its own next placements, its allotment (allotment.py),
so that most of its placements need no write before their answer.

Why one Lease for every claim, not one per workload or per domain: a compare-and-swap on one
object is what makes "no two claims share a GPU" hold with one write; one Lease per workload
excludes nothing, and one per domain needs several writes for a workload that spans domains.
The price: claims are serialized through one object (one apiserver write each), and the
annotation limit (256 KiB) bounds the claims pending at once to about two thousand.
"""
from __future__ import annotations

import copy
import logging
import os
import secrets
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import orjson
from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException

from ..core.model import PlacementRequest
from ..placement.placer import CONFLICT
from ..state.index import ClusterIndex
from ..state.ports import Allotted
from .allotment import FLUSH_SECONDS, WANT_PREFIX, Allotment, asking_back, claim_of_hold, lapses, made
from .claims_text import LEASE_NAME, lease_body, read_claims, sets_of

log = logging.getLogger(__name__)

DEFAULT_BUDGET_SECONDS = 2.0


def describe(err: BaseException) -> str:
    """One line for people: the API's status and reason, or the connection failure."""
    if isinstance(err, ApiException):
        return f"HTTP {err.status} {str(err.reason or '').strip()}".strip()
    cause = getattr(err, "reason", None)  # urllib3's MaxRetryError wraps the failure that counts
    if isinstance(cause, BaseException):
        err = cause
    first = str(err.args[0]) if err.args else ""
    return f"{type(err).__name__}: {first}" if first else type(err).__name__


def _hold(index: ClusterIndex, allotment: Allotment, applied: dict[str, dict], claims: dict[str, dict],
          now: float) -> None:
    """Make the ledger hold `claims` where it held `applied` (under the index lock): a claim new
    or changed is held for the time it has left, one renewed with the same sets only lasts longer
    (no node to count again), one gone is released. A claim unchanged is the object applied
    (read_claims), so most of a version costs a lookup each."""
    for key, claim in claims.items():
        before = applied.get(key)
        if before is claim or key in allotment.spent:
            continue  # unchanged, or placed here since this version was written (the hold here is newer)
        until = lapses(key, claim, allotment.seconds)
        if before == claim or until <= now:
            continue
        sets, stamp = sets_of(claim), claim.get("stamp")
        if (before is None or before["sets"] != claim["sets"] or before.get("stamp") != stamp
                or not index.renew(key, sets, until - now)):
            index.reserve(key, sets, ttl=until - now, stamp=stamp)
    for key in applied.keys() - claims.keys():
        index.release(key)


_WAITING = "waiting"


@dataclass(eq=False)
class _Pending:
    """A claim decided against version `basis`, waiting for a write; `result` as `claim` answers."""

    key: str
    basis: int
    result: str | None = _WAITING


class ApiClaims:
    """This replica's side of the shared claims, over one index.

    One thread of this replica writes at a time (its writes would otherwise conflict with each
    other); what was last applied is read and changed under the index's lock.
    """

    def __init__(self, index: ClusterIndex, api_client: k8s_client.ApiClient, namespace: str,
                 budget_seconds: float = DEFAULT_BUDGET_SECONDS, wall: Callable[[], float] = time.time,
                 on_alone: Callable[[], None] = lambda: None, allotment_share: int = 0) -> None:
        self.index = index
        # A client of its own: no retries (urllib3 would repeat a timed-out PUT three times, past
        # the budget) and no waiting behind the watches for a pooled connection.
        configuration = copy.deepcopy(api_client.configuration)
        configuration.retries = False
        # Raw JSON both ways (dict bodies, _preload_content=False), which the client's hints do not describe.
        self.api: Any = k8s_client.CoordinationV1Api(k8s_client.ApiClient(configuration))
        self.namespace = namespace
        self.budget_seconds = budget_seconds
        # A token of its own: a container restarted in its pod has the same host name and pid 1,
        # and must not take its predecessor's allotment for its own (placements in it may be unwritten).
        self.identity = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        self.wall = wall
        self.on_alone = on_alone
        self._cond = threading.Condition()  # guards the queue and the writer's turn
        self._queue: list[_Pending] = []  # claims decided, waiting for the next write
        self._writing = False
        self._lease: dict | None = None  # the newest version applied; None while there is none
        self._version = 0  # its resourceVersion
        # Versions since the last one another replica wrote: only this replica's writes followed
        # them, so a decision made against any of them is still valid.
        self._own_since: set[int] = {0}
        self._applied: dict[str, dict] = {}  # claims of that version, as applied to the ledger
        self.allotment = Allotment(index, self.identity, budget_seconds, wall, allotment_share)
        self._lease_seconds = int(index.hold_seconds())  # what the Lease says a holder lasts

    # ---- what the placer calls (state/ports.SharedClaims) -------------------------------------
    def alone(self, what: str, why: str) -> str:
        self.on_alone()
        log.warning("claims: %s decided alone: not agreed with other replicas within %.1fs (%s)", what,
                    self.budget_seconds, why)
        return (f"topology-webhook: {what} decided without the other replicas ({why} within "
                f"{self.budget_seconds:g}s); another replica may place work on the same GPUs")

    # ---- reading: watch events, own writes, reads after a conflict ---------------------------
    def apply(self, lease: dict | None, version: str | None = None, own: bool = False) -> None:
        """Make the ledger agree with a version of the Lease (None: deleted at `version`); versions
        older than one applied are ignored (a watch event behind our write). `own`, or this replica
        its holder: its write made it on the version applied here, so only its claims changed (the
        watch may bring it first). resourceVersions are compared as numbers: etcd's are integers."""
        meta = (lease or {}).get("metadata") or {}
        if lease is not None and meta.get("name") != LEASE_NAME:
            return
        own = own or ((lease or {}).get("spec") or {}).get("holderIdentity") == self.identity
        number = int(version or meta.get("resourceVersion") or 0)
        if number and number <= self._version:
            return  # read again under the lock below; this spares parsing a version already applied
        claims = read_claims(lease, self._applied)
        # One batch: a node several changed claims hold (the other replica's allotment, its
        # placements in it) is recounted once, at the end, under the same lock.
        with self.index.batch():
            if number and number <= self._version:
                return
            self._version = number or self._version
            self._own_since = self._own_since | {self._version} if own and len(self._own_since) < 64 else {self._version}
            self._lease = lease
            now = self.wall()
            self.allotment.applied(claims.pop(self.allotment.key, None),  # not held here: taken from
                                   claims.get(WANT_PREFIX + self.allotment.key))
            _hold(self.index, self.allotment, self._applied, claims, now)
            self._applied = claims

    def deleted(self, lease: dict) -> None:
        """A watch's DELETED event."""
        meta = lease.get("metadata") or {}
        if meta.get("name") == LEASE_NAME:
            self.apply(None, meta.get("resourceVersion"))

    def forget(self, _name: str = LEASE_NAME) -> None:
        """The Lease is gone (a relist without it)."""
        self.apply(None)

    def names(self) -> set[str]:
        return {LEASE_NAME} if self._lease is not None else set()

    def basis(self) -> int:
        """The version a decision is made against (read under the index lock)."""
        return self._version

    def allotted(self, spreading: bool = False) -> Allotted | None:
        return self.allotment.allotted(spreading)

    def spend(self, key: str) -> bool:
        """Whether `key`'s new hold (under the index lock) is taken from this replica's allotment."""
        return self.allotment.spend(key)

    def ask_back(self, deadline: float, request: PlacementRequest) -> bool:
        """`request` was decided a wait for room while other replicas' allotments hold GPUs, maybe the
        room it lacks: ask for them back, and wait until `deadline` for them to go. True once none
        is held (decide again); False when none was, when not even they and the free GPUs it may
        use could hold it, when the ask cannot be written, or at the deadline."""
        first = True
        while time.monotonic() < deadline:
            with self.index.locked():
                held, asked = asking_back(self._applied, self.allotment.key, self.allotment.seconds, self.wall(),
                                          deadline - time.monotonic())
                if not held or (first and request.total_gpus > self.index.free_gpus_for(request) + held):
                    return not first and not held
            first = False
            if asked and self._take_turn(deadline):
                try:
                    with self.index.locked():  # another admission here may have asked meanwhile
                        _, asked = asking_back(self._applied, self.allotment.key, self.allotment.seconds,
                                               self.wall(), deadline - time.monotonic())
                    if asked and self._write_batch([], deadline, asked=asked) not in (None, CONFLICT):
                        return False  # the ask cannot be written: answer the wait
                finally:
                    self._end_turn()
            time.sleep(0.02)  # their replicas give them back within a flush
        return False

    def keep_allotment(self, stop: threading.Event) -> None:
        """The thread that writes placements taken from the allotment as claims, within
        FLUSH_SECONDS of the first, renews the allotment at half its time while it is used, and
        gives it back when it is not, and when `stop` is set (a replica shut down gracefully
        leaves no GPUs held for its allotment's time)."""
        while not stop.is_set():
            if self.allotment.wake.wait(0.2):  # and at least 5 times a second: its time, and `stop`
                stop.wait(FLUSH_SECONDS)  # the placements of a burst go in one write
                self.allotment.wake.clear()
            with self.index.locked():
                due = self.allotment.due()
            if due and not stop.is_set():
                self._flush(keep=True)
        with self.index.locked():
            held = bool(self.allotment.gpus or self.allotment.spent)
        if held:
            self._flush(keep=False)

    def _flush(self, keep: bool) -> None:
        """Write the placements taken from the allotment, and the allotment renewed (`keep`) or
        given back, deciding again after each 409 within the claims' time budget; say which
        placements are left with nothing to cover them."""
        deadline = time.monotonic() + self.budget_seconds
        while self._take_turn(deadline):
            try:
                problem = self._write_batch([], deadline, keep)
            finally:
                self._end_turn()
            if problem != CONFLICT or time.monotonic() >= deadline:
                break
        with self.index.locked():
            lapsed = self.allotment.lapsed()
        for key in lapsed:
            self.alone(f"the placement of {key}", "not written before its allotment lapsed")

    def _refresh(self, deadline: float) -> None:
        """Read the Lease now (after a 409: the watch may not have brought the winner's write yet)."""
        try:
            response = self.api.read_namespaced_lease(LEASE_NAME, self.namespace, _preload_content=False,
                                                      _request_timeout=max(0.05, deadline - time.monotonic()))
            self.apply(orjson.loads(response.data))
        except Exception as err:  # noqa: BLE001 - transport failures too: the caller's deadline decides
            if isinstance(err, ApiException) and err.status == 404:
                self.apply(None)  # deleted meanwhile: the next write creates it
            else:
                log.warning("claims: reading lease %s/%s failed (%s)", self.namespace, LEASE_NAME, describe(err))

    # ---- writing -----------------------------------------------------------------------------
    def claim(self, key: str, basis: int, deadline: float) -> str | None:
        """Share the ledger's hold of `key`, decided at version `basis`. None when written;
        CONFLICT when another replica wrote first (the Lease is read again: decide again);
        otherwise why it could not be written.

        Claims of this replica are written in batches: while one write is in flight, the claims
        decided meanwhile wait, and the next write carries them all (each still one write at
        most). Decisions made against a version that only this replica's own writes followed
        saw those writes' holds already, so they stay valid."""
        pending = _Pending(key, basis)
        with self._cond:
            self._queue.append(pending)
        while pending.result is _WAITING:
            if not self._take_turn(deadline):
                with self._cond:
                    if pending in self._queue:
                        self._queue.remove(pending)
                return "no time left" if pending.result is _WAITING else pending.result
            try:
                if pending.result is _WAITING:
                    with self._cond:
                        batch, self._queue = self._queue, []
                    self._write_batch(batch, deadline)
            finally:
                self._end_turn()
        return pending.result

    def unclaim(self, key: str, deadline: float) -> str | None:
        """Take `key`'s claim out of the Lease (its workload was deleted here), retrying on 409
        until `deadline`. None when done or when there was nothing to take out."""
        while True:
            if not self._take_turn(deadline):
                return "no time left"
            try:
                with self.index.locked():
                    if self.index.hold(key) is None:  # not placed again meanwhile
                        self.allotment.spent.pop(key, None)
                    if key not in self._applied:
                        return None
                    claims = self._kept()
                    spent = self.allotment.compose(claims, None)
                    claims.pop(key, None)
                    body = lease_body(claims, self.namespace, self.identity, self._lease, self._lease_seconds)
                problem = self._write(body, deadline)
                with self.index.locked():
                    self.allotment.written(spent, made(problem))
            finally:
                self._end_turn()
            if problem != CONFLICT or time.monotonic() >= deadline:
                return problem

    def _take_turn(self, deadline: float) -> bool:
        """Become this replica's one writer, waiting until `deadline` at most."""
        with self._cond:
            if not self._cond.wait_for(lambda: not self._writing, max(0.0, deadline - time.monotonic())):
                return False
            self._writing = True
            return True

    def _end_turn(self) -> None:
        with self._cond:
            self._writing = False
            self._cond.notify_all()

    def _write_batch(self, batch: list["_Pending"], deadline: float, keep: bool = True,
                     asked: dict[str, dict] | None = None) -> str | None:
        """One write for every claim of `batch` decided against what is current, with the placements
        taken from the allotment so far and the allotment renewed (`keep`) or given back (an empty
        batch writes those alone), and others' allotments `asked` back. What `_write` answers."""
        with self.index.locked():
            current = []
            for pending in batch:
                if pending.basis in self._own_since:
                    current.append(pending)
                else:
                    pending.result = CONFLICT  # another replica's claims arrived after it was decided
            if batch and not current:
                return CONFLICT
            claims = {**self._kept(), **(asked or {})}
            near = None
            for pending in current:
                hold = self.index.hold(pending.key)
                if hold is not None:
                    claims[pending.key] = claim_of_hold(hold, self.index, self.wall())
                    near = next(iter(hold.sets), near)
            if near is not None:
                self.allotment.touch()  # an allotment taken around a placement starts its idle time afresh
            spent = self.allotment.compose(claims, near, keep)
            body = lease_body(claims, self.namespace, self.identity, self._lease, self._lease_seconds)
        problem = self._write(body, deadline)
        with self.index.locked():
            self.allotment.written(spent, made(problem))
        for pending in current:
            pending.result = problem
        return problem

    def _kept(self) -> dict[str, dict]:
        """The applied claims this ledger still holds, and allotments asked back, whose time has not run out."""
        now = self.wall()
        return {key: claim for key, claim in self._applied.items()
                if (self.index.hold(key) is not None or key.startswith(WANT_PREFIX))
                and lapses(key, claim, self.allotment.seconds) > now}

    def _write(self, body: dict, deadline: float) -> str | None:
        left = deadline - time.monotonic()
        if left <= 0:
            return "no time left"
        try:
            if "resourceVersion" in body["metadata"]:
                response = self.api.replace_namespaced_lease(LEASE_NAME, self.namespace, body,
                                                             _preload_content=False, _request_timeout=left)
            else:
                response = self.api.create_namespaced_lease(self.namespace, body, _preload_content=False,
                                                            _request_timeout=left)
        except ApiException as err:
            if err.status == 409:
                self._refresh(deadline)
                return CONFLICT
            return describe(err)
        except Exception as err:  # noqa: BLE001 - timeouts and refused connections: decide alone
            log.warning("claims: writing lease %s/%s failed (%s)", self.namespace, LEASE_NAME, describe(err))
            return describe(err).partition(":")[0]  # the failure's kind: users need no addresses
        self.apply(orjson.loads(response.data), own=True)
        return None
