"""One replay of a stream through a live cluster (bench/twin.py): each job's Job created at its
arrival, each job started when its last pod binds and charged, from the nodes it landed on, the run
time the simulator would charge them (twin_model.Charge), its pods ended at start + that run time.

The virtual clock (twin_model.Clock) runs at the pace while something may still happen and jumps
to the next event once nothing can. Something may still happen while:
- a Job's pods are not all created, or a pod is neither bound and Running, nor held by our
  scheduling gate, nor found unschedulable by kube-scheduler (PodScheduled False); a Kueue job also
  while its Workload was not yet tried (no QuotaReserved condition) or, admitted, its pods do not run;
- a finished job is not yet seen finished: its pods Succeeded by the watch (the webhook and
  kube-scheduler read the same watch), and for Kueue its Workload Finished;
- after a job finished, some waiting job may fit the GPUs now free: `RELEASE_S` for the releaser's
  next pass (1 s) or Kueue's requeue batch (1 s) and the admission that follows; a pod pending in
  kube-scheduler that fits some node now until it binds, up to its backoff (10 s at most).
A job that shows none of these for `STALL_S` is taken as settled (counted: `Replayed.stalls`).
"""
from __future__ import annotations

import heapq
import queue
import sys
import time
from dataclasses import dataclass, field

from webhook.core.injection import GATE, PLACEMENT

from .engine import JobRecord
from .policies import KueueBestFit, PodPlacement
from .traces import Job
from .twin_kube import Kube, Mode, Watch, job_manifest
from .twin_model import Charge, Clock

SETTLE_S = 0.1  # since the last change seen: watches of other components lag ours by milliseconds
RELEASE_S = {False: 1.5, True: 2.0}  # by Kueue or not: from a finish seen to the start it may allow
BACKOFF_S = 11.0  # kube-scheduler's longest backoff (10 s), and a margin
STALL_S = 6.0
TELL_S = 30.0
POLL_S = 0.01
KUEUE_GATE = "kueue.x-k8s.io/topology"


@dataclass
class Pod:
    node: str | None = None
    bound_at: float = 0.0  # virtual
    running: bool = False
    gated: bool = False  # ours' gate or Kueue's
    ours_gated: bool = False
    unschedulable: bool = False
    succeeded: bool = False
    placement: str = ""  # what our webhook wrote (its decision, or what a wait waits for)


@dataclass
class Tracked:
    position: int
    job: Job
    name: str
    foreign: bool
    kueue: bool  # queued in Kueue
    pods: dict[str, Pod] = field(default_factory=dict)
    created: bool = False
    changed_wall: float = 0.0
    tried: bool = False  # Kueue tried it (a QuotaReserved condition)
    admitted: bool = False
    workload_finished: bool = False
    pending_message: str = ""
    record: JobRecord | None = None
    placed: list[PodPlacement] = field(default_factory=list)
    nodes: tuple[str, ...] = ()  # simulator names, pod by pod
    finished: bool = False
    finish_seen: bool = False
    stalled: bool = False  # counted in Replayed.stalls

    def settled(self, now: float, behind_a_blocked_head: bool) -> bool:
        """Nothing more will happen to it without a new event (see the module docstring). Under
        StrictFIFO Kueue tries only the queue's head: a job behind one it could not admit is not tried."""
        if now - self.changed_wall > STALL_S:
            return True
        if self.kueue and not self.admitted:
            return self.tried or behind_a_blocked_head
        if len(self.pods) < self.job.pods:
            return False
        return all((p.node and p.running) or p.ours_gated or (p.unschedulable and not p.gated)
                   for p in self.pods.values())


@dataclass
class Replayed:
    """What a replay saw, per job of the stream (by position)."""
    records: dict[int, JobRecord]
    placed: dict[str, tuple[str, ...]]  # job id -> simulator names of its pods' nodes
    notes: dict[str, str]  # job id -> what the placer said about it (our placement, Kueue's pending message)
    wall_s: float
    virtual_s: float  # the virtual time at the end
    skipped_s: float  # of which the clock's jumps skipped
    stalls: int
    events: int
    timed_out: bool
    busy_wall: dict[str, float]  # wall seconds spent waiting, by what was awaited


