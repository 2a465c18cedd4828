"""The releaser: starts the waits our scheduling gate holds (`gate_waits`) as soon as room opens.

Every replica runs one, on the pods its live view sees. A pass, after the cluster changed, takes the
gated workloads whose pods all exist, oldest first, decides each again (placer.start_gated: its
domain, else one no wider) and holds and claims the placement as an admission would. Then it
patches each pod, in name order, with what `mutation.released` writes (the pin, the GPU ids, the
gate removed), behind a JSON-patch `test` that the pod's gates are still the ones it saw: when two
replicas release one workload, the second's first patch fails that test (HTTP 422), and it drops
its own hold and leaves the rest to the first. This is Kueue's TopologyUngater's pattern; the API
lets a gated pod's node affinity only narrow (KEP-3838, Kubernetes 1.30+).
"""
from __future__ import annotations

import logging
from typing import Callable, Mapping

from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException

from ..core.cluster import ClusterIndex
from ..core.gating import GatedGroup
from ..core.model import Decision
from ..core.placer import start_gated
from ..objects import mutation
from ..objects.patch import make_patch

log = logging.getLogger(__name__)
JSON_PATCH = "application/json-patch+json"
# Results counted by `on_release`: a workload started; one another replica started first; a pod
# whose patch failed otherwise (it stays gated: the next pass that finds room tries again).
RELEASED, TAKEN, FAILED = "released", "released-by-another-replica", "failed"


class Releaser:
    """Lifts our gates for one cluster index through the API (`patch_pod`: the core API's)."""

    def __init__(self, index: ClusterIndex, patch_pod: Callable[[str, str, list[dict]], None],
                 on_release: Callable[[str], None] = lambda _: None) -> None:
        self.index = index
        self.patch_pod = patch_pod
        self.on_release = on_release
        self.seen_changes: int | None = None  # the index's `changes` at the last pass
        # Workloads this releaser patched, until the live view sees their pods no longer gated:
        # deciding them again before that would take their hold for a second, stale, release.
        self.patched: set[str] = set()

    @classmethod
    def over_api(cls, index: ClusterIndex, api_client: k8s_client.ApiClient,
                 on_release: Callable[[str], None] = lambda _: None) -> "Releaser":
        core = k8s_client.CoreV1Api(api_client)

        def patch_pod(namespace: str, name: str, operations: list[dict]) -> None:
            core.patch_namespaced_pod(name, namespace, operations, _content_type=JSON_PATCH, _preload_content=False)
        return cls(index, patch_pod, on_release)

    def run_once(self) -> int:
        """One pass, if the cluster changed since the last one; returns how many workloads it started."""
        with self.index.lock:
            changes = self.index.changes
        if changes == self.seen_changes:
            return 0
        self.seen_changes = changes
        started = 0
        groups = self.index.gated_groups()
        with self.index.lock:  # forgotten only once none of its pods is seen gated, not when its group is not whole
            self.patched &= set(self.index.gated.by_reservation)
        for group in groups:
            if group.reservation in self.patched:
                continue
            decision, alone = start_gated(self.index, group)
            for warning in alone:
                log.warning("%s", warning)
            if decision is not None and self._patch(group, decision):
                self.patched.add(group.reservation)
                started += 1
        return started

    def _patch(self, group: GatedGroup, decision: Decision) -> bool:
        """Patch the group's pods; False when another replica released them first."""
        for position, gated in enumerate(group.pods):
            operations = [_still_gated(gated.pod), *make_patch(gated.pod, mutation.released(gated.pod, decision))]
            try:
                self.patch_pod(gated.namespace, gated.name, operations)
            except ApiException as err:
                if err.status == 422 and position == 0:
                    self.index.release(group.reservation)  # the other replica holds and claimed it
                    self.on_release(TAKEN)
                    return False
                log.warning("could not release pod %s/%s of %s from its scheduling gate (HTTP %s): it stays gated "
                            "until a later pass", gated.namespace, gated.name, group.request.workload, err.status)
                self.on_release(FAILED)
        log.info("released %s from its scheduling gate: %s", group.request.workload, decision.reasons[-1])
        self.on_release(RELEASED)
        return True


def _still_gated(pod: Mapping) -> dict:
    """The `test` operation that fails when the pod's gates changed since the live view saw it."""
    return {"op": "test", "path": "/spec/schedulingGates", "value": list(pod["spec"]["schedulingGates"])}
