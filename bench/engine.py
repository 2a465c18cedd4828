"""The discrete-event loop: arrivals, a queue, gang placement by one policy, completions, and what
each decision did (span, tightest-domain checks, all-reduce estimate) and what the cluster looked
like over time (allocation, FGD fragmentation).

Queue discipline, identical for every policy: FIFO with backfill and no reservation, gang-placed
(every pod of a job or none). On every arrival and completion one pass walks the whole queue in
submit order and starts every job the policy places now. What it stands for:

- kube-scheduler's per-pod queue (https://kubernetes.io/docs/concepts/scheduling-eviction/scheduling-framework/):
  pending pods sit in activeQ ordered by priority and then by when they were queued (PrioritySort);
  a pod that did not fit goes to the unschedulable pool and back to activeQ on a cluster event that
  may make it fit (a pod deleted, a node added). There is no window: after a release every pending
  pod is tried again, oldest first, which is what one pass here does. kube-scheduler alone has no
  gang; the simulator starts a job's pods together (as Kueue admission or a coscheduling plugin
  would), for every policy alike.
- Kueue's BestEffortFIFO (https://kueue.sigs.k8s.io/docs/concepts/cluster_queue/#queueing-strategy),
  the queueing strategy the Kueue TAS baseline stands for: workloads ordered by priority and creation
  time; one that cannot be admitted is set aside and does not block newer ones that fit, and is
  requeued when quota or capacity is freed. Same order, same backfill, so the same pass.
- Kueue's StrictFIFO (same page: "Older workloads that can't be admitted will block newer
  workloads, even if the newer workloads fit"), for a policy with `strict_fifo`: the pass walks
  the queue in submit order and stops at the first job that does not start; a job rejected as
  never fitting leaves the queue and blocks nothing.
- `window`: passing WINDOW (64) looks at only the first 64 queued jobs per pass, which is how the
  simulator ran before 25 Nov 2026. No scheduler named above has such a cut-off: under load the 64
  places filled with multi-node jobs that wait long (more of them under a policy that keeps them
  waiting) and starved the small jobs behind them. Kept only to reproduce earlier figures.

Three shortcuts keep a pass cheap, none changing what starts. A job that had to wait is not asked
again until some job has ended. Once a job of p pods of g GPUs that could go anywhere (the policy
holds it to no nodes: `held_to` is None) failed, jobs of p or more pods of g or more GPUs are skipped
until something is freed: every policy's fit is monotone in free GPUs, pod count and pod size
(among the shapes of one `Policy.fit_class`: Kueue's required level grows with the job, so one of
8 pods waiting for a leaf says nothing of one of 9 required at a spine).
(Before 25 Nov 2026 the skip went by total GPUs, which is the same for the sampled streams, whose
jobs are one pod or pods of 8, but not for a replayed trace's worker shapes.) A job held to some
nodes (ours, waiting inside its pin) failing says nothing of the others; it is set aside until GPUs
are freed on those nodes, as kube-scheduler's queueing hints move an unschedulable pod back only
on an event that may make it fit. A job held by a scheduling gate (ours with `gate_waits`) is held
to no nodes yet may not go anywhere (`redecided`): it is asked again after every release, and its
failing says nothing of the others either. The queue is kept per shape, so that a pass walks a merge of the
shapes still uncovered instead of every queued job (an 8,192-GPU Kueue run at acme_seren load 1.2
took 230 s before and 11.5 s after, with the same starts, on the 2-vCPU VM).

The cluster as it runs (`Runtime`, issue 38 item 3; `IDEAL` is how the engine ran before, and what a
`Workload` gets unless told otherwise; bench/simulate.py's scenarios default to `Runtime()`):

- **When ours decides.** The webhook decides a job when its pods are created, at arrival, whether or
  not the cluster has room (`decide_at_arrival` and `Policy.decides_at_arrival`): a job that does
  not fit is told to wait then, pinned or gated to the domain the wait names, and starts there as
  that decision says. The baselines are schedulers, asked when the job could start (asking
  kube-scheduler or Kueue earlier changes nothing). IDEAL asks ours first when the cluster has as
  many free GPUs as the job, as before.
- **The releaser.** A job our gate holds (`Policy.redecided`) is started only by the releaser
  (webhook/kube/releaser.py), whose loop waits `releaser_period_s` between passes
  (clusterview.RELEASE_INTERVAL_SECONDS, 1 s): after GPUs are freed, its next pass (ticks at
  multiples of the period from time 0) decides the gated jobs oldest first, and each one placed
  holds its GPUs from that tick and runs from the tick plus `patch_latency_s` (the pods' patches
  and the binding). IDEAL (period and latency 0) keeps gated jobs in the pass after the release,
  in submit order among the others.
- **Kueue's ungating.** A job Kueue admits holds its GPUs from the admission and runs from
  `kueue_ungate_s` later (1 s: its topology ungater's batch period), which the twin measured
  (bench/twin.py); IDEAL starts it at once.
- **Pods that are not ours.** A share of the stream (`foreign_share`, drawn per job from the seed
  alone by `foreign_jobs`, so every policy of a comparison faces the same ones) carries no
  annotation and goes to kube-scheduler directly, under every policy alike: in a Kueue cluster a
  job that is not queued is not Kueue's either. kube-scheduler places such a job as soon as it
  arrives or, when it did not fit, at the first release that lets it: its default scoring over
  nvidia.com/gpu (NodeResourcesFit LeastAllocated, `policies.least_allocated`, no topology), its
  pods together (kube-scheduler has no gang; a job half bound would hold GPUs the simulator
  cannot account for), FIFO with backfill. It binds within milliseconds of an event, so at every
  event its pass runs before the policy's: freed GPUs go to pending foreign pods first, and to
  those arriving before the releaser's next tick. Their records are kept apart
  (`RunResult.foreign`), out of every bucket of every policy; their GPUs count in allocation,
  which is the cluster's.
"""
from __future__ import annotations