class Replay:
    def __init__(self, kube: Kube, namespace: str, mode: Mode, jobs: list[Job], foreign: dict[str, tuple[str, ...]],
                 charge: Charge, names: dict[str, str], required: KueueBestFit, pace: float, timeout_s: float,
                 partition: str = "") -> None:
        self.kube, self.namespace, self.mode, self.charge, self.names = kube, namespace, mode, charge, names
        self.partition = partition
        # Each foreign job's nodes in the simulation, by their real names, which it is steered to:
        # kube-scheduler breaks its ties at random, and ours and Kueue pack next to what it placed first.
        real = {sim: name for name, sim in names.items()}
        self.pinned = {job_id: tuple(dict.fromkeys(real[n] for n in nodes)) for job_id, nodes in foreign.items()}
        self.required, self.pace, self.timeout_s = required, pace, timeout_s
        self.tracked = [Tracked(i, job, f"job-{i}", job.job_id in foreign, mode.kueue and job.job_id not in foreign)
                        for i, job in enumerate(jobs)]
        self.by_name = {t.name: t for t in self.tracked}
        self.events: queue.Queue = queue.Queue()
        self.heap: list[tuple[float, int, str, int]] = [(job.submit_s, i, "arrive", i) for i, job in enumerate(jobs)]
        heapq.heapify(self.heap)
        self.sequence = len(jobs)
        self.last_change = 0.0
        self.freed_wall: float | None = None  # when the last finish was seen
        self.stalls = 0
        self.applied = 0
        self.quiet_wall = self.told_wall = self.last_loop = time.monotonic()
        self.busy_wall: dict[str, float] = {}  # wall seconds spent waiting, by what was awaited

    def run(self) -> Replayed:
        watches = [Watch(self.kube.api, "pod", f"/api/v1/namespaces/{self.namespace}/pods", self.events)]
        if self.mode.kueue:
            watches.append(Watch(self.kube.api, "workload",
                                 f"/apis/kueue.x-k8s.io/v1beta2/namespaces/{self.namespace}/workloads", self.events))
        for watch in watches:
            watch.start()
        began = time.monotonic()
        self.clock = Clock(began, self.pace)
        timed_out = False
        try:
            while not all(t.record for t in self.tracked):
                self.drain(POLL_S)
                now = time.monotonic()
                step, self.last_loop = now - self.last_loop, now
                if now - began > self.timeout_s:
                    timed_out = True
                    break
                if self.heap and self.heap[0][0] <= self.clock.at(now):
                    self.apply(heapq.heappop(self.heap), now)
                    continue
                why = self.busy(now)
                if why:
                    self.tell(now, why, step)
                    continue
                if not self.heap:
                    break  # nothing left to happen: the rest never start
                self.clock.jump(now, self.heap[0][0])
                self.quiet_wall = now
        finally:
            for watch in watches:
                watch.stop()
        end = time.monotonic()
        return Replayed({t.position: t.record for t in self.tracked if t.record},
                        {t.job.job_id: t.nodes for t in self.tracked if t.record},
                        {t.job.job_id: self.note(t) for t in self.tracked if self.note(t)},
                        end - began, self.clock.at(end), self.clock.skipped(), self.stalls, self.applied, timed_out,
                        self.busy_wall)

    @staticmethod
    def note(tracked: Tracked) -> str:
        placement = next((p.placement for p in tracked.pods.values() if p.placement), "")
        return placement or tracked.pending_message

    # ---- events of the stream ----

    def apply(self, event: tuple[float, int, str, int], now: float) -> None:
        at, _, what, position = event
        tracked = self.tracked[position]
        if what == "arrive":
            self.kube.create_job(self.namespace, job_manifest(tracked.job, tracked.name, self.mode, tracked.foreign,
                                                              self.required, self.partition,
                                                              self.pinned.get(tracked.job.job_id, ())))
            tracked.created = True
        else:
            if not all(p.running for p in tracked.pods.values()):
                self.push(at, what, position)  # KWOK has not run every pod yet: a moment later
                return
            self.kube.finish_pods(self.namespace, list(tracked.pods))
            self.charge.finish(tracked.placed)
            tracked.finished = True
        tracked.changed_wall = now
        self.last_change = now
        self.applied += 1

    def push(self, at: float, what: str, position: int) -> None:
        self.sequence += 1
        heapq.heappush(self.heap, (at, self.sequence, what, position))

    # ---- what the watches say ----

    def drain(self, wait: float) -> None:
        try:
            item = self.events.get(timeout=wait)
        except queue.Empty:
            return
        while True:
            self.seen(*item)
            try:
                item = self.events.get_nowait()
            except queue.Empty:
                return

    def seen(self, kind: str, event: str, obj: dict, wall: float) -> None:
        meta = obj["metadata"]
        if kind == "pod":
            tracked = self.by_name.get((meta.get("labels") or {}).get("job-name", ""))
            if tracked is None:
                return
            if event == "DELETED":
                tracked.pods.pop(meta["name"], None)
            else:
                self.pod_seen(tracked, meta["name"], obj, wall)
        else:
            owner = next((o["name"] for o in meta.get("ownerReferences") or () if o.get("kind") == "Job"), "")
            tracked = self.by_name.get(owner)
            if tracked is None or event == "DELETED":
                return
            conditions = {c["type"]: c for c in (obj.get("status") or {}).get("conditions") or ()}
            reserved = conditions.get("QuotaReserved")
            tracked.tried = tracked.tried or reserved is not None
            tracked.admitted = tracked.admitted or (reserved is not None and reserved["status"] == "True")
            if reserved is not None and reserved["status"] == "False":
                tracked.pending_message = reserved.get("message", "")
            if conditions.get("Finished", {}).get("status") == "True" and not tracked.workload_finished:
                tracked.workload_finished = True
                self.check_finish(tracked, wall)
        tracked.changed_wall = wall
        self.last_change = max(self.last_change, wall)

    def pod_seen(self, tracked: Tracked, name: str, obj: dict, wall: float) -> None:
        spec, status = obj["spec"], obj.get("status") or {}
        pod = tracked.pods.setdefault(name, Pod())
        gates = {g["name"] for g in spec.get("schedulingGates") or ()}
        pod.ours_gated, pod.gated = GATE in gates, bool(gates & {GATE, KUEUE_GATE})
        pod.placement = (obj["metadata"].get("annotations") or {}).get(PLACEMENT, "")
        pod.unschedulable = any(c["type"] == "PodScheduled" and c["status"] == "False"
                                for c in status.get("conditions") or ())
        pod.running = status.get("phase") in ("Running", "Succeeded")
        pod.succeeded = status.get("phase") == "Succeeded"
        if spec.get("nodeName") and pod.node is None:
            pod.node = spec["nodeName"]
            pod.bound_at = self.clock.at(wall)
            bound = [p for p in tracked.pods.values() if p.node]
            if len(bound) == tracked.job.pods and tracked.record is None:
                self.started(tracked, bound)
        if tracked.finished:
            self.check_finish(tracked, wall)

    def started(self, tracked: Tracked, bound: list[Pod]) -> None:
        """Its last pod bound: charged the run time of its nodes, its finish an event."""
        began = max(p.bound_at for p in bound)
        nodes = [self.names[p.node or ""] for p in bound]
        tracked.record, tracked.placed = self.charge.start(tracked.job, nodes, began)
        tracked.nodes = tuple(nodes)
        self.push(began + tracked.record.run_s, "finish", tracked.position)

    def check_finish(self, tracked: Tracked, wall: float) -> None:
        if tracked.finish_seen or not all(p.succeeded for p in tracked.pods.values()):
            return
        if tracked.kueue and not tracked.workload_finished:
            return
        tracked.finish_seen = True
        self.freed_wall = wall

    # ---- whether anything may still happen ----

    def busy(self, now: float) -> str:
        """What may still happen ("" when nothing can until the next event of the stream)."""
        if now - self.last_change < SETTLE_S:
            return "a change was just seen"
        waiting: list[Tracked] = []
        blocked = False  # StrictFIFO: an older job of the queue Kueue tried and did not admit
        for tracked in self.tracked:
            if tracked.finished and not tracked.finish_seen:
                if now - tracked.changed_wall <= STALL_S:
                    return f"{tracked.name} finished, not yet seen so"
                tracked.finish_seen = True
                self.stalled(tracked)
            if tracked.record is not None and not tracked.finished and not all(p.running for p in tracked.pods.values()):
                return f"{tracked.name} bound, not yet running"
            if tracked.created and tracked.record is None:
                if not tracked.settled(now, blocked and self.mode.strict_fifo):
                    return f"{tracked.name} created, not yet settled ({self.state(tracked)})"
                if now - tracked.changed_wall > STALL_S:
                    self.stalled(tracked)
                blocked = blocked or (tracked.kueue and tracked.tried and not tracked.admitted)
                waiting.append(tracked)
        if not waiting or self.freed_wall is None:
            return ""
        since = now - self.freed_wall
        free = self.charge.mirror.spec.gpus - self.charge.mirror.used
        if since < RELEASE_S[self.mode.kueue] and free >= min(t.job.gpus for t in waiting):
            return f"GPUs freed {since:.1f} s ago, {free} free, {len(waiting)} waiting"
        if since < BACKOFF_S and any(self.pending_fits(t) for t in waiting):
            return "a pod kube-scheduler found unschedulable fits now"
        return ""

    def tell(self, now: float, why: str, step: float) -> None:
        """Count the wall time `why` took (its kind: the reason without the job), and say on stderr
        what keeps a replay from going on, once every TELL_S while it lasts."""
        kind = why.split(" (")[0].split(" ", 1)[1] if why.startswith("job-") else why
        self.busy_wall[kind] = self.busy_wall.get(kind, 0.0) + step
        if now - max(self.quiet_wall, self.told_wall) > TELL_S:
            self.told_wall = now
            print(f"{self.namespace} at {self.clock.at(now):,.0f} s: {now - self.quiet_wall:.0f} s wall without "
                  f"a pause: {why}", file=sys.stderr, flush=True)

    def stalled(self, tracked: Tracked) -> None:
        if not tracked.stalled:
            tracked.stalled = True
            self.stalls += 1

    @staticmethod
    def state(tracked: Tracked) -> str:
        pods = ", ".join(f"{'bound' if p.node else 'gated' if p.gated else 'unschedulable' if p.unschedulable else 'new'}"
                         f"{'' if p.running or not p.node else ' not running'}" for p in tracked.pods.values())
        queued = f"Kueue: tried {tracked.tried}, admitted {tracked.admitted}; " if tracked.kueue else ""
        return f"{queued}{len(tracked.pods)} of {tracked.job.pods} pods: {pods}"

    def pending_fits(self, tracked: Tracked) -> bool:
        """A pod kube-scheduler holds unschedulable that some node has room for now: it binds once
        its backoff ends."""
        counts = self.charge.mirror.free_count
        return any(p.unschedulable and not p.gated and p.node is None and max(counts) >= tracked.job.gpus_per_pod
                   for p in tracked.pods.values())
