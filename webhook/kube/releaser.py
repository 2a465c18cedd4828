"""The releaser: starts the waits our scheduling gate holds (`gate_waits`) as soon as room opens.

Every replica runs one, on the pods its live view sees. A pass, after the cluster changed, takes the
gated workloads whose pods all exist (as many as their owner wants now: a Job scaled while gated
is followed; none of one whose owner is deleted, suspended or wants no pods, asked once a pass),
oldest first, decides each again (placer.start_gated: its domain, else one no wider)
and holds and claims the placement through the replicas' shared claims (compare-and-swap) before
any pod is patched: a replica that loses that race reads the claims again and finds the
workload held, so it is never released twice nor onto room another release took. Then it patches
each pod, in name order, with what `mutation.released` writes (the pin, the GPU ids, the gate
removed, and nothing else: the record on a pod is its owner's to edit), behind a JSON-patch `test`
that the pod's gates are still the ones it saw. When the first patch is refused, the pod is read
again: our gate gone (someone else lifted it), the pass drops its hold and ends, and the next one
starts from what is held then; still gated (the API refused the change itself), the hold is
dropped and the workload is left until one of its pods changes, and the pass goes on. This is
Kueue's TopologyUngater's pattern; the API lets a gated pod's node affinity only narrow
(KEP-3838, Kubernetes 1.30+).

What a release decides from is only what we sealed (injection.seal_gate): a pod whose record does
not verify stays gated, is counted ("refused") and named in a warning Event; a workload whose
decision fails is counted ("error") and the pass goes on with the next.
"""
from __future__ import annotations

import datetime
import json
import logging
from typing import Any, Callable, Mapping

from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException

from ..core.injection import GATE
from ..core.model import MAPPINGS, Decision
from ..objects import mutation
from ..objects.patch import make_patch
from ..placement.placer import release_shared, start_gated
from ..state.gated import GatedGroup, GatedPod
from ..state.index import ClusterIndex

log = logging.getLogger(__name__)
JSON_PATCH = "application/json-patch+json"
# Results counted by `on_release`: a workload started; one another replica started first; a pod
# whose patch failed otherwise (it stays gated: the next pass that finds room tries again); a
# gated pod whose record is not ours (never decided); a workload whose decision raised.
RELEASED, TAKEN, FAILED, REFUSED, ERROR = "released", "released-by-another-replica", "failed", "refused", "error"
# What each means (topology_gated_releases_total's `result`: docs/reference/metrics.md is generated from it).
RESULTS: Mapping[str, str] = {
    RELEASED: "a gated workload started: its pods' gate lifted and pinned where room opened",
    TAKEN: "another replica lifted its gate first; this one dropped its hold",
    FAILED: "the API refused a pod's patch: it stays gated; its workload is decided again once one of its pods "
            "changes",
    REFUSED: "a gated pod whose record is not sealed by us or names another namespace: never released, named in a "
             "Warning Event",
    ERROR: "deciding a workload's release failed; the pass went on with the others",
}
API_SECONDS = 5  # each call the releaser makes: a slow apiserver delays a pass, never stops it
EVENTS_PER_PASS = 10
# Where a gated workload's owner says how many pods it wants, by the owner's kind (0: gone).
OwnerSize = Callable[[str, Mapping], "int | None"]