import heapq
import math
import random
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import islice

from webhook.settings.config import HardwareProfile

from .costmodel import Network, allreduce_seconds, ideal_placement
from .fabric import GPUS_PER_NODE, ClusterSpec, SimCluster, dynamic_tightest, span_level, static_tightest
from .policies import NeverFits, PodPlacement, Policy, least_allocated
from .traces import Job

WINDOW = 64  # queued jobs a pass looked at before 25 Nov 2026 (run(..., window=WINDOW) reproduces it)
RELEASER_PERIOD_S = 1.0  # webhook/kube/clusterview.py RELEASE_INTERVAL_SECONDS: the wait between passes
# From a release's decision to its pods bound: a JSON patch per pod and a binding, each a few ms
# to tens of ms on a loaded apiserver (not measured here; set it with --patch-latency).
PATCH_LATENCY_S = 0.05
FOREIGN_SHARE = 0.3  # share of the stream not annotated for us (issue 38)
# From Kueue's admission to its pods bound: Kueue v0.17.0's topology ungater removes a TAS pod's
# scheduling gate in a reconcile queued UpdatesBatchPeriod (1 s) after the pod's event
# (pkg/controller/tas/topology_ungater.go); bench/twin.py measured starts 1.1 s after the simulator's.
KUEUE_UNGATE_S = 1.0


@dataclass(frozen=True)
class Runtime:
    """How the cluster runs what a policy decides (the module docstring says what each stands for)."""

    releaser_period_s: float = RELEASER_PERIOD_S
    patch_latency_s: float = PATCH_LATENCY_S
    foreign_share: float = FOREIGN_SHARE
    decide_at_arrival: bool = True
    kueue_ungate_s: float = KUEUE_UNGATE_S

    def __post_init__(self) -> None:
        if (self.releaser_period_s < 0 or self.patch_latency_s < 0 or self.kueue_ungate_s < 0
                or not 0 <= self.foreign_share <= 1):
            raise ValueError(f"releaser period {self.releaser_period_s:g} s, patch latency "
                             f"{self.patch_latency_s:g} s and Kueue's ungating {self.kueue_ungate_s:g} s must be 0 "
                             f"or more, foreign share {self.foreign_share:g} between 0 and 1")

    @property
    def instant_release(self) -> bool:
        """Gated jobs start in the pass after the release that makes room for them, as before issue 38."""
        return self.releaser_period_s == 0 and self.patch_latency_s == 0

    def next_tick(self, freed_s: float) -> float:
        """When the releaser's first pass after GPUs freed at `freed_s` runs."""
        if self.releaser_period_s == 0:
            return freed_s
        return (math.floor(freed_s / self.releaser_period_s) + 1) * self.releaser_period_s


