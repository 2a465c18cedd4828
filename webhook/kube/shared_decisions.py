"""Every replica's recent decisions on every replica's topology page: one Lease per replica, in
the claims namespace, holding that replica's newest decisions, written by it alone and read by
all through a watch (the view's `decision-records` stream).

Why this record, of the ones replicas could share:
- **No write on the admission path.** An admission records its decision in memory
  (serving/page/decisions.py), as before; a thread of this replica writes the record at most once
  every WRITE_SECONDS, and only when something was decided since. Whatever the admission rate, a
  replica makes at most one Lease update each 2 s, and none while idle; an Event per decision, or
  the decision in the claims Lease, would be an apiserver write per admission (a claims write costs
  a placed admission about 9 ms: docs/design/ledger-and-claims.md), an Event a new etcd object
  each, the claims Lease a compare-and-swap contended by every replica's placements.
- **No conflicts.** Each replica writes only its own Lease, so no write waits on another's.
- **Bounded.** The record is the replica's last 500 decisions, compressed (encode_record), at
  most RECORD_BYTES: a few tens of KB, watched by every replica, read by nobody else's cost.
- **Who reads it.** The Leases live beside the claims Lease, which already names every workload
  held: whoever may read Leases there (the release's operators) reads the decisions too. Readers
  of the page see only what access.py lets them, as before, since each replica filters the merged
  list for the reader.

A record outlives its replica's restarts (the replica takes its decisions back when it starts),
and goes with its pod: the Lease is owned by the replica's Pod (POD_NAME and POD_UID, from the
chart's downward API), so the garbage collector deletes it when the Pod is deleted.
"""
from __future__ import annotations

import copy
import datetime
import json
import logging
import re
import threading
from typing import Any

from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException

from ..admission.recent import RecentDecisions, RecordedDecision, decode_record, encode_record
from .shared_claims import describe

log = logging.getLogger(__name__)

RECORD_ANNOTATION = "topology.scheduler/decisions"
RECORD_LABEL = "topology.scheduler/record"  # = "decisions" on every replica's record, what the watch selects
RECORD_KIND = "decisions"
NAME_PREFIX = "topology-webhook-decisions-"
WRITE_SECONDS = 2.0
RECORD_BYTES = 128 * 1024  # half the 256 KiB the apiserver allows an object's annotations
API_SECONDS = 5
_NOT_IN_A_NAME = re.compile(r"[^a-z0-9.-]+")


def record_name(replica: str) -> str:
    """The Lease of `replica`'s record: a DNS subdomain made of its name."""
    tail = _NOT_IN_A_NAME.sub("-", replica.lower()).strip(".-")[:253 - len(NAME_PREFIX)].strip(".-")
    return NAME_PREFIX + (tail or "replica")


