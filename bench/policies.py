"""Placement policies, all behind one interface and all gang-placed (every pod of a job or none).

Baselines are node-level scorers as ../shared/reference/traces-and-metrics.md section 5.7 defines them;
kube-scheduler places a job's pods one at a time and breaks score ties at random, as it does
(selectHost samples among the best-scored nodes). GPU ids inside a node come from
fabric.pick_gpus for every baseline (the device plugin's NVLink-aware preferred allocation).
"""
from __future__ import annotations

import dataclasses
import random
from typing import Callable

from webhook.cluster import ClusterIndex
from webhook.injection import GPU_IDS as GPU_IDS_ANNOTATION
from webhook.config import Config
from webhook.demo import make_pod
from webhook.gpus import format_gpu_set
from webhook.model import Outcome, PlacementRequest, Strategy
from webhook.placer import place

from .costmodel import Network
from .fabric import SimCluster, SimNode, pick_gpus
from .traces import Job

# One pod's placement: (node name, GPU ids).
PodPlacement = tuple[str, tuple[int, ...]]


class NeverFits(Exception):
    """No amount of waiting helps: the job is rejected, not queued."""


class Policy:
    """`place` answers with one (node, gpu ids) per pod, or None to keep the job queued."""

    name = "policy"

    def reset(self, cluster: SimCluster, seed: int) -> None:
        self.cluster = cluster
        self.rng = random.Random(seed)

    def place(self, job: Job) -> list[PodPlacement] | None:
        raise NotImplementedError

    def started(self, job: Job, pods: list[PodPlacement]) -> None:
        """The simulator bound the pods (policies that keep their own view update it here)."""

    def finished(self, job: Job, pods: list[PodPlacement]) -> None:
        """The job's pods are gone."""


class NodeScorer(Policy):
    """kube-scheduler with one NodeResourcesFit scoring strategy over nvidia.com/gpu: filter nodes
    with room for the pod, score them, pick the best (random among ties), repeat per pod."""

    def __init__(self, name: str, score: Callable[[int, int], float] | None) -> None:
        self.name = name
        self.score = score  # (free GPUs, GPUs asked) -> higher is better; None = every node ties

    def place(self, job: Job) -> list[PodPlacement] | None:
        taken: dict[str, set[int]] = {}
        pods: list[PodPlacement] = []
        for _ in range(job.pods):
            best: list[SimNode] = []
            best_score = None
            for node in self.cluster.nodes:
                free = len(node.free) - len(taken.get(node.name, ()))
                if free < job.gpus_per_pod:
                    continue
                score = self.score(free, job.gpus_per_pod) if self.score else 0.0
                if best_score is None or score > best_score:
                    best, best_score = [node], score
                elif score == best_score:
                    best.append(node)
            if not best:
                return None
            node = self.rng.choice(best)
            ids = _pick_excluding(node, taken.get(node.name, set()), job.gpus_per_pod)
            taken.setdefault(node.name, set()).update(ids)
            pods.append((node.name, ids))
        return pods


def _pick_excluding(node: SimNode, taken: set[int], count: int) -> tuple[int, ...]:
    """pick_gpus on the node as it will be once this job's earlier pods hold `taken`."""
    if not taken:
        return pick_gpus(node, count)
    view = SimNode(node.name, node.zone, node.spine, node.leaf, node.domains, node.free - taken)
    return pick_gpus(view, count)


def least_allocated() -> NodeScorer:
    """The default scheduler's spread: most free GPUs left after placing wins."""
    return NodeScorer("spread (LeastAllocated)", lambda free, ask: free - ask)


def most_allocated() -> NodeScorer:
    """Best-fit bin packing: fewest free GPUs left after placing wins."""
    return NodeScorer("best-fit (MostAllocated)", lambda free, ask: -(free - ask))


def random_fit() -> NodeScorer:
    return NodeScorer("random", None)


