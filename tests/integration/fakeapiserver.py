"""A small local stand-in for kube-apiserver's list and watch protocol, for tests and benchmarks.

It serves GET /api/v1/nodes and GET /api/v1/pods (all namespaces), coordination.k8s.io/v1
Leases in a namespace (list, watch, get, create, update, delete), Secrets in a namespace (get,
create, update) and admissionregistration.k8s.io/v1 MutatingWebhookConfigurations (get, JSON
patch); with `serve_nodepools`, karpenter.sh/v1 NodePools (list, watch); PodTemplates and, with
`serve_provisioning_requests`, autoscaling.x-k8s.io/v1 ProvisioningRequests in a namespace (get,
create, delete), and TokenReviews and SubjectAccessReviews (create, answered from `tokens` and
`grants`), the way the real server does, so the real `kubernetes` client can be pointed at it with
`Configuration(host=server.url)`:

- lists: `{"kind": "NodeList", "metadata": {"resourceVersion": RV, "continue": ...}, "items": [...]}`
  with `limit`/`continue` paging over a consistent snapshot; an unknown or compacted continue
  token is HTTP 410 `Expired`, as on the real server. A kind's sorted list is kept until the
  next write (`prepare_lists()` makes it ahead), as the apiserver serves lists from its cache.
- watches (`?watch=1`): a chunked stream of `{"type": ADDED|MODIFIED|DELETED|BOOKMARK|ERROR,
  "object": ...}` lines starting after `resourceVersion` (or with synthetic ADDED events for
  everything when none is given), BOOKMARKs every `bookmark_interval` seconds when
  `allowWatchBookmarks=true`, a clean end after `timeoutSeconds`, and for a resourceVersion older
  than the last compaction an ERROR event with code 410 (or an HTTP 410 when `gone_as_status`).
- Lease writes with optimistic concurrency: create of an existing name is 409 `AlreadyExists`;
  an update whose `metadata.resourceVersion` is not the stored one is 409 `Conflict`; a missing
  name is 404 `NotFound`. Secrets are written the same way.
- JSON patches (`application/json-patch+json`): a failing `test` operation or a path that does
  not exist is 422 `Invalid`, as the apiserver answers; other patch types are 415. A pod's spec
  changes only as the apiserver lets it (KEP-3838): while it has scheduling gates, gates may be
  removed, nodeSelector entries added and expressions added to its required node affinity's
  terms (or terms set where it had none); anything else is 422 `Invalid`.
- `forbidden`: resources ("secrets", "mutatingwebhookconfigurations") whose every request is 403
  `Forbidden` with the apiserver's RBAC wording, as for a service account without the Role.

One resourceVersion counter is shared by all kinds, as etcd's revision is. Faults are attributes
and methods: `delay_seconds` (slow responses), `refuse_until` (close every connection unanswered
until that `time.monotonic()`), `answer_status` (an HTTP error for every request, e.g. 403),
`break_watches()` (cut every open stream in the middle of an event), `compact()` (forget history
and paging snapshots, so older resourceVersions and continue tokens get 410),
`hold_watches()`/`release_watches()` (queue events, then send the backlog at once), and for
writes only `write_delay_seconds` (a slow apiserver) and `refuse_writes` (hang up on every write).

Everything binds to 127.0.0.1. Objects are stored with their JSON, so big lists are cheap to serve.
"""
from __future__ import annotations

import base64
import bisect
import copy
import json
import re
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import jsonpatch

KINDS = {"nodes": "Node", "pods": "Pod", "leases": "Lease", "secrets": "Secret",
         "mutatingwebhookconfigurations": "MutatingWebhookConfiguration", "nodepools": "NodePool",
         "podtemplates": "PodTemplate", "provisioningrequests": "ProvisioningRequest", "jobs": "Job",
         "events": "Event"}
API_VERSIONS = {"nodes": "v1", "pods": "v1", "leases": "coordination.k8s.io/v1", "secrets": "v1",
                "mutatingwebhookconfigurations": "admissionregistration.k8s.io/v1", "nodepools": "karpenter.sh/v1",
                "podtemplates": "v1", "provisioningrequests": "autoscaling.x-k8s.io/v1", "jobs": "batch/v1",
                "events": "v1"}