class Releaser:
    """Lifts our gates for one cluster index through the API (`patch_pod`: the core API's)."""

    def __init__(self, index: ClusterIndex, patch_pod: Callable[[str, str, list[dict]], None],
                 on_release: Callable[[str], None] = lambda _: None,
                 owner_size: OwnerSize = lambda _namespace, _owner: None,
                 warn: Callable[[Mapping, str], None] = lambda _pod, _why: None,
                 still_gated: Callable[[str, str], bool] = lambda _namespace, _name: True) -> None:
        self.index = index
        self.patch_pod = patch_pod
        self.on_release = on_release
        self.owner_size = owner_size  # (namespace, controller ownerReference) -> pods it wants; None: unknown
        self.warn = warn  # a warning Event on a pod whose record is refused
        self.still_gated = still_gated  # whether the pod, read now, still carries our gate
        # Workloads whose release the API refused, with their pods as they were then: not decided
        # again until one of them changes (a refusal is the pod's doing, and would repeat).
        self.refusing: dict[str, tuple] = {}
        # Holds of pods released apart from their workload (`<key>+<pod>`), with those pods: their
        # binding confirms only the workload's own hold, so these are dropped once all are bound.
        self.side_holds: dict[str, set[str]] = {}
        self.seen_changes: int | None = None  # the index's `changes` at the last pass
        # Pods this releaser patched, until the live view sees them no longer gated: deciding them
        # again before that would take a second, stale, hold.
        self.patched: set[str] = set()
        self.reported: set[str] = set()  # refused pods already counted and named

    @classmethod
    def over_api(cls, index: ClusterIndex, api_client: k8s_client.ApiClient,
                 on_release: Callable[[str], None] = lambda _: None) -> "Releaser":
        # Raw JSON both ways (dict bodies, _preload_content=False), which the client's hints do not describe.
        core: Any = k8s_client.CoreV1Api(api_client)
        batch: Any = k8s_client.BatchV1Api(api_client)

        def patch_pod(namespace: str, name: str, operations: list[dict]) -> None:
            core.patch_namespaced_pod(name, namespace, operations, _content_type=JSON_PATCH, _preload_content=False,
                                      _request_timeout=API_SECONDS)

        def still_gated(namespace: str, name: str) -> bool:
            try:
                pod = json.loads(core.read_namespaced_pod(name, namespace, _preload_content=False,
                                                          _request_timeout=API_SECONDS).data)
            except ApiException as err:
                return err.status != 404
            return {"name": GATE} in ((pod.get("spec") or {}).get("schedulingGates") or [])

        def owner_size(namespace: str, owner: Mapping) -> int | None:
            if owner.get("kind") != "Job" or str(owner.get("apiVersion")) != "batch/v1":
                return None
            try:
                response = batch.read_namespaced_job(str(owner.get("name")), namespace, _preload_content=False,
                                                     _request_timeout=API_SECONDS)
            except ApiException as err:
                return 0 if err.status == 404 else None  # gone; or not to be read: what its pods say decides
            job = json.loads(response.data)
            if (job.get("metadata") or {}).get("uid") != owner.get("uid"):
                return 0  # another Job of that name: the owner is gone
            return job_pods_wanted(job)

        def warn(pod: Mapping, why: str) -> None:
            meta = pod.get("metadata") or {}
            namespace = str(meta.get("namespace") or "default")
            now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
            event = {"apiVersion": "v1", "kind": "Event",
                     "metadata": {"generateName": f"{meta.get('name')}.", "namespace": namespace},
                     "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": namespace,
                                        "name": meta.get("name"), "uid": meta.get("uid")},
                     "reason": "GateRecordRefused", "type": "Warning", "count": 1,
                     "firstTimestamp": now, "lastTimestamp": now, "source": {"component": "topology-webhook"},
                     "message": f"topology-webhook will not release this pod from its scheduling gate: {why}. "
                                f"Remove the gate {GATE} by hand, or delete the pod"[:1024]}
            try:
                core.create_namespaced_event(namespace, event, _preload_content=False, _request_timeout=API_SECONDS)
            except Exception as err:  # noqa: BLE001 - an event is best effort; the metric and the log stay
                log.warning("could not record an event on pod %s/%s: %s", namespace, meta.get("name"), err)
        return cls(index, patch_pod, on_release, owner_size, warn, still_gated)

    def run_once(self) -> int:
        """One pass, if the cluster changed since the last one; returns how many workloads it started."""
        gate = self.index.gated_now()
        changes, refused = gate.changes, gate.refused
        self.patched &= gate.gated  # forgotten once seen no longer gated
        if changes == self.seen_changes:
            return 0
        self.seen_changes = changes
        self._drop_side_holds()
        started = 0
        asked: dict[str, int | None] = {}  # each owner asked once a pass
        groups = self.index.gated_groups(set(self.patched), self._sizes(asked))
        self.refusing = {key: pods for key, pods in self.refusing.items()
                         if any(g.group == key and _as_seen(g) == pods for g in groups)}
        for group in groups:
            if self.refusing.get(group.group) == _as_seen(group) or self._owner_wants(group.pods[0], asked) == 0:
                continue  # the owner is gone, suspended or wants no pods: never started for it
            try:
                decision, alone = start_gated(self.index, group)
                for warning in alone:
                    log.warning("%s", warning)
                if decision is None:
                    continue
                result = self._patch(group, decision)
                if result == TAKEN:
                    self.seen_changes = None  # pass again soon, from what is held then
                    break
                started += result == RELEASED
            except Exception:  # noqa: BLE001 - one workload's failure never stops the others' release
                log.exception("deciding the release of %s failed; it stays gated", group.reservation)
                self.on_release(ERROR)
        self._report(refused)
        return started

    def _drop_side_holds(self) -> None:
        """Drop each side hold whose pods are all bound (counted on their nodes) or gone."""
        if not self.side_holds:
            return
        for hold in self.index.bound_or_gone(self.side_holds):
            del self.side_holds[hold]
            release_shared(self.index, hold)

    def _report(self, refused: Mapping[str, tuple[Mapping, str]]) -> None:
        """Count and name each refused gated pod once (while it is seen), at most EVENTS_PER_PASS
        a pass and after the releases: a tenant's thousand pods carrying our gate's name delay no
        release, and the rest are named by the passes after."""
        self.reported &= set(refused)
        fresh = [key for key in refused if key not in self.reported]
        if len(fresh) > EVENTS_PER_PASS:
            self.seen_changes = None  # pass again soon for the rest
        for key in fresh[:EVENTS_PER_PASS]:
            pod, why = refused[key]
            self.reported.add(key)
            log.warning("gated pod %s is not released: %s", key, why)
            self.on_release(REFUSED)
            self.warn(pod, why)

    def _sizes(self, asked: dict[str, int | None]) -> dict[str, int]:
        """How many pods each gated group's owner wants, where its pods disagree with its request."""
        sizes = {}
        for group, pod in self.index.gated_unsure().items():
            size = self._owner_wants(pod, asked)
            if size is not None:
                sizes[group] = size
        return sizes

    def _owner_wants(self, pod: GatedPod, asked: dict[str, int | None]) -> int | None:
        """How many pods the controller of a gated pod wants now (0: it is gone, suspended or
        done), asked once a pass (`asked`, by its uid); None when it cannot be read."""
        owner = controller_of(pod.pod)
        if owner is None:
            return None
        uid = str(owner.get("uid"))
        if uid not in asked:
            try:
                asked[uid] = self.owner_size(pod.namespace, owner)
            except Exception as err:  # noqa: BLE001 - unknown: the request says, as before
                log.warning("could not read the owner of %s: %s", pod.reservation, err)
                asked[uid] = None
        return asked[uid]

    def _patch(self, group: GatedGroup, decision: Decision) -> str:
        """Patch the group's pods. TAKEN when someone else lifted the first one's gate first (the
        hold is dropped and its claim withdrawn; the pass ends, and the next decides afresh);
        FAILED when the API refused the first one otherwise (the hold is dropped, and the workload
        is not decided again until its pods change); else RELEASED."""
        for position, gated in enumerate(group.pods):
            released = mutation.released(gated.pod, decision, self.index.config.seal_key)
            operations = [_still_gated(gated.pod), *make_patch(gated.pod, released)]
            try:
                self.patch_pod(gated.namespace, gated.name, operations)
            except ApiException as err:
                log.warning("could not release pod %s/%s of %s from its scheduling gate (HTTP %s): it stays gated",
                            gated.namespace, gated.name, group.request.workload, err.status)
                if position == 0:
                    release_shared(self.index, group.hold)
                    taken = err.status == 422 and not self.still_gated(gated.namespace, gated.name)
                    if not taken:
                        self.refusing[group.group] = _as_seen(group)
                    self.on_release(TAKEN if taken else FAILED)
                    return TAKEN if taken else FAILED
                self.on_release(FAILED)
                continue
            self.patched.add(gated.key)
            if group.hold != group.reservation:
                self.side_holds.setdefault(group.hold, set()).add(gated.key)
        log.info("released %s from its scheduling gate: %s", group.request.workload, decision.reasons[-1])
        self.on_release(RELEASED)
        return RELEASED