IDEAL = Runtime(releaser_period_s=0.0, patch_latency_s=0.0, foreign_share=0.0, decide_at_arrival=False,
                kueue_ungate_s=0.0)


def foreign_jobs(jobs: Iterable[Job], share: float, seed: int) -> frozenset[str]:
    """The ids of the jobs that are not ours: each with probability `share`, drawn from the seed
    alone (one draw per job, so a larger share keeps the smaller one's jobs and adds to them)."""
    draw = random.Random(f"foreign-{seed}")
    return frozenset(job.job_id for job in jobs if draw.random() < share)


@dataclass(frozen=True)
class Workload:
    """What every policy of one comparison sees: the same cluster, network, stream and cost figures."""

    spec: ClusterSpec
    network: Network
    jobs: tuple[Job, ...]
    comm_fraction: float  # share of a job's run time in all-reduce at its tightest placement, for a job without its own
    allreduce_bytes: float
    seed: int
    warmup_s: float  # allocation and fragmentation are measured from here to the last arrival
    runtime: Runtime = IDEAL

    @property
    def profile(self) -> HardwareProfile:
        return self.spec.hardware.profile

    def share_of(self, job: Job) -> float:
        """The communication share the simulator charges `job`: its own (version 2 streams,
        bench/traces.py), else the workload's one share (version 1 streams, replayed traces)."""
        return self.comm_fraction if job.comm_share is None else job.comm_share


@dataclass(frozen=True)
class JobRecord:
    job: Job
    start_s: float
    run_s: float
    span: int  # fabric span level of the placement
    static_tightest: int
    dynamic_tightest: int  # narrowest level with room for the whole job at decision time
    nodes: int
    leaves: int
    allreduce_s: float
    ideal_allreduce_s: float

    @property
    def wait_s(self) -> float:
        return self.start_s - self.job.submit_s

    @property
    def completion_s(self) -> float:
        return self.wait_s + self.run_s

    @property
    def gpu_seconds(self) -> float:
        return self.job.gpus * self.run_s


@dataclass(frozen=True)
class ClusterSample:
    """What the queue and the free capacity looked like at one moment (for the JCT diagnosis)."""

    time_s: float
    queued: tuple[int, ...]  # GPUs of each queued job, in queue order
    free_gpus: int
    partly_used_nodes: int  # nodes with some GPUs free and some taken
    idle_nodes: int  # nodes with every GPU free
    leaves_with_partly_used: int  # leaves holding at least one partly used node
    whole_leaves: int  # leaves with every GPU free


def sample_cluster(cluster: SimCluster, now: float, queue: list[Job]) -> ClusterSample:
    partly = [n for n, free in zip(cluster.nodes, cluster.free_count) if 0 < free < GPUS_PER_NODE]
    return ClusterSample(now, tuple(j.gpus for j in queue), cluster.spec.gpus - cluster.used, len(partly),
                         len(cluster.by_free[GPUS_PER_NODE]), len({n.leaf for n in partly}),
                         sum(h[GPUS_PER_NODE] == len(cluster.members["leaf"][leaf])
                             for leaf, h in cluster.histogram["leaf"].items()))


@dataclass
class RunResult:
    policy: str
    records: list[JobRecord] = field(default_factory=list)
    rejected: int = 0  # jobs the policy said can never fit
    unstarted: int = 0  # jobs still queued or gated when nothing was left running
    foreign: list[JobRecord] = field(default_factory=list)  # jobs that are not ours, kube-scheduler's
    foreign_unstarted: int = 0
    allocation: float = 0.0  # time-averaged allocated GPUs / all GPUs, between warm-up and last arrival
    fragmentation: list[tuple[float, float]] = field(default_factory=list)  # (time s, FGD ratio) when any GPU idles
    decision_seconds: list[float] = field(default_factory=list)  # wall time of each policy.place call
    window: tuple[float, float] = (0.0, 0.0)  # measurement window (s)
    cluster_gpus: int = 0
    waits: dict[str, int] = field(default_factory=dict)  # job id -> times the policy answered "wait"
    states: list[ClusterSample] = field(default_factory=list)  # queue and free capacity, at the FGD sample times
    placed: dict[str, tuple[str, ...]] = field(default_factory=dict)  # job id -> the node of each of its pods

    @property
    def useful_allocation(self) -> float:
        """Allocation counting only the GPU time jobs would need at their tightest placement: the
        part of `allocation` that is not spent waiting on slow links."""
        lo, hi = self.window
        if hi <= lo:
            return 0.0
        work = sum(max(0.0, min(r.start_s + r.run_s, hi) - max(r.start_s, lo)) * r.job.gpus * r.job.duration_s / r.run_s
                   for r in (*self.records, *self.foreign))
        return work / (self.cluster_gpus * (hi - lo))