CLUSTER_SCOPED = {"nodes", "mutatingwebhookconfigurations", "nodepools"}
# Lists and watches of whole collections: the core ones, Jobs (whole: the webhook asks for their
# metadata, which a real apiserver sends alone), and Karpenter's NodePools when `serve_nodepools`.
COLLECTIONS = {"/api/v1/nodes": "nodes", "/api/v1/pods": "pods", "/apis/karpenter.sh/v1/nodepools": "nodepools",
               "/apis/batch/v1/jobs": "jobs"}
# Dynamic Resource Allocation and PodGroups, listed and watched across namespaces when `serve_dra`
# (a cluster whose API does not serve them answers 404, as without it).
DRA_PATHS = {"/apis/resource.k8s.io/v1/resourceslices": "resourceslices",
             "/apis/resource.k8s.io/v1/deviceclasses": "deviceclasses",
             "/apis/resource.k8s.io/v1/resourceclaims": "resourceclaims",
             "/apis/resource.k8s.io/v1/resourceclaimtemplates": "resourceclaimtemplates",
             "/apis/scheduling.k8s.io/v1beta1/podgroups": "podgroups",
             "/apis/resource.nvidia.com/v1beta1/computedomains": "computedomains"}
for _path, _plural in DRA_PATHS.items():
    KINDS[_plural] = {"resourceslices": "ResourceSlice", "deviceclasses": "DeviceClass", "resourceclaims": "ResourceClaim",
                      "resourceclaimtemplates": "ResourceClaimTemplate", "podgroups": "PodGroup",
                      "computedomains": "ComputeDomain"}[_plural]
    API_VERSIONS[_plural] = _path.removeprefix("/apis/").rpartition("/")[0]
CLUSTER_SCOPED |= {"resourceslices", "deviceclasses"}
# PodGroups are served at the scheduling.k8s.io versions in `pod_group_versions`: v1beta1 (Kubernetes
# 1.37) unless told otherwise; ("v1alpha2",) stands for 1.36.
POD_GROUPS = re.compile(r"/apis/scheduling\.k8s\.io/([^/]+)/podgroups")
LEASES = re.compile(r"/apis/coordination\.k8s\.io/v1/namespaces/([^/]+)/leases(?:/([^/]+))?")
SECRETS = re.compile(r"/api/v1/namespaces/([^/]+)/secrets(?:/([^/]+))?")
PODTEMPLATES = re.compile(r"/api/v1/namespaces/([^/]+)/podtemplates(?:/([^/]+))?")
JOBS = re.compile(r"/apis/batch/v1/namespaces/([^/]+)/jobs/([^/]+)")  # read by name: Jobs are put by tests
EVENTS = re.compile(r"/api/v1/namespaces/([^/]+)/events(?:/([^/]+))?")  # created (generateName)
PODS = re.compile(r"/api/v1/namespaces/([^/]+)/pods/([^/]+)")  # JSON patches only: pods are put by tests
PROVISIONING_REQUESTS = re.compile(r"/apis/autoscaling\.x-k8s\.io/v1/namespaces/([^/]+)/provisioningrequests(?:/([^/]+))?")
DELETABLE = {"leases", "podtemplates", "provisioningrequests"}
REVIEWS = {"/apis/authentication.k8s.io/v1/tokenreviews", "/apis/authorization.k8s.io/v1/subjectaccessreviews"}
WEBHOOK_CONFIGURATIONS = re.compile(r"/apis/admissionregistration\.k8s\.io/v1/mutatingwebhookconfigurations/([^/]+)")


def _key(kind: str, obj: dict) -> str:
    meta = obj["metadata"]
    return meta["name"] if kind in CLUSTER_SCOPED else f"{meta.get('namespace', 'default')}/{meta['name']}"


def _namespace_of(kind: str, key: str) -> str | None:
    return None if kind in CLUSTER_SCOPED else key.partition("/")[0]


