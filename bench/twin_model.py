"""The twin's arithmetic, apart from any cluster (bench/twin.py runs it against one): the virtual
clock and its pace, the nodes of `hack/local-cluster` named as the simulator names them, the run
time charged from the nodes a job's pods were bound to, a run's figures, and the fidelity table.

**Time.** A replay keeps a virtual clock (`Clock`): while any component may still act on what
happened (a Job's pods being created, bound, gated; a completion not yet seen; a wait that room
may have opened for), it runs at `pace` virtual seconds per wall second; once everything has
settled, it jumps to the next arrival or completion of the stream. So a wait of the real stack
(the releaser's 1 s period, Kueue's 1 s requeue batch, the Job controller's 1 s pod batch) lasts
pace x its wall time in the replay, and `max_pace` keeps that at most 1% of the median job: at
pace 1 a period of 1 s is 1% of a 100 s median (the streams here have medians of 120 to 220 s).
The gaps between events cost no wall time, which is where a stream's hours go.
"""
from __future__ import annotations

import bisect
import math
import statistics
from dataclasses import dataclass
from typing import Iterable, Sequence

from .engine import JobRecord, RunResult, Workload, ideal_allreduce_seconds, started_record
from .fabric import SimCluster, dynamic_tightest
from .policies import PodPlacement, _pick_excluding
from .traces import Job

# The waits of the real stack a replay must keep short against its jobs (wall seconds):
# webhook/kube/clusterview.py RELEASE_INTERVAL_SECONDS, and Kueue v0.17.0's requeue batch of
# inadmissible workloads (pkg/cache/queue/inadmissible_workloads.go requeueBatchPeriod).
RELEASER_PERIOD_S = 1.0
KUEUE_REQUEUE_S = 1.0
PERIODS_SHARE = 0.01  # each at most this share of the median job, as the replay runs it


def max_pace(durations: Iterable[float], periods: Sequence[float] = (RELEASER_PERIOD_S, KUEUE_REQUEUE_S),
             share: float = PERIODS_SHARE) -> float:
    """The fastest pace (virtual seconds per wall second while the stack acts) at which every one of
    `periods` spans at most `share` of the median job: pace x period <= share x median."""
    return share * statistics.median(durations) / max(periods)


class Clock:
    """Virtual seconds from wall seconds (time.monotonic): pieces that run at `pace` from where
    they begin, each begun by a jump. A moment read late (a watch event handled after a jump) is
    placed by the piece its wall time fell in."""

    def __init__(self, wall: float, pace: float = 1.0, virtual: float = 0.0) -> None:
        if pace <= 0:
            raise ValueError(f"pace {pace:g}: must be above 0")
        self.pace = pace
        self.walls, self.virtuals = [wall], [virtual]

    def at(self, wall: float) -> float:
        piece = max(0, bisect.bisect_right(self.walls, wall) - 1)
        return self.virtuals[piece] + self.pace * (wall - self.walls[piece])

    def jump(self, wall: float, virtual: float) -> None:
        """From `wall` on, the clock reads `virtual` (never backwards)."""
        if wall < self.walls[-1] or virtual < self.at(wall):
            raise ValueError(f"a jump to {virtual:g} s at wall {wall:g} s goes back in time")
        self.walls.append(wall)
        self.virtuals.append(virtual)

    def skipped(self) -> float:
        """Virtual seconds the jumps skipped."""
        return sum(v - (self.virtuals[i - 1] + self.pace * (w - self.walls[i - 1]))
                   for i, (w, v) in enumerate(zip(self.walls, self.virtuals)) if i)


def node_names(sim: SimCluster, real: Sequence[str]) -> dict[str, str]:
    """Each node of the real cluster by its name in the simulator: both list their nodes in
    topology order (zone, spine, leaf, node), `hack/cluster_nodes.gpu_nodes` filling leaf by leaf."""
    if len(real) != len(sim.nodes):
        raise ValueError(f"the real cluster has {len(real)} nodes, the simulated one {len(sim.nodes)}")
    return dict(zip(real, (node.name for node in sim.nodes)))


def domain_of(cluster: SimCluster, nodes: Iterable[str]) -> str:
    """The narrowest domain holding every node (simulator names): `node z0-s1-l0-n3`, `leaf z0-s1-l0`,
    `spine z0-s1`, `zone z1` or `cluster`."""
    found = [cluster.by_name[name] for name in nodes]
    if len({n.name for n in found}) == 1:
        return f"node {found[0].name}"
    for key in ("leaf", "spine", "zone"):
        if len({getattr(n, key) for n in found}) == 1:
            return f"{key} {getattr(found[0], key)}"
    return "cluster"


def level_of(domain: str) -> str:
    return domain.partition(" ")[0]


