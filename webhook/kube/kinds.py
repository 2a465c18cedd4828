"""Which streams the `ApiFeed` (webhook/kube/clusterview.py) runs besides the nodes', per kind: how
each kind is listed and watched, and how its objects reach the index: the pods, the claims Lease
(webhook/kube/shared_claims.py), what autoscalers publish about how the cluster can grow, and the
DRA kinds and PodGroups. The machinery each stream runs on is webhook/kube/streams.py. Nothing
happens at import time.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException

from ..objects import autoscaler_objects, dra_objects, feed
from ..state import dra
from ..objects.kinds import WorkloadKind
from ..objects.provisioning import request_name
from ..state.growth import CA_STATUS_NAME, CA_STATUS_NAMESPACE, NODEPOOL_GROUP, NODEPOOL_KIND
from ..state.holds import Stored
from ..state.index import ClusterIndex
from .shared_claims import LEASE_NAME, ApiClaims
from .shared_decisions import RECORD_KIND, RECORD_LABEL, ApiDecisionRecords
from .streams import NOT_FOUND, Stream

GROWTH_STREAMS = ("nodepools", "autoscaler-status")
NODEPOOL_VERSION = "v1"


def pod_stream(index: ClusterIndex, core: k8s_client.CoreV1Api) -> Stream:
    """Every pod of every namespace, each counted under its `pod_key`."""
    return Stream("pods", core.list_pod_for_all_namespaces, feed.pod_key, feed.upserter(index, "Pod"),
                  functools.partial(feed.delete, index, kind="Pod"), functools.partial(index.keys, "Pod"),
                  lambda key: feed.delete(index, {"metadata": {"uid": key}}, "Pod"))


def claims_stream(claims: ApiClaims, api_client: k8s_client.ApiClient, claims_namespace: str) -> Stream:
    """The claims Lease applied to the ledger. Only that Lease: other Leases of the namespace
    (leader elections) are none of ours."""
    leases = functools.partial(k8s_client.CoordinationV1Api(api_client).list_namespaced_lease,
                               claims_namespace, field_selector=f"metadata.name={LEASE_NAME}")
    return Stream("leases", leases, lambda lease: (lease.get("metadata") or {}).get("name", ""), claims.apply,
                  claims.deleted, claims.names, claims.forget)


def decisions_stream(records: ApiDecisionRecords, api_client: k8s_client.ApiClient) -> Stream:
    """The replicas' records of their recent decisions (the topology page's), by their label. Optional:
    a view that may not list them serves on, its page listing this replica's decisions alone."""
    leases = functools.partial(k8s_client.CoordinationV1Api(api_client).list_namespaced_lease, records.namespace,
                               label_selector=f"{RECORD_LABEL}={RECORD_KIND}")
    return Stream("decision-records", leases, lambda lease: (lease.get("metadata") or {}).get("name", ""),
                  records.upsert, records.deleted, records.names, records.forget, optional=True)


def growth_streams(index: ClusterIndex, core: k8s_client.CoreV1Api,
                   custom: k8s_client.CustomObjectsApi) -> tuple[Stream, ...]:
    """What autoscalers publish about how the cluster can grow (webhook/state/growth.py): Karpenter
    NodePools, and cluster-autoscaler's status ConfigMap (only that one, by name). Either may be
    missing: a cluster without that autoscaler."""
    nodepools = functools.partial(custom.list_cluster_custom_object, NODEPOOL_GROUP, NODEPOOL_VERSION, "nodepools")
    status = functools.partial(core.list_namespaced_config_map, CA_STATUS_NAMESPACE,
                               field_selector=f"metadata.name={CA_STATUS_NAME}")
    calls: tuple[tuple[str, Callable], ...] = ((NODEPOOL_KIND, nodepools), ("ConfigMap", status))
    def stream(kind: str, object_kind: str, call: Callable) -> Stream:
        def forget(key: str) -> None:
            _, namespace, name = key.split("/", 2)
            feed.delete(index, {"metadata": {"name": name, "namespace": namespace}}, object_kind)
        return Stream(kind, call, functools.partial(autoscaler_objects.object_key, kind=object_kind),
                      feed.upserter(index, object_kind),
                      functools.partial(feed.delete, index, kind=object_kind),
                      functools.partial(index.keys, object_kind), forget, optional=True)
    return tuple(stream(kind, object_kind, call) for kind, (object_kind, call) in zip(GROWTH_STREAMS, calls))


# ----- Workloads we hold for, as stored ------------------------------------------------------------

# Only their metadata: the apiserver sends a workload's without its spec or status (what a
# PartialObjectMetadata list and watch carry), all that tells an admission's hold stored.
_METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
_METADATA_WATCH = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"


def stored_streams(index: ClusterIndex, api_client: k8s_client.ApiClient) -> tuple[Stream, ...]:
    """List+watch of the metadata of every workload kind that holds GPUs once placed (but pods,
    which the pod stream reads), each optional: an operator's kind the cluster does not serve,
    or the chart's RBAC does not grant, confirms nothing and holds lapse as unconfirmed."""
    custom = k8s_client.CustomObjectsApi(api_client)

    def stream(found: WorkloadKind) -> Stream:
        kind, (version, plural) = found.key, found.resource

        def metadata(**kwargs: Any) -> object:  # a fresh header map each call: the client adds to it
            accept = _METADATA_WATCH if kwargs.get("watch") else _METADATA_LIST
            return custom.list_cluster_custom_object(found.group, version, plural, _headers={"Accept": accept},
                                                     **kwargs)

        def deleted(obj: dict) -> None:
            gone = feed.stored(obj, kind, gone=True)
            index.apply(gone)
            if index.scale_ups is not None and gone.ours:  # its scale-up, if it had one, goes with it
                index.scale_ups.delete(gone.key.split("/", 1)[0], request_name(gone.key))

        def forget(key: str) -> None:
            index.apply(Stored(key, index.stored_stamp(key), gone=True))
        return Stream(plural, metadata, functools.partial(feed.stored_key, kind=kind),
                      feed.upserter(index, kind), deleted, functools.partial(index.keys, kind), forget, optional=True)
    return tuple(stream(found) for found in feed.STORED_KINDS.values())


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


def dra_streams(api_client: k8s_client.ApiClient, index: ClusterIndex) -> tuple[Stream, ...]:
    """List+watch of every DRA kind and PodGroups, each optional (an API the cluster does not
    serve has none). List items carry no kind, so each stream names its own."""
    def stream(plural: str, kind: str, list_call: Callable) -> Stream:
        def forget(key: str) -> None:
            namespace, _, name = key.rpartition("/")
            feed.delete(index, {"metadata": {"name": name, "namespace": namespace or None}}, kind)
        return Stream(plural, list_call, dra_objects.object_key, feed.upserter(index, kind),
                      functools.partial(feed.delete, index, kind=kind), functools.partial(index.keys, kind),
                      forget, optional=True)
    return tuple(stream(plural, kind, make(api_client)) for plural, kind, make in DRA_LISTS)