def _resource(kind: str) -> str:
    """How the apiserver names a resource in messages: `leases.coordination.k8s.io`, `secrets`."""
    group = API_VERSIONS[kind].rpartition("/")[0]
    return f"{kind}.{group}" if group else kind


def _named(path: str) -> tuple[str, str | None, str | None] | None:
    """(kind, namespace, name) of a Lease, Secret, PodTemplate, ProvisioningRequest, Pod or
    MutatingWebhookConfiguration path, else None."""
    for kind, pattern in (("leases", LEASES), ("secrets", SECRETS), ("podtemplates", PODTEMPLATES),
                          ("provisioningrequests", PROVISIONING_REQUESTS), ("pods", PODS), ("jobs", JOBS),
                          ("events", EVENTS)):
        match = pattern.fullmatch(path)
        if match:
            return kind, match.group(1), match.group(2)
    match = WEBHOOK_CONFIGURATIONS.fullmatch(path)
    return ("mutatingwebhookconfigurations", None, match.group(1)) if match else None


def _dra_kind(path: str, pod_group_versions: tuple[str, ...]) -> str | None:
    """The DRA kind a collection path lists (PodGroups only at the versions served), else None."""
    pod_groups = POD_GROUPS.fullmatch(path)
    if pod_groups is not None:
        return "podgroups" if pod_groups.group(1) in pod_group_versions else None
    return DRA_PATHS.get(path)


def _pod_spec_change(old: dict, new: dict) -> str | None:
    """Why the apiserver refuses this change of a pod's spec (scheduling directives mutable only
    while gated, and only narrower), or None."""
    directives = ("schedulingGates", "nodeSelector", "affinity")
    if {k: v for k, v in old.items() if k not in directives} != {k: v for k, v in new.items() if k not in directives}:
        return "pod updates may not change fields other than scheduling directives of a gated pod"
    if all(old.get(k) == new.get(k) for k in directives):
        return None
    old_gates, new_gates = old.get("schedulingGates") or [], new.get("schedulingGates") or []
    if not old_gates:
        return "only a pod with scheduling gates may change its scheduling directives"
    if any(gate not in old_gates for gate in new_gates):
        return "scheduling gates may only be removed"
    if not (old.get("nodeSelector") or {}).items() <= (new.get("nodeSelector") or {}).items():
        return "nodeSelector entries may only be added"
    old_affinity, new_affinity = old.get("affinity") or {}, new.get("affinity") or {}
    required = ("nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution")
    old_terms = ((old_affinity.get(required[0]) or {}).get(required[1]) or {}).get("nodeSelectorTerms") or []
    new_terms = ((new_affinity.get(required[0]) or {}).get(required[1]) or {}).get("nodeSelectorTerms") or []
    if old_terms and (len(new_terms) != len(old_terms) or any(
            (n.get(field) or [])[:len(o.get(field) or [])] != (o.get(field) or [])
            for o, n in zip(old_terms, new_terms) for field in ("matchExpressions", "matchFields"))):
        return "node affinity terms may only gain requirements"
    rest = {k: v for k, v in (old_affinity.get("nodeAffinity") or {}).items() if k != required[1]}
    if rest != {k: v for k, v in (new_affinity.get("nodeAffinity") or {}).items() if k != required[1]} or (
            {k: v for k, v in old_affinity.items() if k != "nodeAffinity"}
            != {k: v for k, v in new_affinity.items() if k != "nodeAffinity"}):
        return "only the required node affinity of a gated pod may change"
    return None


def _status(code: int, reason: str, message: str) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}