class Charge:
    """The simulator's accounts of one replay: its cluster (`mirror`: whose GPUs the twin's bound
    jobs hold) and what a job bound to some nodes costs (engine.started_record, the run time the
    simulator would charge those nodes)."""

    def __init__(self, workload: Workload) -> None:
        self.workload = workload
        self.mirror = SimCluster(workload.spec)
        self.ideal: dict[tuple[int, int], float] = {}

    def start(self, job: Job, nodes: Sequence[str], began: float) -> tuple[JobRecord, list[PodPlacement]]:
        """`job` bound with one pod on each of `nodes` (simulator names), from `began`: its record and
        its pods' GPUs, taken in the mirror (as the device plugin would hand them out)."""
        if len(nodes) != job.pods:
            raise ValueError(f"{job.job_id}: {len(nodes)} nodes for {job.pods} pods")
        dynamic = dynamic_tightest(self.mirror, job.pods, job.gpus_per_pod)
        taken: dict[str, set[int]] = {}
        pods: list[PodPlacement] = []
        for name in nodes:
            ids = _pick_excluding(self.mirror.by_name[name], taken.setdefault(name, set()), job.gpus_per_pod)
            taken[name].update(ids)
            pods.append((name, ids))
        for name, ids in pods:
            self.mirror.take(name, ids)
        shape = (job.pods, job.gpus_per_pod)
        if shape not in self.ideal:
            self.ideal[shape] = ideal_allreduce_seconds(self.workload, *shape)
        return started_record(self.mirror, self.workload, job, pods, began, dynamic, self.ideal[shape]), pods

    def finish(self, pods: list[PodPlacement]) -> None:
        for name, ids in pods:
            self.mirror.give_back(name, ids)


def run_result(policy: str, records: list[JobRecord], foreign: list[JobRecord], window: tuple[float, float],
               gpus: int, unstarted: int, foreign_unstarted: int) -> RunResult:
    """A replay's figures as engine.run gives a simulation's, for report.summarize: allocation is
    the GPU time of the started jobs inside the window over the cluster's."""
    lo, hi = window
    held = sum(r.job.gpus * max(0.0, min(r.start_s + r.run_s, hi) - max(r.start_s, lo)) for r in (*records, *foreign))
    return RunResult(policy, records=list(records), foreign=list(foreign), unstarted=unstarted,
                     foreign_unstarted=foreign_unstarted, window=window, cluster_gpus=gpus,
                     allocation=held / (gpus * (hi - lo)) if hi > lo else 0.0)


# ---- fidelity -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Placed:
    """Where and when one job started in one run (None: it never did)."""
    start_s: float | None
    domain: str | None


def placements(result: RunResult, cluster: SimCluster) -> dict[str, Placed]:
    """Every started job of a simulation or a replay: its start and its narrowest domain."""
    return {r.job.job_id: Placed(r.start_s, domain_of(cluster, result.placed[r.job.job_id]))
            for r in (*result.records, *result.foreign)}


@dataclass(frozen=True)
class FidelityRow:
    job: Job
    foreign: bool
    simulated: Placed
    twin: Placed

    @property
    def error_s(self) -> float | None:
        """Twin start minus simulated start; None unless both started."""
        if self.simulated.start_s is None or self.twin.start_s is None:
            return None
        return self.twin.start_s - self.simulated.start_s

    @property
    def same_domain(self) -> bool:
        return self.simulated.domain is not None and self.simulated.domain == self.twin.domain

    @property
    def same_level(self) -> bool:
        return (self.simulated.domain is not None and self.twin.domain is not None
                and level_of(self.simulated.domain) == level_of(self.twin.domain))


NOT_STARTED = Placed(None, None)


def fidelity_rows(jobs: Sequence[Job], foreign: frozenset[str], simulated: dict[str, Placed],
                  twin: dict[str, Placed]) -> list[FidelityRow]:
    return [FidelityRow(job, job.job_id in foreign, simulated.get(job.job_id, NOT_STARTED),
                        twin.get(job.job_id, NOT_STARTED)) for job in jobs]


@dataclass(frozen=True)
class Fidelity:
    jobs: int
    compared: int  # started in both
    same_domain: int
    same_level: int
    error_p50_s: float  # of |twin start - simulated start|, over the jobs started in both
    error_p90_s: float
    error_max_s: float
    mean_error_s: float  # signed: positive, the twin started them later
    within_1s: int  # |error| <= 1 s: the releaser's period
    only_simulated: int  # started in the simulation only
    only_twin: int


def quantile(values: Sequence[float], q: float) -> float:
    """The q-quantile of `values` by the nearest rank (0 for none)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def fidelity(rows: Sequence[FidelityRow]) -> Fidelity:
    errors = [e for e in (r.error_s for r in rows) if e is not None]
    absolute = [abs(e) for e in errors]
    return Fidelity(len(rows), len(errors), sum(r.same_domain for r in rows), sum(r.same_level for r in rows),
                    quantile(absolute, 0.5), quantile(absolute, 0.9), max(absolute, default=0.0),
                    statistics.fmean(errors) if errors else 0.0, sum(a <= 1.0 for a in absolute),
                    sum(r.simulated.start_s is not None and r.twin.start_s is None for r in rows),
                    sum(r.simulated.start_s is None and r.twin.start_s is not None for r in rows))