def fgd_fragmentation(cluster: SimCluster, pod_sizes: dict[int, float]) -> float | None:
    """FGD (ATC'23) fragmentation ratio: idle GPUs on a node that a typical pod cannot use, weighted by
    how common that pod size is, over all idle GPUs; None when nothing is idle. Whole GPUs only."""
    idle = cluster.spec.gpus - cluster.used
    if idle == 0:
        return None
    frag = 0.0
    for node in cluster.nodes:
        free = len(node.free)
        if free:
            frag += free * sum(share for size, share in pod_sizes.items() if free < size)
    return frag / idle


def pod_size_shares(jobs: tuple[Job, ...]) -> dict[int, float]:
    counts: dict[int, int] = {}
    for job in jobs:
        counts[job.gpus_per_pod] = counts.get(job.gpus_per_pod, 0) + job.pods
    total = sum(counts.values())
    return {size: n / total for size, n in counts.items()}


FitClass = Callable[[tuple[int, int]], object]


def covered(shape: tuple[int, int], failed: list[tuple[int, int]], fit_class: FitClass | None = None) -> bool:
    """Whether a job of `shape` (pods, GPUs per pod) has as many pods, each as large, as one that
    failed (of the same `fit_class`, where one is given)."""
    return any(shape[0] >= pods and shape[1] >= per_pod
               and (fit_class is None or fit_class(shape) == fit_class((pods, per_pod))) for pods, per_pod in failed)


def note_failure(failed: list[tuple[int, int]], shape: tuple[int, int], fit_class: FitClass | None = None) -> None:
    """Add (pods, GPUs per pod) to the shapes that found no room, dropping those it covers: the list
    stays the few shapes no other one covers."""
    failed[:] = [f for f in failed if not (f[0] >= shape[0] and f[1] >= shape[1] and (
        fit_class is None or fit_class(f) == fit_class(shape)))] + [shape]


class JobQueue:
    """The queued jobs in submit order, also kept per shape (pods, GPUs per pod), and the jobs held
    to some nodes set aside until GPUs are freed there: kube-scheduler's unschedulable pool with its
    queueing hints, where a pod goes back to the active queue only on an event that may make it fit."""

    def __init__(self) -> None:
        self.jobs: dict[int, Job] = {}  # position in the stream -> job, in submit order
        self.by_shape: dict[tuple[int, int], dict[int, Job]] = {}  # the jobs not set aside, each shape in order
        self.aside: dict[frozenset[str], set[int]] = {}  # nodes -> the jobs set aside held to them
        # node -> every node set jobs were ever held to that holds it: a few per node (its domains),
        # so that a job is set aside and woken without a step per node of a spine or a zone
        self.sets_with: dict[str, list[frozenset[str]]] = {}

    def add(self, position: int, job: Job) -> None:
        self.jobs[position] = job
        self.by_shape.setdefault((job.pods, job.gpus_per_pod), {})[position] = job

    def remove(self, position: int) -> None:
        self._leave_shape(position, self.jobs.pop(position))

    def set_aside(self, position: int, nodes: frozenset[str]) -> None:
        self._leave_shape(position, self.jobs[position])
        if nodes not in self.aside:
            self.aside[nodes] = set()
            for node in nodes:
                self.sets_with.setdefault(node, []).append(nodes)
        self.aside[nodes].add(position)

    def freed(self, nodes: Iterable[str]) -> None:
        """GPUs were freed on `nodes`: the jobs set aside on any of them are back in their places."""
        back: dict[tuple[int, int], list[tuple[int, Job]]] = {}
        for node in nodes:
            for held in self.sets_with.get(node, ()):
                for position in self.aside[held]:
                    job = self.jobs[position]
                    back.setdefault((job.pods, job.gpus_per_pod), []).append((position, job))
                self.aside[held].clear()
        for shape, returning in back.items():
            returning.sort(key=lambda item: item[0])
            self.by_shape[shape] = dict(heapq.merge(self.by_shape.get(shape, {}).items(), returning,
                                                    key=lambda item: item[0]))

    def first(self, count: int) -> list[tuple[int, Job]]:
        return list(islice(self.jobs.items(), count))

    def in_submit_order(self) -> Iterator[tuple[int, Job]]:
        """Every queued job, set aside or not, oldest first. Nothing may be added or removed while
        it is read."""
        return iter(self.jobs.items())

    def in_order(self, failed: list[tuple[int, int]], fit_class: FitClass | None = None) -> Iterator[tuple[int, Job]]:
        """The jobs not set aside, in submit order, without those of a shape a failed shape covers:
        a merge of the per-shape queues that drops a shape once `failed` covers it, so that a pass
        costs the jobs it asks, not every job queued (tens of thousands at 8,192 GPUs under
        overload). Nothing may be added or removed while it is read."""
        streams = {shape: iter(queued.items()) for shape, queued in self.by_shape.items()}
        heads = [(position, shape, job) for shape, stream in streams.items() for position, job in islice(stream, 1)]
        heapq.heapify(heads)
        while heads:
            position, shape, job = heapq.heappop(heads)
            if covered(shape, failed, fit_class):
                continue
            yield position, job
            for following, later in islice(streams[shape], 1):
                heapq.heappush(heads, (following, shape, later))

    def _leave_shape(self, position: int, job: Job) -> None:
        shape = (job.pods, job.gpus_per_pod)
        del self.by_shape[shape][position]
        if not self.by_shape[shape]:
            del self.by_shape[shape]


