"""Placement policies, all behind one interface and all gang-placed (every pod of a job or none).

Baselines are kube-scheduler's node-level scorers (NodeResourcesFit LeastAllocated and MostAllocated:
https://kubernetes.io/docs/concepts/configuration/resource-bin-packing/);
kube-scheduler places a job's pods one at a time and breaks score ties at random, as it does
(selectHost samples among the best-scored nodes). GPU ids inside a node come from
fabric.pick_gpus for every baseline (the device plugin's NVLink-aware preferred allocation).
"""
from __future__ import annotations

import bisect
import dataclasses
import random
from typing import Callable

from webhook.core.gpus import format_gpu_set
from webhook.core.injection import GPU_IDS as GPU_IDS_ANNOTATION
from webhook.core.injection import RESERVATION, WAITING_FOR, waited_domain
from webhook.core.model import Decision, Hold, NodeRequirement, Outcome, PlacementRequest, Strategy
from webhook.core.orderings import DEFAULT as DEFAULT_ORDERINGS
from webhook.core.orderings import Orderings
from webhook.kube.demo import make_pod
from webhook.objects import feed
from webhook.objects.feed import index_of
from webhook.placement.placer import place, place_gated
from webhook.settings.config import Config

from .costmodel import Network
from .fabric import GPUS_PER_NODE, SimCluster, SimNode, pick_gpus
from .traces import Job

# One pod's placement: (node name, GPU ids).
PodPlacement = tuple[str, tuple[int, ...]]


class NeverFits(Exception):
    """No amount of waiting helps: the job is rejected, not queued."""