class KueueBestFit(Policy):
    """Kueue TAS as peers.md 1.3-1.4 describes it, default profile, over levels zone > spine > leaf >
    hostname with pod counts per domain. Multi-pod jobs ask `podset-preferred-topology: leaf` (BestFit,
    escalating a level at a time; at the top level several zones are gathered). Single-pod jobs carry
    no annotation and are therefore unconstrained: LeastFreeCapacity at hostname level."""

    name = "Kueue TAS BestFit"
    LEVELS = ("zone", "spine", "leaf")

    def place(self, job: Job) -> list[PodPlacement] | None:
        count = {n.name: len(n.free) // job.gpus_per_pod for n in self.cluster.nodes}
        if job.pods == 1:
            fitting = sorted((c, name) for name, c in count.items() if c >= 1)
            if not fitting:
                return None
            name = fitting[0][1]
            return [(name, pick_gpus(self.cluster.by_name[name], job.gpus_per_pod))]
        chosen = self._pick_level(job.pods, count)
        if chosen is None:
            return None
        level, domains = chosen
        # Phase 2b: pool the children of every chosen domain and re-run the greedy pick per level.
        for child_level in self.LEVELS[self.LEVELS.index(level) + 1:] + ("node",):
            pool = {}
            for node in self.cluster.nodes:
                if getattr(node, level) in domains:
                    key = node.name if child_level == "node" else getattr(node, child_level)
                    pool[key] = pool.get(key, 0) + count[node.name]
            domains = _greedy_best_fit(pool, job.pods)
            level = child_level if child_level != "node" else "name"
        return [(name, pick_gpus(self.cluster.by_name[name], job.gpus_per_pod))
                for name, pods in sorted(domains.items()) for _ in range(pods)]

    def _pick_level(self, pods: int, count: dict[str, int]) -> tuple[str, dict[str, int]] | None:
        """Phase 2a: BestFit at the preferred level (leaf), one level up while nothing fits."""
        for level in reversed(self.LEVELS):
            per_domain: dict[str, int] = {}
            for node in self.cluster.nodes:
                key = getattr(node, level)
                per_domain[key] = per_domain.get(key, 0) + count[node.name]
            fitting = [(c, name) for name, c in per_domain.items() if c >= pods]
            if fitting:
                c, name = min(fitting)
                return level, {name: pods}
        top = {}
        for node in self.cluster.nodes:
            top[node.zone] = top.get(node.zone, 0) + count[node.name]
        gathered = _greedy_best_fit(top, pods)
        return ("zone", gathered) if gathered else None


def _greedy_best_fit(capacity: dict[str, int], need: int) -> dict[str, int]:
    """Kueue's set-counts step: take domains by free capacity, most first (names break ties), until one
    domain can hold the remainder; that last one is the tightest that does. {} when short."""
    order = sorted(((c, name) for name, c in capacity.items() if c > 0), key=lambda t: (-t[0], t[1]))
    out: dict[str, int] = {}
    remaining = need
    while remaining > 0 and order:
        holding = [(c, name) for c, name in order if c >= remaining]
        if holding:
            c, name = min(holding)
            out[name] = remaining
            return out
        c, name = order.pop(0)
        out[name] = c
        remaining -= c
    return {}


class BySize(Policy):
    """One policy for single-pod jobs, another for multi-pod ones, both kept current: used to tell
    which half of a policy's decisions a difference in results comes from."""

    def __init__(self, name: str, single: Policy, multi: Policy) -> None:
        self.name, self.single, self.multi = name, single, multi

    def reset(self, cluster: SimCluster, seed: int) -> None:
        super().reset(cluster, seed)
        self.single.reset(cluster, seed)
        self.multi.reset(cluster, seed)

    def place(self, job: Job) -> list[PodPlacement] | None:
        return (self.single if job.pods == 1 else self.multi).place(job)

    def started(self, job: Job, pods: list[PodPlacement]) -> None:
        self.single.started(job, pods)
        self.multi.started(job, pods)

    def finished(self, job: Job, pods: list[PodPlacement]) -> None:
        self.single.finished(job, pods)
        self.multi.finished(job, pods)


def core_config(network: Network) -> Config:
    """Our default config, with the simulated fabric's oversubscription so the core's own bandwidth
    estimate describes the same network (decisions do not depend on it)."""
    zone, spine, leaf = Config().levels
    return Config(levels=(dataclasses.replace(zone, oversubscription=network.rho_spine),
                          dataclasses.replace(spine, oversubscription=network.rho_leaf),
                          dataclasses.replace(leaf, oversubscription=1.0)),
                  cluster_oversubscription=network.rho_zone)


class Ours(Policy):
    """Our placement core, webhook.placement.place, on a ClusterIndex fed the same Node objects and
    the simulator's bound pods. The simulator binds pods to the nodes of our assignment and to its
    GPU ids. For consolidated that is kube-scheduler inside the pinned domain picking our nodes; for
    balanced it assumes the preference is honoured; both are stated in RESULTS.md."""

    def __init__(self, strategy: Strategy, network: Network) -> None:
        self.strategy = strategy
        self.config = core_config(network)
        self.name = f"ours ({strategy.value})"

    def reset(self, cluster: SimCluster, seed: int) -> None:
        super().reset(cluster, seed)
        self.index = ClusterIndex.from_objects(self.config, cluster.node_objects, [])

    def place(self, job: Job) -> list[PodPlacement] | None:
        decision = place(self.index, PlacementRequest(f"Job sim/{job.job_id}", job.pods, job.gpus_per_pod,
                                                      self.strategy))
        if decision.outcome is Outcome.NEVER:
            raise NeverFits(decision.reasons[0])
        if decision.outcome is Outcome.WAIT:
            return None
        return [(a.node, ids) for a in decision.assignment for ids in a.gpu_ids]

    def started(self, job: Job, pods: list[PodPlacement]) -> None:
        for pod in self._pods(job, pods):
            self.index.upsert_pod(pod)

    def finished(self, job: Job, pods: list[PodPlacement]) -> None:
        for pod in self._pods(job, pods):
            self.index.delete_pod(pod)

    @staticmethod
    def _pods(job: Job, pods: list[PodPlacement]) -> list[dict]:
        return [make_pod(f"{job.job_id}-{i}", node, len(ids), namespace="sim",
                         annotations={GPU_IDS_ANNOTATION: format_gpu_set(ids)})
                for i, (node, ids) in enumerate(pods)]