def ideal_allreduce_seconds(workload: Workload, pods: int, gpus_per_pod: int) -> float:
    """The all-reduce time of a job of `pods` pods at its tightest placement in an empty cluster,
    which the trace's duration is taken to include (costmodel.ideal_placement)."""
    empty = SimCluster(workload.spec)
    return allreduce_seconds(empty, workload.profile, workload.network, ideal_placement(empty, pods, gpus_per_pod),
                             workload.allreduce_bytes)


def started_record(cluster: SimCluster, workload: Workload, job: Job, pods: list[PodPlacement], began: float,
                   dynamic: int | None, ideal_s: float) -> JobRecord:
    """What a job's start records, its pods bound in `cluster` (their GPUs taken): its span and its
    run time, the trace's duration with the job's communication share stretched by the slowdown the
    cost model gives its nodes (all-reduce here over all-reduce at the tightest placement,
    `ideal_s`). `dynamic`: the narrowest level that had room for it before it was bound."""
    merged: dict[str, tuple[int, ...]] = {}
    for node, ids in pods:
        merged[node] = merged.get(node, ()) + ids
    actual = allreduce_seconds(cluster, workload.profile, workload.network, merged, workload.allreduce_bytes)
    slowdown = actual / ideal_s if ideal_s > 0 else 1.0
    share = workload.share_of(job)
    span = span_level(cluster, merged)
    return JobRecord(job, began, job.duration_s * (1 - share + share * slowdown), span,
                     static_tightest(workload.spec, job.pods, job.gpus_per_pod), span if dynamic is None else dynamic,
                     len(merged), len({cluster.by_name[n].leaf for n in merged}), actual, ideal_s)