class Policy:
    """`place` answers with one (node, gpu ids) per pod, or None to keep the job queued."""

    name = "policy"
    now = 0.0  # the simulated time (tick)
    # The queue's discipline (bench/engine.py): False, a job that cannot start does not hold back
    # the jobs behind it (kube-scheduler's queue, Kueue's BestEffortFIFO); True, the oldest queued
    # job blocks every newer one while it cannot start (Kueue's StrictFIFO).
    strict_fifo = False
    # Its pods wait for Kueue's topology ungater after admission (engine.Runtime.kueue_ungate_s).
    ungated_by_kueue = False

    def reset(self, cluster: SimCluster, seed: int) -> None:
        self.cluster = cluster
        self.rng = random.Random(seed)

    def place(self, job: Job) -> list[PodPlacement] | None:
        raise NotImplementedError

    def tick(self, now: float) -> None:
        """The simulated time is now `now` (the engine says so before each pass)."""
        self.now = now

    def held_to(self, job: Job) -> frozenset[str] | None:
        """The nodes a job that had to wait is held to, where only GPUs freed on them can let it
        start; None when it may go anywhere in the cluster (its "wait" then means no room for its
        size anywhere)."""
        return None

    def redecided(self, job: Job) -> bool:
        """Whether a job that had to wait, held to no nodes (`held_to` None), is still not free to
        go anywhere: decided again at every release, its wait says nothing of other jobs."""
        return False

    def decides_at_arrival(self, job: Job) -> bool:
        """Whether the policy decides a job when its pods are created, room or not (a webhook:
        ours), rather than when the job could start (a scheduler: asked earlier it would only
        fail). The engine asks at arrival only when its `Runtime.decide_at_arrival` is on."""
        return False

    def fit_class(self, shape: tuple[int, int]) -> object:
        """Jobs of shapes (pods, GPUs per pod) of one class fit monotonically: when one that may go
        anywhere finds no room, none with as many pods, each as large, of its class can start
        until GPUs are freed (the engine skips them). One class unless a policy's fit changes with
        the shape otherwise (Kueue's required level grows with the job: `KueueBestFit`)."""
        return None

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
        cluster, ask = self.cluster, job.gpus_per_pod
        taken: dict[str, set[int]] = {}
        lowered: dict[int, int] = {}  # node position -> free GPUs once this job's earlier pods hold theirs
        pods: list[PodPlacement] = []
        for _ in range(job.pods):
            # The nodes kube-scheduler would tie on, in node order: those with the best-scoring free
            # count, read from the cluster's nodes by free count (scores depend on it alone).
            counts = [f for f in range(ask, GPUS_PER_NODE + 1)
                      if any(i not in lowered for i in cluster.by_free[f]) or f in lowered.values()]
            if not counts:
                return None
            if self.score is not None:
                top = max(self.score(f, ask) for f in counts)
                counts = [f for f in counts if self.score(f, ask) == top]
            node = cluster.nodes[self._tied_pick(counts, lowered)]
            ids = _pick_excluding(node, taken.get(node.name, set()), ask)
            taken.setdefault(node.name, set()).update(ids)
            position = cluster.position[node.name]
            lowered[position] = lowered.get(position, cluster.free_count[position]) - ask
            pods.append((node.name, ids))
        return pods


    def _tied_pick(self, counts: list[int], lowered: dict[int, int]) -> int:
        """rng.choice over the tied nodes in node order (the same draw as on the list itself). One
        free count with none of this job's nodes lowered into it, the usual case, is read in place."""
        buckets = self.cluster.by_free
        if len(counts) == 1 and counts[0] not in lowered.values():
            bucket = buckets[counts[0]]
            skipped = sorted(bisect.bisect_left(bucket, i) for i in lowered if self.cluster.free_count[i] == counts[0])
            k = self.rng._randbelow(len(bucket) - len(skipped))  # what rng.choice draws for that length
            for at in skipped:  # the k-th of the bucket without the skipped positions
                if at <= k:
                    k += 1
            return bucket[k]
        return self.rng.choice(sorted([i for f in counts for i in buckets[f] if i not in lowered]
                                      + [i for i, f in lowered.items() if f in counts]))


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
    """Kueue TAS as KEP-2724 and its findTopologyAssignment describe it (kubernetes-sigs/kueue,
    keps/2724-topology-aware-scheduling and pkg/cache/scheduler/tas_flavor_snapshot.go), default
    profile (TASProfileMixed: BestFit for required and preferred, LeastFreeCapacity for unconstrained), over
    levels zone > spine > leaf > hostname with pod counts per domain. Single-pod jobs carry no
    annotation and are therefore unconstrained: LeastFreeCapacity at hostname level (a PodSet
    without one on a ClusterQueue of TAS flavors is unconstrained at the lowest level). Multi-pod
    jobs carry one annotation (on the pod template, as kueue.sigs.k8s.io's topology-aware
    scheduling page documents it), by `topology`:

    - "preferred" (`podset-preferred-topology: leaf`): BestFit at leaf, one level up while nothing
      fits, and at the top level several zones gathered (findTopologyAssignment: preferred
      retries one level up; at the top level it gathers domains greedily).
    - "required" (`podset-required-topology` at the narrowest level whose one domain holds the job
      on an idle cluster: hostname, leaf, spine or zone): BestFit at that level only; when no
      domain there has room the job waits, it is never placed wider (findTopologyAssignment:
      required fails when no domain of its level fits). A job that no zone holds even idle cannot
      be given a required level any domain satisfies; it is given the preferred annotation instead.

    The queue is the engine's: BestEffortFIFO (the ClusterQueue default) unless `strict_fifo`,
    StrictFIFO, where the oldest workload that cannot be admitted blocks every newer one
    (https://kueue.sigs.k8s.io/docs/concepts/cluster_queue/#queueing-strategy: "Older workloads
    that can't be admitted will block newer workloads, even if the newer workloads fit in the
    available quota"; in kubernetes-sigs/kueue pkg/cache/queue/cluster_queue.go a StrictFIFO head
    that does not fit stays in the heap, and equivalent workloads are not skipped past it).
    Priorities, quotas, cohorts and preemption are not modelled: one ClusterQueue, one priority."""

    LEVELS = ("zone", "spine", "leaf")
    TOPOLOGIES = ("preferred", "required")
    ungated_by_kueue = True

    def __init__(self, topology: str = "preferred", strict_fifo: bool = False) -> None:
        if topology not in self.TOPOLOGIES:
            raise ValueError(f"topology {topology!r} is not one of {', '.join(self.TOPOLOGIES)}")
        self.topology = topology
        self.strict_fifo = strict_fifo
        self.name = "Kueue TAS BestFit" + (", required" if topology == "required" else "") + (
            ", StrictFIFO" if strict_fifo else "")

    def reset(self, cluster: SimCluster, seed: int) -> None:
        super().reset(cluster, seed)
        # Nodes of the largest domain of each level: what one domain holds on an idle cluster.
        self.idle_nodes = {level: max(len(m) for m in cluster.members[level].values()) for level in self.LEVELS}

    def required_level(self, pods: int, gpus: int) -> str | None:
        """The level a multi-pod job is required at: the narrowest whose one domain holds it on an
        idle cluster ("hostname" when one node does); None for a job no zone holds, which is
        given the preferred annotation (and for every job in the preferred mode)."""
        if self.topology != "required":
            return None
        per_node = GPUS_PER_NODE // gpus
        if pods <= per_node:
            return "hostname"
        for level in reversed(self.LEVELS):
            if pods <= self.idle_nodes[level] * per_node:
                return level
        return None

    def fit_class(self, shape: tuple[int, int]) -> object:
        """Required at a level, a job fits as one domain of that level has room: monotone only among
        jobs required at the same level (one of 8 pods may wait for a leaf while one of 9, required
        at spine, fits a spine)."""
        pods, gpus = shape
        return None if pods == 1 else self.required_level(pods, gpus)

    def place(self, job: Job) -> list[PodPlacement] | None:
        cluster, gpus = self.cluster, job.gpus_per_pod
        if job.pods == 1:
            # LeastFreeCapacity: the fewest pods that fit, then the first name (node order is name order)
            fits = [(f // gpus, cluster.by_free[f][0]) for f in range(gpus, GPUS_PER_NODE + 1) if cluster.by_free[f]]
            if not fits:
                return None
            name = cluster.nodes[min(fits)[1]].name
            return [(name, pick_gpus(cluster.by_name[name], gpus))]
        required = self.required_level(job.pods, gpus)
        if required == "hostname":
            return self._one_node(job)
        chosen = self._pick_level(job.pods, gpus, required)
        if chosen is None:
            return None
        level, domains = chosen
        # Phase 2b: pool the children of every chosen domain and re-run the greedy pick per level.
        for child_level in self.LEVELS[self.LEVELS.index(level) + 1:] + ("node",):
            pool: dict[str, int] = {}
            for domain in domains:
                for i in cluster.members[level][domain]:
                    node = cluster.nodes[i]
                    key = node.name if child_level == "node" else getattr(node, child_level)
                    pool[key] = pool.get(key, 0) + cluster.free_count[i] // gpus
            domains = _greedy_best_fit(pool, job.pods)
            level = child_level
        return self._pods_on(sorted(domains.items()), gpus)

    def _pods_on(self, counts: list[tuple[str, int]], gpus: int) -> list[PodPlacement]:
        """`pods` pods of `gpus` GPUs on each named node, no GPU given twice: several pods of fewer
        than 8 GPUs may share a node (before streams of version 2 every multi-pod job was pods of 8)."""
        placement: list[PodPlacement] = []
        for name, pods in counts:
            node, taken = self.cluster.by_name[name], set[int]()
            for _ in range(pods):
                ids = _pick_excluding(node, taken, gpus)
                taken.update(ids)
                placement.append((name, ids))
        return placement

    def _one_node(self, job: Job) -> list[PodPlacement] | None:
        """Required at hostname: BestFit over nodes, the one with the fewest pods that fit that still
        holds them all, then the first name."""
        cluster, gpus = self.cluster, job.gpus_per_pod
        fits = [(f // gpus, cluster.by_free[f][0]) for f in range(job.pods * gpus, GPUS_PER_NODE + 1)
                if cluster.by_free[f]]
        if not fits:
            return None
        return self._pods_on([(cluster.nodes[min(fits)[1]].name, job.pods)], gpus)

    def _pick_level(self, pods: int, gpus: int, required: str | None = None) -> tuple[str, dict[str, int]] | None:
        """Phase 2a: BestFit at the required level only; or at the preferred level (leaf), one
        level up while nothing fits, and several zones gathered at the top."""
        for level in (required,) if required else reversed(self.LEVELS):
            fitting = [(c, name) for name in self.cluster.histogram[level]
                       if (c := self.cluster.fitting(level, name, gpus)) >= pods]
            if fitting:
                c, name = min(fitting)
                return level, {name: pods}
        if required:
            return None  # required: wait, never wider
        top = {zone: self.cluster.fitting("zone", zone, gpus) for zone in self.cluster.histogram["zone"]}
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

    def tick(self, now: float) -> None:
        self.single.tick(now)
        self.multi.tick(now)

    def place(self, job: Job) -> list[PodPlacement] | None:
        return self._for(job).place(job)

    def held_to(self, job: Job) -> frozenset[str] | None:
        return self._for(job).held_to(job)

    def redecided(self, job: Job) -> bool:
        return self._for(job).redecided(job)

    def decides_at_arrival(self, job: Job) -> bool:
        return self._for(job).decides_at_arrival(job)

    def _for(self, job: Job) -> Policy:
        return self.single if job.pods == 1 else self.multi

    def started(self, job: Job, pods: list[PodPlacement]) -> None:
        self.single.started(job, pods)
        self.multi.started(job, pods)

    def finished(self, job: Job, pods: list[PodPlacement]) -> None:
        self.single.finished(job, pods)
        self.multi.finished(job, pods)


def core_config(network: Network) -> Config:
    """Our default config, with the simulated fabric's oversubscription so the core's own bandwidth
    estimate describes the same network: placed decisions do not depend on it, but how wide a
    wait is pinned does (`pin_only_where_locality_pays`). The levels are set, not `auto`: `auto`
    would take the default preset's oversubscription from the nodes' labels."""
    zone, spine, leaf = Config().levels
    return Config(levels=(dataclasses.replace(zone, oversubscription=network.rho_spine),
                          dataclasses.replace(spine, oversubscription=network.rho_leaf),
                          dataclasses.replace(leaf, oversubscription=1.0)), levels_auto=False,
                  cluster_oversubscription=network.rho_zone)


class Ours(Policy):
    """Our placement core, webhook.placement.placer.place, on a ClusterIndex fed the same Node objects and
    the simulator's bound pods. What the cluster then does with each answer follows what the
    mutation writes (webhook.placement.enforce.pins):

    - Placed: the pods are bound to the nodes and GPU ids of our assignment. For consolidated that is
      kube-scheduler inside the pinned domain picking our nodes; for balanced it assumes the
      preference is honoured (the domain has room for every pod).
    - Wait, pinned (consolidated, and balanced where `pin_only_where_locality_pays` weighed the
      wait): the pods are pinned (required node affinity) to the domain the wait names, and the job
      is not decided again. It starts once that domain holds every pod: our best fit inside it
      (ours asked with it as the preferred domain; for a node, the device plugin's GPU choice
      there). Until then it waits, whatever room opens elsewhere.
    - Wait, preferred (a one-pod job's, distributed's, and balanced's when its waits are not
      weighed), which the mutation writes as a preference: the pods only prefer that domain (weight
      100). Once it holds every pod, as above. Before that, as soon as the cluster holds them,
      kube-scheduler places them pod by pod (`kube_scheduler_with_preference`) instead of waiting.

    - Wait, gated (`gate_waits`: what would be pinned is held by a scheduling gate instead,
      `Hold.GATE`): the releaser decides the job again at every release, oldest first (the
      engine's pass), and starts it in its domain or in one no wider as soon as one holds it
      (placer.place_gated).

    A pinned or gated wait's pods are given to the index pending, with the `waiting-for`
    annotation the mutation writes, so protection (`protect_waiting_seconds`) sees them as the
    webhook's live view would; the index's clock is the simulated time.

    `pinned=False` decides the job afresh at every pass, as if nothing had been written on a
    wait: how the simulator ran before 25 Nov 2026, kept to reproduce earlier figures. `settings`
    replace our default config's (e.g. `protect_waiting_seconds=0` for an ablation, `gate_waits=True`);
    `orderings` are the sort keys the index is built with (a rule of ABLATIONS switched off)."""

    def __init__(self, strategy: Strategy, network: Network, pinned: bool = True, label: str = "",
                 orderings: Orderings = DEFAULT_ORDERINGS, **settings: object) -> None:
        self.strategy = strategy
        self.orderings = orderings
        self.config = dataclasses.replace(core_config(network), **settings)  # type: ignore[arg-type]
        self.pinned = pinned
        self.name = f"ours ({strategy.value})" + ("" if pinned else ", re-decided each pass") + label

    def reset(self, cluster: SimCluster, seed: int) -> None:
        super().reset(cluster, seed)
        self.index = index_of(self.config, cluster.node_objects, [], clock=lambda: self.now, orderings=self.orderings)
        self.labels = [o["metadata"]["labels"] for o in cluster.node_objects]
        self.admitted: dict[tuple[NodeRequirement, ...], list[int]] = {}  # node affinity -> positions of its nodes
        self.waiting: dict[str, tuple[Decision, list[int]]] = {}  # job id -> its wait and the nodes it names
        self.held: dict[str, frozenset[str]] = {}  # waiting jobs held to their domain (pinned) -> its nodes
        self.gated: set[str] = set()  # waiting jobs held by a scheduling gate

    def held_to(self, job: Job) -> frozenset[str] | None:
        return self.held.get(job.job_id)

    def redecided(self, job: Job) -> bool:
        return job.job_id in self.gated

    def decides_at_arrival(self, job: Job) -> bool:
        return True

    def anywhere_for(self, wait: Decision) -> bool:
        """Whether a job told `wait` may still go anywhere (only prefers the domain it names)."""
        return wait.hold is Hold.PREFER

    def place(self, job: Job) -> list[PodPlacement] | None:
        if job.job_id in self.waiting:
            return self._after_wait(job, *self.waiting[job.job_id])
        decision = self._decide(job, None)
        if decision.outcome is Outcome.WAIT:
            if self.pinned and decision.scope is not None and decision.requirements:
                nodes = self._nodes_of(decision)
                self.waiting[job.job_id] = (decision, nodes)
                if decision.hold is Hold.GATE:
                    self.gated.add(job.job_id)
                elif not self.anywhere_for(decision):
                    self.held[job.job_id] = frozenset(self.cluster.nodes[i].name for i in nodes)
                domain = waited_domain(decision)
                if domain is not None:
                    for pod in self._pods(job, [(None, (0,) * job.gpus_per_pod)] * job.pods):
                        pod["metadata"]["annotations"][WAITING_FOR] = domain
                        feed.upsert(self.index, pod, "Pod")
            return None
        return self._assignment(decision)

    def _request(self, job: Job, preferred: str | None = None) -> PlacementRequest:
        return PlacementRequest(f"Job sim/{job.job_id}", job.pods, job.gpus_per_pod, self.strategy,
                                preferred_domain=preferred)

    def _decide(self, job: Job, preferred: str | None) -> Decision:
        decision = place(self.index, self._request(job, preferred), _key(job))
        if decision.outcome is Outcome.NEVER:
            raise NeverFits(decision.reasons[0])
        return decision

    @staticmethod
    def _assignment(decision: Decision) -> list[PodPlacement]:
        return [(a.node, ids) for a in decision.assignment for ids in a.gpu_ids]

    def _nodes_of(self, decision: Decision) -> list[int]:
        """Positions of the nodes the wait's node affinity admits (the simulated nodes never change,
        and many waits name the same domain)."""
        if decision.requirements not in self.admitted:
            self.admitted[decision.requirements] = [
                i for i, labels in enumerate(self.labels)
                if all(labels.get(r.key) in r.values if r.values else r.key not in labels for r in decision.requirements)]
        return self.admitted[decision.requirements]

    def _after_wait(self, job: Job, wait: Decision, nodes: list[int]) -> list[PodPlacement] | None:
        cluster, gpus = self.cluster, job.gpus_per_pod
        if job.job_id in self.gated:
            assert wait.scope is not None
            decision = place_gated(self.index, self._request(job), wait.scope, _key(job))
            return None if decision is None else self._assignment(decision)
        if sum(cluster.free_count[i] // gpus for i in nodes) >= job.pods:  # the named domain holds it now
            if len(nodes) == 1:  # pinned to a node: the device plugin picks the GPUs there
                node, taken = cluster.nodes[nodes[0]], set()
                placement = []
                for _ in range(job.pods):
                    ids = _pick_excluding(node, taken, gpus)
                    taken.update(ids)
                    placement.append((node.name, ids))
                return placement
            assert wait.scope is not None
            decision = self._decide(job, f"{wait.scope.level_name}={wait.scope.name}")
            inside = {cluster.nodes[i].name for i in nodes}
            if decision.outcome is Outcome.PLACED and all(a.node in inside for a in decision.assignment):
                return self._assignment(decision)
            return None  # not expected: a preferred domain with room is searched first
        if job.job_id in self.held:
            return None
        return kube_scheduler_with_preference(cluster, self.rng, job, set(nodes))

    def started(self, job: Job, pods: list[PodPlacement]) -> None:
        self.waiting.pop(job.job_id, None)
        self.held.pop(job.job_id, None)
        self.gated.discard(job.job_id)
        for pod in self._pods(job, pods):
            feed.upsert(self.index, pod, "Pod")

    def finished(self, job: Job, pods: list[PodPlacement]) -> None:
        for pod in self._pods(job, pods):
            feed.delete(self.index, pod, "Pod")

    @staticmethod
    def _pods(job: Job, pods: list[tuple[str | None, tuple[int, ...]]]) -> list[dict]:
        """The job's pods, bound to their nodes with their GPU ids, or pending (node None) with
        the job's reservation key."""
        return [make_pod(f"{job.job_id}-{i}", node, len(ids), namespace="sim", annotations=(
                    {GPU_IDS_ANNOTATION: format_gpu_set(ids)} if node else {RESERVATION: _key(job)}))
                for i, (node, ids) in enumerate(pods)]


def _key(job: Job) -> str:
    """The reservation key the mutation writes on a job's pods."""
    return f"sim/Job/{job.job_id}"


def kube_scheduler_with_preference(cluster: SimCluster, rng: random.Random, job: Job,
                                   preferred: set[int]) -> list[PodPlacement] | None:
    """kube-scheduler placing a job's pods one at a time (gang: all or none) when they carry a
    preferred node affinity of weight 100 for the nodes `preferred`. NodeAffinity scores a matching
    node 100 and an other 0, and its default plugin weight is 2, against at most 100 from
    NodeResourcesFit (weight 1): so a node of the preferred domain with room always wins. Among
    equals, NodeResourcesFit's default LeastAllocated, modelled over nvidia.com/gpu as the spread
    baseline is (most GPUs free wins); remaining ties at random, as selectHost does. Other score
    plugins (BalancedAllocation, ImageLocality...) are left out."""
    gpus = job.gpus_per_pod
    free = list(cluster.free_count)
    taken: dict[str, set[int]] = {}
    pods: list[PodPlacement] = []
    for _ in range(job.pods):
        able = [i for i, f in enumerate(free) if f >= gpus]
        if not able:
            return None
        best = max((i in preferred, free[i]) for i in able)
        i = rng.choice([i for i in able if (i in preferred, free[i]) == best])
        node = cluster.nodes[i]
        ids = _pick_excluding(node, taken.get(node.name, set()), gpus)
        taken.setdefault(node.name, set()).update(ids)
        free[i] -= gpus
        pods.append((node.name, ids))
    return pods


# Our rules that an ablation switches off, one at a time: our orderings (webhook/core/orderings.py)
# with the key that holds the rule replaced by the same order without that rule's term. An index
# built with them ranks by them in the decision and in its level orders alike.
ABLATIONS: dict[str, Orderings] = {
    # a single-node pod goes to a node whose NVLink domain holds it whole, among equally full ones
    "aligned-first": dataclasses.replace(DEFAULT_ORDERINGS, aligned_first=lambda node, gpus: (node.name,)),
    # a single-node pod goes down the tree where small jobs already run (else: the fullest first)
    "small-jobs-first": dataclasses.replace(DEFAULT_ORDERINGS, with_small_jobs_first=lambda domain, gpus: (
        domain.fits_now(gpus), domain.free_gpus, domain.path)),
    # among equally fitting domains, a multi-node job takes the one with fewer partly used nodes
    # (the key keeps its shape: the level orders read the path from its fourth place)
    "fewer-partly-used": dataclasses.replace(DEFAULT_ORDERINGS, best_fit=lambda domain, gpus: (
        domain.fits_now(gpus), 0, domain.free_gpus, domain.path)),
}


class Without(Ours):
    """Ours with one rule of ABLATIONS switched off: its index is built with the orderings without it."""

    def __init__(self, rule: str, network: Network, comm_fraction: float) -> None:
        super().__init__(Strategy.CONSOLIDATED, network, orderings=ABLATIONS[rule], communication_share=comm_fraction)
        self.rule = rule
        self.name = f"ours without {rule}"