class ApiDecisionRecords:
    """This replica's record written from `decisions`, and the other replicas' records read into
    it (RecentDecisions.share). `owner`: the ownerReference of the Pod this replica runs in, when
    the record is in that Pod's namespace."""

    def __init__(self, decisions: RecentDecisions, api_client: k8s_client.ApiClient, namespace: str,
                 owner: dict | None = None, write_seconds: float = WRITE_SECONDS) -> None:
        self.decisions = decisions
        self.namespace = namespace
        self.name = record_name(decisions.replica)
        self.owner = owner
        self.write_seconds = write_seconds
        # A client of its own, without urllib3's retries: a write that times out is tried at the next turn.
        configuration = copy.deepcopy(api_client.configuration)
        configuration.retries = False
        # Raw JSON both ways (dict bodies, _preload_content=False), which the client's hints do not describe.
        self.api: Any = k8s_client.CoordinationV1Api(k8s_client.ApiClient(configuration))
        self._lock = threading.Lock()
        self._others: dict[str, tuple[RecordedDecision, ...]] = {}  # Lease name -> the decisions it holds
        self._version: str | None = None  # the resourceVersion of this replica's record, once known
        self._written = 0  # decisions.changes at the last write
        self._failing = False  # the last write failed (said once in the log until one succeeds)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        decisions.share(self.others)

    # ---- reading: the stream's callbacks (kinds.decisions_stream) -----------------------------
    def upsert(self, lease: dict) -> None:
        meta = lease.get("metadata") or {}
        name = str(meta.get("name") or "")
        if name == self.name or (meta.get("labels") or {}).get(RECORD_LABEL) != RECORD_KIND:
            return  # this replica's own decisions are read from its memory; other Leases are not records
        replica = str((lease.get("spec") or {}).get("holderIdentity") or name)
        try:
            entries = tuple(decode_record(str((meta.get("annotations") or {}).get(RECORD_ANNOTATION) or ""), replica))
        except ValueError as err:
            log.warning("decisions: Lease %s/%s: %s; its decisions are not shown", self.namespace, name, err)
            entries = ()
        with self._lock:
            self._others[name] = entries

    def deleted(self, lease: dict) -> None:
        self.forget(str((lease.get("metadata") or {}).get("name") or ""))

    def forget(self, name: str) -> None:
        with self._lock:
            self._others.pop(name, None)

    def names(self) -> set[str]:
        with self._lock:
            return set(self._others)

    def others(self) -> list[RecordedDecision]:
        """The other replicas' decisions, as their records were last seen."""
        with self._lock:
            return [entry for entries in self._others.values() for entry in entries]

    # ---- writing ---------------------------------------------------------------------------
    def start(self) -> None:
        """Keep the record written, on a thread of its own, until `stop`."""
        self._stop.clear()
        self._thread = threading.Thread(target=self.keep_written, args=(self._stop,), name="decisions-record",
                                        daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 2 * API_SECONDS) -> None:
        """Write what was decided since the last write, and stop."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def keep_written(self, stop: threading.Event) -> None:
        """Take back this replica's record, then write it every `write_seconds` while it changes,
        and once more when stopped (a graceful shutdown loses no decision)."""
        self.read_own()
        while not stop.wait(self.write_seconds):
            self.write()
        self.write()

    def read_own(self) -> None:
        """This replica's record as it was before a restart: its decisions taken back."""
        try:
            lease = json.loads(self.api.read_namespaced_lease(self.name, self.namespace, _preload_content=False,
                                                              _request_timeout=API_SECONDS).data)
        except Exception as err:  # noqa: BLE001 - none yet (404), or the API unreachable: the first write tries again
            if not (isinstance(err, ApiException) and err.status == 404):
                log.warning("decisions: cannot read Lease %s/%s (%s); writing it anew", self.namespace, self.name,
                            describe(err))
            return
        self._version = (lease.get("metadata") or {}).get("resourceVersion")
        text = ((lease.get("metadata") or {}).get("annotations") or {}).get(RECORD_ANNOTATION)
        try:
            self.decisions.adopt(decode_record(text, self.decisions.replica) if text else [])
        except ValueError as err:
            log.warning("decisions: Lease %s/%s: %s; starting a new record", self.namespace, self.name, err)

    def write(self) -> bool:
        """Write the record if anything was decided since the last write; whether it was written.
        A 409 (the record changed under us: another process of this replica's name) or a 404 (it
        was deleted) is answered by reading or creating it at the next turn."""
        changes = self.decisions.changes
        if changes == self._written:
            return False
        text, kept = encode_record(self.decisions.own(), RECORD_BYTES)
        body = self.body(text)
        try:
            if self._version is None:
                answer = self.api.create_namespaced_lease(self.namespace, body, _preload_content=False,
                                                          _request_timeout=API_SECONDS)
            else:
                body["metadata"]["resourceVersion"] = self._version
                answer = self.api.replace_namespaced_lease(self.name, self.namespace, body, _preload_content=False,
                                                           _request_timeout=API_SECONDS)
        except Exception as err:  # noqa: BLE001 - the page is best effort: the next turn tries again
            status = err.status if isinstance(err, ApiException) else None
            if status == 409:
                self._reread()
            elif status == 404:
                self._version = None
            if not self._failing:
                log.warning("decisions: cannot write Lease %s/%s (%s); other replicas' pages miss this one's "
                            "newest decisions until a write succeeds", self.namespace, self.name, describe(err))
            self._failing = True
            return False
        self._version = (json.loads(answer.data).get("metadata") or {}).get("resourceVersion")
        self._written = changes
        if self._failing:
            log.info("decisions: Lease %s/%s written again (%d decisions)", self.namespace, self.name, kept)
        self._failing = False
        return True

    def _reread(self) -> None:
        """Learn the record's resourceVersion after a conflict, keeping this replica's decisions."""
        try:
            lease = json.loads(self.api.read_namespaced_lease(self.name, self.namespace, _preload_content=False,
                                                              _request_timeout=API_SECONDS).data)
            self._version = (lease.get("metadata") or {}).get("resourceVersion")
        except Exception:  # noqa: BLE001 - the next write finds out again
            self._version = None

    def body(self, text: str) -> dict:
        now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        metadata: dict = {"name": self.name, "namespace": self.namespace,
                          "labels": {"app.kubernetes.io/managed-by": "topology-webhook", RECORD_LABEL: RECORD_KIND},
                          "annotations": {RECORD_ANNOTATION: text}}
        if self.owner is not None:
            metadata["ownerReferences"] = [self.owner]
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata,
                "spec": {"holderIdentity": self.decisions.replica, "renewTime": now}}
