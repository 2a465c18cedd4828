"""The workload kinds the webhook handles, in one table: where each keeps its pod templates and how
many pods each makes, which admission operations it is placed on, who places it and whether it
holds GPUs once placed. A kind is one registration here (and a test table row): the chart's
webhook rules and RBAC (charts/topology-webhook/files/kinds.yaml, written by .ci/chart_kinds.py)
and the view's watches follow this table."""
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
    # Where the object itself names the scheduler of all its pods (beside each template's own).
    scheduler: tuple[str, ...] | None = None
    # How reservation keys and messages name it: its kind, or, for one whose kind's name another
    # group's kind has (Volcano's Job), kind.group as kubectl writes it.
    label: str = ""
    # The operations the chart registers the webhook for (charts/topology-webhook/files/kinds.yaml):
    # creation, and updates where a queue may un-suspend it (a Job) or an operator's object changes.
    registered: tuple[str, ...] = ("CREATE",)

    @property
    def key(self) -> str:
        return self.label or self.name


    @property
    def keeps_its_template(self) -> bool:
        """Runs for good from one template (a Deployment, a CronJob...), which keeps what we wrote at
        its creation: the kinds placed on UPDATE too. A Pod's or Job's work ends, and with it what
        was written for it."""
        return "UPDATE" in self.operations


_TEMPLATE = ("template",)
_UPDATED = ("CREATE", "UPDATE")
_REPLICAS = ("replicas",)


def _ray(prefix: tuple[str, ...]) -> tuple[Templates, ...]:
    """A Ray cluster: one head pod, and per worker group replicas x numOfHosts pods."""
    return (Templates(prefix + ("headGroupSpec",), _TEMPLATE),
            Templates(prefix + ("workerGroupSpecs", ANY), _TEMPLATE, counts=("replicas", "numOfHosts")))


REGISTRY: tuple[WorkloadKind, ...] = (
    WorkloadKind("Pod", "", ("v1", "pods"), (Templates((), ()),), ("CREATE",), placed_by_owner=True, reserves=True),
    WorkloadKind("Job", "batch", ("v1", "jobs"), (Templates(("spec",), _TEMPLATE, job=()),), ("CREATE",),
                 placed_by_owner=False, reserves=True, suspend=("spec", "suspend"), registered=_UPDATED),
    WorkloadKind("CronJob", "batch", ("v1", "cronjobs"), (Templates(("spec", "jobTemplate", "spec"), _TEMPLATE, job=()),),
                 ("CREATE", "UPDATE"), placed_by_owner=False, reserves=False),
    *(WorkloadKind(name, "apps", ("v1", f"{name.lower()}s"), (Templates(("spec",), _TEMPLATE, counts=_REPLICAS),),
                   ("CREATE", "UPDATE"), placed_by_owner=name == "ReplicaSet", reserves=True)
      for name in ("Deployment", "StatefulSet", "ReplicaSet")),
    # The operators' objects: every pod template gets the one decision for the whole object.
    WorkloadKind("JobSet", "jobset.x-k8s.io", ("v1alpha2", "jobsets"),
                 (Templates(("spec", "replicatedJobs", ANY), ("template", "spec", "template"), counts=_REPLICAS,
                            job=("template", "spec")),), ("CREATE",), placed_by_owner=False, reserves=True,
                 suspend=("spec", "suspend"), registered=_UPDATED),
    # Training-operator 1.x: its pods carry the job's key, so they are placed by their owner
    WorkloadKind("PyTorchJob", "kubeflow.org", ("v1", "pytorchjobs"),
                 (Templates(("spec", "pytorchReplicaSpecs", ANY), _TEMPLATE, counts=_REPLICAS),), ("CREATE",),
                 placed_by_owner=False, reserves=True, suspend=("spec", "runPolicy", "suspend"), registered=_UPDATED),
    WorkloadKind("MPIJob", "kubeflow.org", ("v2beta1", "mpijobs"), (Templates(("spec", "mpiReplicaSpecs", ANY), _TEMPLATE, counts=_REPLICAS),),
                 ("CREATE",), placed_by_owner=False, reserves=True, suspend=("spec", "runPolicy", "suspend"), registered=_UPDATED),
    WorkloadKind("RayCluster", "ray.io", ("v1", "rayclusters"), _ray(("spec",)), ("CREATE", "UPDATE"), placed_by_owner=False,
                 reserves=True, registered=_UPDATED),
    WorkloadKind("RayJob", "ray.io", ("v1", "rayjobs"), _ray(("spec", "rayClusterSpec")), ("CREATE",), placed_by_owner=False,
                 reserves=True, suspend=("spec", "suspend"), registered=_UPDATED),
    # Volcano's Job: its tasks, each `replicas` pods of one template, placed together as one
    # group (its `minAvailable` is the gang Volcano's own scheduler starts). Its pods name
    # Volcano's scheduler unless the Job says otherwise: then Volcano places them, not us.
    WorkloadKind("Job", "batch.volcano.sh", ("v1alpha1", "jobs"), (Templates(("spec", "tasks", ANY), _TEMPLATE,
                                                                             counts=_REPLICAS),),
                 ("CREATE",), placed_by_owner=False, reserves=True, scheduler=("spec", "schedulerName"),
                 label="Job.batch.volcano.sh"),
)
# Every kind by (API group, kind): a `Job` of another group is not a batch Job.
KINDS: Mapping[tuple[str, str], WorkloadKind] = {(kind.group, kind.name): kind for kind in REGISTRY}
# By the name reservation keys give them (namespace/<key>/name).
BY_KEY: Mapping[str, WorkloadKind] = {kind.key: kind for kind in REGISTRY}
POD = KINDS[("", "Pod")]


def kind_of(group: str, name: str) -> WorkloadKind | None:
    """The kind we place of that API group and name; None for any other."""
    return KINDS.get((group, name))


def kind_of_object(obj: Mapping) -> WorkloadKind | None:
    """The kind we place of an object as written (its apiVersion's group and its kind); None for any other."""
    return kind_of(str(obj.get("apiVersion") or "").rpartition("/")[0], str(obj.get("kind") or ""))
