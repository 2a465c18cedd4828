"""The workload kinds the webhook handles, in one table: where each keeps its pod templates and how
many pods each makes, which admission operations it is placed on, who places it and whether it
holds GPUs once placed."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

ANY = "*"  # in a path: every entry of a list (or every value of a map) at that point


@dataclass(frozen=True)
class Templates:
    """Where some of a kind's pod templates are, and how many pods each one runs at once."""

    replica_spec: tuple[str, ...]  # path to the spec(s) that own a template; ANY: each entry
    template: tuple[str, ...]  # from a replica spec to its pod template (() for a Pod: itself)
    counts: tuple[str, ...] = ()  # fields of the replica spec multiplied for its pods (absent or null: 1)
    job: tuple[str, ...] | None = None  # a Job spec under the replica spec: its parallelism counts too


@dataclass(frozen=True)
class WorkloadKind:
    name: str
    group: str  # API group ("" is the core group)
    resource: tuple[str, str]  # (version, plural) the API serves it as: where the watch lists it
    templates: tuple[Templates, ...]
    # Operations we place on. Pods are immutable after CREATE, and a Job's template too, so an
    # UPDATE patch would be rejected; on UPDATE the others keep the placement made at creation.
    operations: tuple[str, ...]
    # Made by a controller from a template we placed, it is that workload's own pod (or
    # ReplicaSet): placing it again would book the same GPUs twice. A Job made by a CronJob is
    # placed afresh: the CronJob's placement dates from its creation, not from this run.
    placed_by_owner: bool
    # Holds GPUs once placed. A CronJob's pods start on the schedule, not now: its Jobs hold when
    # they are created.
    reserves: bool
    # Where the object says it is suspended (a queue such as Kueue admits it later by setting it
    # false): placed then, on that UPDATE, and not before. None: the kind cannot be suspended.
    suspend: tuple[str, ...] | None = None

    @property
    def keeps_its_template(self) -> bool:
        """Runs for good from one template (a Deployment, a CronJob...), which keeps what we wrote at
        its creation: the kinds placed on UPDATE too. A Pod's or Job's work ends, and with it what
        was written for it."""
        return "UPDATE" in self.operations


_TEMPLATE = ("template",)
_REPLICAS = ("replicas",)


def _ray(prefix: tuple[str, ...]) -> tuple[Templates, ...]:
    """A Ray cluster: one head pod, and per worker group replicas x numOfHosts pods."""
    return (Templates(prefix + ("headGroupSpec",), _TEMPLATE),
            Templates(prefix + ("workerGroupSpecs", ANY), _TEMPLATE, counts=("replicas", "numOfHosts")))


KINDS: Mapping[str, WorkloadKind] = {kind.name: kind for kind in (
    WorkloadKind("Pod", "", ("v1", "pods"), (Templates((), ()),), ("CREATE",), placed_by_owner=True, reserves=True),
    WorkloadKind("Job", "batch", ("v1", "jobs"), (Templates(("spec",), _TEMPLATE, job=()),), ("CREATE",),
                 placed_by_owner=False, reserves=True, suspend=("spec", "suspend")),
    WorkloadKind("CronJob", "batch", ("v1", "cronjobs"), (Templates(("spec", "jobTemplate", "spec"), _TEMPLATE, job=()),),
                 ("CREATE", "UPDATE"), placed_by_owner=False, reserves=False),
    *(WorkloadKind(name, "apps", ("v1", f"{name.lower()}s"), (Templates(("spec",), _TEMPLATE, counts=_REPLICAS),),
                   ("CREATE", "UPDATE"), placed_by_owner=name == "ReplicaSet", reserves=True)
      for name in ("Deployment", "StatefulSet", "ReplicaSet")),
    # The operators' objects: every pod template gets the one decision for the whole object.
    WorkloadKind("JobSet", "jobset.x-k8s.io", ("v1alpha2", "jobsets"),
                 (Templates(("spec", "replicatedJobs", ANY), ("template", "spec", "template"), counts=_REPLICAS,
                            job=("template", "spec")),), ("CREATE",), placed_by_owner=False, reserves=True,
                 suspend=("spec", "suspend")),
    # Training-operator 1.x: its pods carry the job's key, so they are placed by their owner
    WorkloadKind("PyTorchJob", "kubeflow.org", ("v1", "pytorchjobs"),
                 (Templates(("spec", "pytorchReplicaSpecs", ANY), _TEMPLATE, counts=_REPLICAS),), ("CREATE",),
                 placed_by_owner=False, reserves=True, suspend=("spec", "runPolicy", "suspend")),
    WorkloadKind("MPIJob", "kubeflow.org", ("v2beta1", "mpijobs"), (Templates(("spec", "mpiReplicaSpecs", ANY), _TEMPLATE, counts=_REPLICAS),),
                 ("CREATE",), placed_by_owner=False, reserves=True, suspend=("spec", "runPolicy", "suspend")),
    WorkloadKind("RayCluster", "ray.io", ("v1", "rayclusters"), _ray(("spec",)), ("CREATE", "UPDATE"), placed_by_owner=False,
                 reserves=True),
    WorkloadKind("RayJob", "ray.io", ("v1", "rayjobs"), _ray(("spec", "rayClusterSpec")), ("CREATE",), placed_by_owner=False,
                 reserves=True, suspend=("spec", "suspend")),
)}


def supports(group: str, kind: str) -> bool:
    """A kind we place, of its API group (a `Job` of another group is not a batch Job)."""
    return kind in KINDS and KINDS[kind].group == group