def controller_of(pod: Mapping) -> Mapping | None:
    """The pod's controller ownerReference (its Job, say), if it has one."""
    for owner in (pod.get("metadata") or {}).get("ownerReferences") or ():
        if isinstance(owner, MAPPINGS) and owner.get("controller") is True:
            return owner
    return None


def job_pods_wanted(job: Mapping) -> int:
    """How many pods a Job runs at once now: its parallelism, no more than the completions left;
    none while suspended or finished."""
    spec, status = job.get("spec") or {}, job.get("status") or {}
    if spec.get("suspend") is True:
        return 0
    for condition in status.get("conditions") or ():
        if condition.get("type") in ("Complete", "Failed") and condition.get("status") == "True":
            return 0
    parallelism = spec.get("parallelism")
    wanted = 1 if parallelism is None else int(parallelism)
    completions = spec.get("completions")
    if completions is not None:
        wanted = min(wanted, int(completions) - int(status.get("succeeded") or 0))
    return max(0, wanted)


def _as_seen(group: GatedGroup) -> tuple:
    """A gated workload's pods as the view saw them: a change of any is a reason to try again."""
    return tuple(sorted((p.key, str((p.pod.get("metadata") or {}).get("resourceVersion"))) for p in group.pods))


def _still_gated(pod: Mapping) -> dict:
    """The `test` operation that fails when the pod's gates changed since the live view saw it."""
    return {"op": "test", "path": "/spec/schedulingGates", "value": list(pod["spec"]["schedulingGates"])}