class FakeApiServer:
    """The store, its history and the HTTP server; `start()` / `stop()` around use."""

    def __init__(self, port: int = 0, bookmark_interval: float = 1.0) -> None:
        self.port = port
        self.bookmark_interval = bookmark_interval
        self.delay_seconds = 0.0
        self.refuse_until = 0.0
        self.gone_as_status = False
        self.answer_status: int | None = None  # answer every request with this HTTP error (403: no RBAC)
        self.serve_nodepools = False  # a cluster with Karpenter serves karpenter.sh/v1 NodePools
        self.serve_provisioning_requests = False  # cluster-autoscaler's CRD autoscaling.x-k8s.io/v1 is installed
        self.forbidden: set[str] = set()  # resources whose every request is 403, e.g. {"secrets"}
        self.write_delay_seconds = 0.0
        self.refuse_writes = False
        self.writes: list[tuple[str, str, int]] = []  # (method, the object's path, HTTP status) of every write answered
        self.requests: list[tuple[str, dict[str, str]]] = []  # (path, query) of every request answered
        self.serve_dra = False  # serve DRA_PATHS (else 404: an API this cluster does not serve)
        self.pod_group_versions: tuple[str, ...] = ("v1beta1",)  # where PodGroups are served, with serve_dra
        # TokenReviews and SubjectAccessReviews (POST) are answered from these: a token's user
        # ({"username", "uid", "groups"}), and what a user or group may do: (subject, verb, a
        # non-resource path, or "pods/NAMESPACE" with "pods/*" for every namespace).
        self.tokens: dict[str, dict] = {}
        self.grants: set[tuple[str, str, str]] = set()
        self.reviews: list[dict] = []  # every review asked, oldest first
        self._cond = threading.Condition()
        self._rv = 1
        self._compacted_rv = 0
        self._objects: dict[str, dict[str, tuple[dict, bytes]]] = {kind: {} for kind in KINDS}
        # (rv, event line, namespace or None) per kind
        self._history: dict[str, list[tuple[int, bytes, str | None]]] = {kind: [] for kind in KINDS}
        self._snapshots: dict[str, tuple[int, list[bytes]]] = {}  # continue-token id -> (rv, items)
        # (kind, namespace) -> (rv, items in key order): a list's first page, as the apiserver's
        # watch cache holds it, sorted once per version rather than once per list
        self._listed: dict[tuple[str, str | None], tuple[int, list[bytes]]] = {}
        self._stream_generation = 0  # bumped by break_watches()
        self._held = False  # hold_watches(): streams send nothing new until released
        self._stopping = False
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ---- lifecycle -------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "FakeApiServer":
        self._stopping = False
        self._httpd = _Server(("127.0.0.1", self.port), _Handler)
        self._httpd.fake = self
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="fake-apiserver", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop listening and end every open watch; the store is kept, so start() resumes it."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._thread.join(timeout=5)
            self._httpd = None

    # ---- writes (what controllers and kubelets would do) ------------------------------------
    @property
    def resource_version(self) -> int:
        return self._rv

    def put(self, kind: str, obj: dict) -> int:
        """Create or replace a copy of `obj`; returns its new resourceVersion."""
        with self._cond:
            self._rv += 1
            stored = json.loads(json.dumps(obj))  # a deep copy, faster than copy.deepcopy
            stored["metadata"]["resourceVersion"] = str(self._rv)
            stored["metadata"].setdefault("uid", f"uid-{kind}-{_key(kind, obj)}")
            key = _key(kind, stored)
            event_type = "MODIFIED" if key in self._objects[kind] else "ADDED"
            blob = json.dumps(stored).encode()
            self._objects[kind][key] = (stored, blob)
            self._record(kind, event_type, blob, _namespace_of(kind, key))
            return self._rv

    def delete(self, kind: str, key: str) -> None:
        """Delete by name (nodes) or `namespace/name` (pods); the DELETED event carries the last state."""
        with self._cond:
            obj, _ = self._objects[kind].pop(key)
            self._rv += 1
            gone = copy.deepcopy(obj)
            gone["metadata"]["resourceVersion"] = str(self._rv)
            self._record(kind, "DELETED", json.dumps(gone).encode(), _namespace_of(kind, key))

    def put_node(self, node: dict) -> int:
        return self.put("nodes", node)

    def put_pod(self, pod: dict) -> int:
        return self.put("pods", pod)

    def get(self, kind: str, key: str) -> dict:
        return copy.deepcopy(self._objects[kind][key][0])

    def _write(self, method: str, kind: str, namespace: str, name: str | None, body: dict) -> tuple[int, dict]:
        """One create (POST), update (PUT) or delete as the apiserver answers it: (HTTP status, object or Status)."""
        with self._cond:
            meta = body.setdefault("metadata", {})
            if method == "POST" and not meta.get("name") and meta.get("generateName"):
                meta["name"] = f"{meta['generateName']}{self._rv:x}"
            key = f"{namespace}/{name or meta.get('name')}"
            stored = self._objects[kind].get(key)
            body.setdefault("metadata", {})["namespace"] = namespace
            if method == "POST":
                if stored is not None:
                    return 409, _status(409, "AlreadyExists", f'{_resource(kind)} "{key}" already exists')
                body["metadata"]["uid"] = f"uid-{kind}-{key}-{self._rv}"
                self.put(kind, body)
                return 201, self.get(kind, key)
            if stored is None:
                return 404, _status(404, "NotFound", f'{_resource(kind)} "{key}" not found')
            if method == "DELETE":
                self.delete(kind, key)
                return 200, _status(200, "", "deleted") | {"status": "Success"}
            if (body.get("metadata") or {}).get("resourceVersion") != stored[0]["metadata"]["resourceVersion"]:
                return 409, _status(409, "Conflict", f'Operation cannot be fulfilled on {_resource(kind)} '
                                    f'"{name}": the object has been modified; please apply your changes to the '
                                    'latest version and try again')
            body["metadata"]["uid"] = stored[0]["metadata"]["uid"]
            self.put(kind, body)
            return 200, self.get(kind, key)

    def _patch(self, kind: str, key: str, operations: list) -> tuple[int, dict]:
        """A JSON patch (RFC 6902) as the apiserver applies it: all operations or none."""
        with self._cond:
            stored = self._objects[kind].get(key)
            if stored is None:
                return 404, _status(404, "NotFound", f'{_resource(kind)} "{key}" not found')
            try:
                patched = jsonpatch.apply_patch(stored[0], operations)
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as err:
                return 422, _status(422, "Invalid", str(err))
            patched["metadata"]["uid"] = stored[0]["metadata"]["uid"]
            problem = _pod_spec_change(stored[0].get("spec") or {}, patched.get("spec") or {}) if kind == "pods" else None
            if problem:
                return 422, _status(422, "Invalid", f'Pod "{key}" is invalid: spec: Forbidden: {problem}')
            self.put(kind, patched)
            return 200, self.get(kind, key)

    def _forbidden(self, method: str, kind: str, namespace: str | None, name: str | None) -> dict:
        """The apiserver's answer to a request RBAC denies."""
        verb = {"GET": "get", "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}[method]
        group = API_VERSIONS[kind].rpartition("/")[0]
        where = f' in the namespace "{namespace}"' if namespace else ""
        return _status(403, "Forbidden", f'{_resource(kind)} "{name or ""}" is forbidden: User '
                                         f'"system:serviceaccount:{namespace or "default"}:webhook" cannot {verb} '
                                         f'resource "{kind}" in API group "{group}"{where}')

    def _record(self, kind: str, event_type: str, blob: bytes, namespace: str | None) -> None:
        line = b'{"type": "%s", "object": %s}\n' % (event_type.encode(), blob)
        self._history[kind].append((self._rv, line, namespace))
        if not self._held:
            self._cond.notify_all()

    # ---- faults -----------------------------------------------------------------------------
    def hold_watches(self) -> None:
        """Keep new events from open watches until release_watches(): a backlog to drain at once."""
        with self._cond:
            self._held = True

    def release_watches(self) -> None:
        with self._cond:
            self._held = False
            self._cond.notify_all()

    def compact(self) -> None:
        """Forget history and paging snapshots up to now: older resourceVersions now get 410."""
        with self._cond:
            self._compacted_rv = self._rv
            for kind in KINDS:
                self._history[kind] = []
            self._snapshots.clear()

    def break_watches(self) -> None:
        """Cut every open watch stream in the middle of an event, without the closing chunk."""
        with self._cond:
            self._stream_generation += 1
            self._cond.notify_all()

    def watch_requests(self, kind: str) -> list[dict[str, str]]:
        return [q for path, q in self.requests if path == f"/api/v1/{kind}" and q.get("watch") in ("1", "true")]

    def list_requests(self, kind: str) -> list[dict[str, str]]:
        return [q for path, q in self.requests if path == f"/api/v1/{kind}" and q.get("watch") not in ("1", "true")]

    # ---- serving ----------------------------------------------------------------------------
    def _list_body(self, kind: str, query: dict[str, str], namespace: str | None = None) -> tuple[int, bytes]:
        limit = int(query.get("limit") or 0)
        token = query.get("continue")
        with self._cond:
            if token:
                snapshot_id, _, start = base64.urlsafe_b64decode(token.encode()).decode().partition(":")
                if snapshot_id not in self._snapshots:
                    return 410, json.dumps(_status(410, "Expired", "The provided continue parameter is "
                                                   "too old to display a consistent list result.")).encode()
                rv, items = self._snapshots[snapshot_id]
                offset = int(start)
            else:
                rv, items = self._current_list(kind, namespace)
                offset = 0
                snapshot_id = f"{kind}-{rv}-{len(self._snapshots)}"
            end = offset + limit if limit else len(items)
            metadata: dict = {"resourceVersion": str(rv)}
            if end < len(items):
                self._snapshots[snapshot_id] = (rv, items)
                metadata["continue"] = base64.urlsafe_b64encode(f"{snapshot_id}:{end}".encode()).decode()
                metadata["remainingItemCount"] = len(items) - end
        head = json.dumps({"kind": KINDS[kind] + "List", "apiVersion": API_VERSIONS[kind], "metadata": metadata})
        return 200, head[:-1].encode() + b', "items": [' + b",".join(items[offset:end]) + b"]}"

    def _current_list(self, kind: str, namespace: str | None) -> tuple[int, list[bytes]]:
        """(rv, the objects' JSON in key order) now; called with the lock held."""
        listed = self._listed.get((kind, namespace))
        if listed is None or listed[0] != self._rv:
            listed = self._rv, [blob for key, (_, blob) in sorted(self._objects[kind].items())
                                if namespace is None or _namespace_of(kind, key) == namespace]
            self._listed[(kind, namespace)] = listed
        return listed

    def prepare_lists(self, *kinds: str) -> None:
        """Sort each kind's objects for listing now, so the first list of them at this version
        costs no more than the pages after it (a benchmark's sync then times the client alone)."""
        with self._cond:
            for kind in kinds:
                self._current_list(kind, None)

    def _watch_start(self, kind: str, query: dict[str, str],
                     namespace: str | None = None) -> tuple[int | None, list[bytes], int]:
        """(position, initial lines, stream generation), or position None when the RV is too old."""
        with self._cond:
            requested = query.get("resourceVersion")
            if requested in (None, "", "0"):
                initial = [json.dumps({"type": "ADDED", "object": obj}).encode() + b"\n"
                           for key, (obj, _) in self._objects[kind].items()
                           if namespace is None or _namespace_of(kind, key) == namespace]
                return self._rv, initial, self._stream_generation
            if int(requested) < self._compacted_rv:
                return None, [], self._stream_generation
            return int(requested), [], self._stream_generation

    def _watch_next(self, kind: str, position: int, generation: int, wait: float,
                    namespace: str | None = None) -> tuple[int, list[bytes], bool]:
        """Events after `position`, waiting up to `wait` seconds; the bool says the stream must be cut."""
        with self._cond:
            def pending() -> bool:
                history = self._history[kind]
                fresh = bool(history and history[-1][0] > position) and not self._held
                return fresh or self._stopping or generation != self._stream_generation
            self._cond.wait_for(pending, timeout=wait)
            if self._stopping or generation != self._stream_generation:
                return position, [], True
            if self._held:
                return position, [], False
            history = self._history[kind]
            lines = [line for _, line, where in history[bisect.bisect_right(history, position, key=lambda e: e[0]):]
                     if namespace is None or where == namespace]
            return self._rv, lines, False


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    fake: FakeApiServer

    def handle_error(self, request, client_address) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # a client that went away is no error
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes: with Nagle's algorithm the second waits for the
    # client's delayed ACK (40 ms on Linux), which the real apiserver (TCP_NODELAY) never costs.
    disable_nagle_algorithm = True
    server: _Server

    def log_message(self, format, *args):  # noqa: A002 - silence per-request logging
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        fake = self.server.fake
        if time.monotonic() < fake.refuse_until:
            self._hang_up()
            return
        if fake.delay_seconds:
            time.sleep(fake.delay_seconds)
        if fake.answer_status:
            status = _status(fake.answer_status, "Forbidden" if fake.answer_status == 403 else "InternalError",
                             f"injected HTTP {fake.answer_status}")
            self._send_json(fake.answer_status, json.dumps(status).encode())
            return
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        named = _named(url.path)
        if named and named[0] in fake.forbidden:
            self._send_json(403, json.dumps(fake._forbidden("GET", *named)).encode())
            return
        if named and named[0] != "leases":  # secrets and webhook configurations: get by name only
            kind, namespace, name = named
            fake.requests.append((url.path, query))
            with fake._cond:
                found = fake._objects[kind].get(name if namespace is None else f"{namespace}/{name}")
            if found:
                self._send_json(200, found[1])
            else:
                self._send_json(404, json.dumps(_status(404, "NotFound", f'{_resource(kind)} "{name}" not found')).encode())
            return
        if named:
            kind, namespace, name = named
        elif url.path in COLLECTIONS and (COLLECTIONS[url.path] != "nodepools" or fake.serve_nodepools):
            kind, namespace, name = COLLECTIONS[url.path], None, None
        elif fake.serve_dra and (dra_kind := _dra_kind(url.path, fake.pod_group_versions)) is not None:
            kind, namespace, name = dra_kind, None, None
            if kind in fake.forbidden:
                self._send_json(403, json.dumps(fake._forbidden("GET", kind, None, None)).encode())
                return
        else:
            self._send_json(404, json.dumps(_status(404, "NotFound", f"{url.path} not found")).encode())
            return
        if name:
            fake.requests.append((url.path, query))
            with fake._cond:
                found = fake._objects[kind].get(f"{namespace}/{name}")
            if found:
                self._send_json(200, found[1])
            else:
                self._send_json(404, json.dumps(_status(404, "NotFound", f'leases "{name}" not found')).encode())
        elif query.get("watch") in ("1", "true"):
            fake.requests.append((url.path, query))
            self._watch(fake, kind, query, namespace)
        else:
            answer = fake._list_body(kind, query, namespace)
            fake.requests.append((url.path, query))  # once seen, its paging snapshot exists
            self._send_json(*answer)

    def do_POST(self) -> None:  # noqa: N802
        if urlsplit(self.path).path in REVIEWS:
            self._review()
            return
        self._write("POST")

    def _review(self) -> None:
        """A TokenReview or SubjectAccessReview, answered with its status filled in as the apiserver does."""
        fake = self.server.fake
        review = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        if fake.answer_status:
            self._send_json(fake.answer_status, json.dumps(_status(fake.answer_status, "InternalError",
                                                                   f"injected HTTP {fake.answer_status}")).encode())
            return
        fake.reviews.append(review)
        spec = review.get("spec") or {}
        if review.get("kind") == "TokenReview":
            user = fake.tokens.get(spec.get("token", ""))
            review["status"] = {"authenticated": True, "user": user} if user else {
                "authenticated": False, "error": "invalid bearer token"}
        else:
            attributes = spec.get("nonResourceAttributes")
            if attributes:
                target = attributes.get("path", "")
            else:
                attributes = spec.get("resourceAttributes") or {}
                target = f"{attributes.get('resource')}/{attributes.get('namespace')}"
            subjects = [spec.get("user", "")] + list(spec.get("groups") or [])
            wildcard = target.rpartition("/")[0] + "/*" if not target.startswith("/") else target
            review["status"] = {"allowed": any((subject, attributes.get("verb"), wanted) in fake.grants
                                               for subject in subjects for wanted in (target, wildcard))}
        self._send_json(201, json.dumps(review).encode())

    def do_PUT(self) -> None:  # noqa: N802
        self._write("PUT")

    def do_DELETE(self) -> None:  # noqa: N802
        self._write("DELETE")

    def do_PATCH(self) -> None:  # noqa: N802
        self._write("PATCH")

    def _write(self, method: str) -> None:
        fake = self.server.fake
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if fake.refuse_writes:
            self._hang_up()
            return
        if fake.write_delay_seconds:
            time.sleep(fake.write_delay_seconds)
        named = _named(urlsplit(self.path).path)
        written = self.path  # the object's path: a create's gets the created name
        if named and named[0] in fake.forbidden:
            code, answer = 403, fake._forbidden(method, *named)
        elif method == "PATCH" and named and named[2]:
            if self.headers.get("Content-Type") != "application/json-patch+json":
                code, answer = 415, _status(415, "UnsupportedMediaType", "only JSON patches are served here")
            else:
                kind, namespace, name = named
                code, answer = fake._patch(kind, name if namespace is None else f"{namespace}/{name}", json.loads(body))
        elif not named or named[0] in ("mutatingwebhookconfigurations", "pods", "jobs") \
                or (method == "POST") == bool(named[2]) \
                or (method == "DELETE" and named[0] not in DELETABLE) \
                or (named[0] == "provisioningrequests" and not fake.serve_provisioning_requests):
            self._send_json(404, json.dumps(_status(404, "NotFound", f"{self.path} not found")).encode())
            return
        else:
            obj = json.loads(body) if body and method != "DELETE" else {}
            code, answer = fake._write(method, named[0], named[1], named[2], obj)
            if method == "POST":
                written = f'{self.path.rstrip("/")}/{(obj.get("metadata") or {}).get("name", "")}'
        fake.writes.append((method, written, code))
        self._send_json(code, json.dumps(answer).encode())

    def _hang_up(self) -> None:
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # the client hung up first

    def _send_json(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _watch(self, fake: FakeApiServer, kind: str, query: dict[str, str], namespace: str | None) -> None:
        position, initial, generation = fake._watch_start(kind, query, namespace)
        if position is None and fake.gone_as_status:
            self._send_json(410, json.dumps(_status(410, "Expired", "too old resource version")).encode())
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        if position is None:
            error = _status(410, "Expired", f"too old resource version: {query['resourceVersion']} "
                                            f"({fake._compacted_rv})")
            self._chunk(json.dumps({"type": "ERROR", "object": error}).encode() + b"\n")
            self._end_stream()
            return
        for line in initial:
            self._chunk(line)
        timeout = float(query.get("timeoutSeconds") or 1800)
        bookmarks = query.get("allowWatchBookmarks") in ("1", "true")
        deadline = time.monotonic() + timeout
        next_bookmark = time.monotonic() + fake.bookmark_interval
        try:
            while (now := time.monotonic()) < deadline:
                wait = min(deadline, next_bookmark if bookmarks else deadline) - now
                position, lines, cut = fake._watch_next(kind, position, generation, max(wait, 0.0), namespace)
                if cut:
                    # Half an event with a chunk header promising more: a connection lost mid-stream.
                    self.wfile.write(b"%x\r\n%s" % (64, b'{"type": "MODIFIED", "obj'))
                    self.wfile.flush()
                    self._hang_up()
                    return
                for start in range(0, len(lines), 500):  # a backlog goes out in few, large chunks
                    self._chunk(b"".join(lines[start:start + 500]))
                if bookmarks and time.monotonic() >= next_bookmark:
                    bookmark = {"kind": KINDS[kind], "apiVersion": API_VERSIONS[kind],
                                "metadata": {"resourceVersion": str(position)}}
                    self._chunk(json.dumps({"type": "BOOKMARK", "object": bookmark}).encode() + b"\n")
                    next_bookmark = time.monotonic() + fake.bookmark_interval
            self._end_stream()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _end_stream(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()