def run(workload: Workload, policy: Policy, frag_samples: int = 100, window: int | None = None) -> RunResult:
    """One policy over the workload's stream, run as `workload.runtime` says; `window` (None: the
    whole queue) caps how many queued jobs a pass looks at (see the module docstring)."""
    cluster = SimCluster(workload.spec)
    policy.reset(cluster, workload.seed)
    result = RunResult(policy.name, cluster_gpus=workload.spec.gpus)
    jobs = workload.jobs
    runtime = workload.runtime
    horizon = jobs[-1].submit_s
    warmup = min(workload.warmup_s, horizon)
    result.window = (warmup, horizon)
    sample_times = [warmup + (horizon - warmup) * i / frag_samples for i in range(frag_samples + 1)]
    pod_sizes = pod_size_shares(jobs)
    ideal_cache: dict[tuple[int, int], float] = {}
    finishes: list[tuple[float, int, list[PodPlacement], Job]] = []
    queue = JobQueue()
    foreign = foreign_jobs(jobs, runtime.foreign_share, workload.seed)
    foreign_queue = JobQueue()  # kube-scheduler's pending pods that are not ours
    kube_scheduler = least_allocated()
    kube_scheduler.reset(cluster, workload.seed)
    gated: dict[int, Job] = {}  # position in the stream -> job our gate holds, for the releaser's tick
    next_tick = math.inf  # the releaser's next pass, once GPUs were freed since its last one
    next_arrival = 0
    now = 0.0
    allocated_gpu_seconds = 0.0
    sequence = 0

    def ideal_allreduce(job: Job) -> float:
        key = (job.pods, job.gpus_per_pod)
        if key not in ideal_cache:
            ideal_cache[key] = ideal_allreduce_seconds(workload, *key)
        return ideal_cache[key]

    def start(job: Job, pods: list[PodPlacement], began: float, records: list[JobRecord]) -> None:
        """Bind the pods now; the job runs from `began` (later than now after a release's patches)."""
        nonlocal sequence
        dynamic = dynamic_tightest(cluster, job.pods, job.gpus_per_pod)
        for node, ids in pods:
            cluster.take(node, ids)
        policy.started(job, pods)
        record = started_record(cluster, workload, job, pods, began, dynamic, ideal_allreduce(job))
        records.append(record)
        result.placed[job.job_id] = tuple(node for node, _ in pods)
        sequence += 1
        heapq.heappush(finishes, (began + record.run_s, sequence, pods, job))

    # A job that had to wait still has to while nothing was given back since: taking GPUs never
    # makes a job fit (every policy's fit is monotone in free GPUs), so it is not asked again.
    # The simulator spent most of its time in such repeated waits at high load.
    # So after an arrival (no release since the last pass) only the new job can start, unless a job
    # that may go anywhere and is no larger failed since the last release (`epoch_failed`).
    releases = 0
    waited_at: dict[str, int] = {}
    epoch_failed: list[tuple[int, int]] = []
    total_gpus = cluster.spec.gpus
    strict = policy.strict_fifo
    # None when the policy's fit is one class (the usual case): the checks stay as they were.
    fit_class = None if type(policy).fit_class is Policy.fit_class else policy.fit_class

    def schedule_pass(arrived: tuple[int, Job] | None) -> None:
        nonlocal epoch_failed
        failed: list[tuple[int, int]] = []
        candidates: Iterable[tuple[int, Job]]
        if window is not None:
            candidates = queue.first(window)
        elif strict:
            # StrictFIFO: from the head, until one does not start. After an arrival the head, asked
            # since the last release, stops the pass at once unless the arrival is the head.
            candidates = queue.in_submit_order()
        elif arrived is not None:
            candidates, failed = [arrived], epoch_failed
        else:
            candidates = queue.in_order(failed, fit_class)
        gone: list[int] = []  # dequeued after the pass: the queue is being read
        aside: list[tuple[int, frozenset[str]]] = []
        for position, job in candidates:
            # The webhook decides a job as its pods are created, room or not.
            decided_now = (runtime.decide_at_arrival and arrived is not None and position == arrived[0]
                           and policy.decides_at_arrival(job))
            if cluster.used == total_gpus and not decided_now:
                break  # nothing fits anywhere
            gpus, shape = job.gpus, (job.pods, job.gpus_per_pod)
            if not strict and not decided_now and covered(shape, failed, fit_class):
                continue  # as many pods, each as large, as a job that found no room anywhere
            if waited_at.get(job.job_id) == releases:
                if strict:
                    break  # the head still cannot start: nothing behind it may
                if policy.held_to(job) is None and not policy.redecided(job):
                    note_failure(failed, shape, fit_class)
                continue
            pods = None
            try:
                if gpus > total_gpus:
                    raise NeverFits(f"{gpus} GPUs exceed the cluster")
                if gpus <= total_gpus - cluster.used or decided_now:
                    began = time.perf_counter()
                    pods = policy.place(job)
                    result.decision_seconds.append(time.perf_counter() - began)
            except NeverFits:
                gone.append(position)
                result.rejected += 1
                continue
            if pods is None:
                held_to = policy.held_to(job)
                if gpus <= total_gpus - cluster.used:  # the policy was asked and said wait
                    result.waits[job.job_id] = result.waits.get(job.job_id, 0) + 1
                if not runtime.instant_release and policy.redecided(job):
                    gone.append(position)
                    gated[position] = job  # only the releaser starts it now
                    continue
                if held_to is None and not policy.redecided(job):
                    note_failure(failed, shape, fit_class)
                elif held_to is not None and window is None:
                    aside.append((position, held_to))
                waited_at[job.job_id] = releases
                if strict:
                    break  # StrictFIFO: a head that cannot start blocks the jobs behind it
                continue
            gone.append(position)
            start(job, pods, now + (runtime.kueue_ungate_s if policy.ungated_by_kueue else 0.0), result.records)
        for position in gone:
            queue.remove(position)
        for position, nodes in aside:
            queue.set_aside(position, nodes)
        epoch_failed = failed

    def release_pass() -> None:
        """The releaser's tick: each gated job, oldest first, decided again where its GPUs fit now."""
        for position in sorted(gated):
            if cluster.used == total_gpus:
                break
            job = gated[position]
            if job.gpus > total_gpus - cluster.used:
                continue
            began = time.perf_counter()
            pods = policy.place(job)
            result.decision_seconds.append(time.perf_counter() - began)
            if pods is None:
                result.waits[job.job_id] = result.waits.get(job.job_id, 0) + 1
                continue
            del gated[position]
            start(job, pods, now + runtime.patch_latency_s, result.records)

    def foreign_pass(arrived: tuple[int, Job] | None) -> None:
        """kube-scheduler binding the pods that are not ours: after an arrival only the new job can
        start (nothing was freed since the last pass), after a release every pending one may."""
        failed: list[tuple[int, int]] = []
        candidates = [arrived] if arrived is not None else foreign_queue.in_order(failed)
        bound: list[int] = []
        for position, job in candidates:
            if cluster.used == total_gpus:
                break
            shape = (job.pods, job.gpus_per_pod)
            pods = kube_scheduler.place(job) if job.gpus <= total_gpus - cluster.used else None
            if pods is None:
                note_failure(failed, shape)
                continue
            bound.append(position)
            start(job, pods, now, result.foreign)
        for position in bound:
            foreign_queue.remove(position)

    while next_arrival < len(jobs) or finishes or next_tick < math.inf:
        arrival_t = jobs[next_arrival].submit_s if next_arrival < len(jobs) else math.inf
        finish_t = finishes[0][0] if finishes else math.inf
        t = min(arrival_t, finish_t, next_tick)
        # The state is constant since the last event: account for it up to t.
        lo, hi = max(now, warmup), min(t, horizon)
        if hi > lo:
            allocated_gpu_seconds += cluster.used * (hi - lo)
        while sample_times and sample_times[0] <= t:
            ratio = fgd_fragmentation(cluster, pod_sizes)
            sampled = sample_times.pop(0)
            if ratio is not None:
                result.fragmentation.append((sampled, ratio))
            result.states.append(sample_cluster(cluster, sampled, [*queue.jobs.values(), *gated.values()]))
        now = t
        policy.tick(now)
        # At one instant: a release first, then an arrival, then the releaser's tick.
        if finish_t <= arrival_t and finish_t <= next_tick:
            _, _, pods, job = heapq.heappop(finishes)
            releases += 1
            for node, ids in pods:
                cluster.give_back(node, ids)
            queue.freed(node for node, _ in pods)
            policy.finished(job, pods)
            if not runtime.instant_release:
                next_tick = min(next_tick, runtime.next_tick(now))
            foreign_pass(None)
            schedule_pass(None)
        elif arrival_t <= next_tick:
            arrived = (next_arrival, jobs[next_arrival])
            next_arrival += 1
            if arrived[1].job_id in foreign:
                foreign_queue.add(*arrived)
                foreign_pass(arrived)
            else:
                queue.add(*arrived)
                schedule_pass(arrived)
        else:
            next_tick = math.inf
            release_pass()
    result.unstarted = len(queue.jobs) + len(gated)
    result.foreign_unstarted = len(foreign_queue.jobs)
    result.allocation = allocated_gpu_seconds / (cluster.spec.gpus * (horizon - warmup)) if horizon > warmup else 0.0
    return result
