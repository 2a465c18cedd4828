"""A replica's allotment: GPUs it claims ahead, in the claims Lease, for its own next placements.

With each write of the claims Lease (shared_claims.py), a replica that places also claims, under its own
key (`allotment/<identity>`), the nodes of one small domain, whole (at most 1/ALLOTMENT_SHARE of the
free GPUs it sees, and at most ALLOTMENT_MOST_GPUS, free there): the domain it had while it keeps
room, else one around its latest placement written. Every other replica holds every GPU of those
nodes, as it holds any claim; this replica does not, and searches that domain first. A placement
that lands wholly inside the allotment is admitted without a write: the allotment already keeps
every other replica off its GPUs, including those freed there after it was written (holds that
lapse, pods that end). A thread of the replica writes such placements as claims of their own
within FLUSH_SECONDS, with the allotment, and renews it while it is used. While this replica
places distributed spreads (which round-robin over the leaves with room, so one small domain never
holds them), the allotment also holds, whole, the roomiest node of each of the roomiest leaves
outside its domain (up to the same bound of free GPUs again), and a spread is decided on those
nodes first: taken when every pod lands on a node and a leaf of its own. Unused for
ALLOTMENT_IDLE_SECONDS, or when the replica stops, it is given back. Placements of a group
and releases by the gate are always written before their answer: the other replicas learn from
the Lease which nodes a group has, and that a gated workload was started.

What keeps "no two claims share a GPU":
- a placement is taken from the allotment only while the allotment has time left for two writes
  and a flush (its writer's clock);
- the other replicas hold an allotment for one more lifetime than it says (their clocks may run ahead);
- while a write is in flight, only GPUs the allotment keeps in that write too are taken, and after
  a write whose outcome is unknown (a timeout), still only those, until a newer version is read;
- every write of the replica carries every placement taken and not yet written.

Asking back: a replica that would answer a wait for room while other replicas' allotments hold
GPUs (and those with the free GPUs it may use could hold the workload) writes `wanted/<their
key>` into the Lease and decides again once they are gone, within the first half of its claims
budget. A replica whose allotment is wanted takes nothing more from it and gives it back with its
next write (what it took goes in the same write as claims). Without this, a replica took
another's allotment for busy GPUs and pinned its waits where they never started.

The price: GPUs in one replica's allotment wait a few seconds for the other replicas' work (less
than a second for a workload that would otherwise wait), and a replica that dies within
FLUSH_SECONDS of such a placement leaves it covered only until its allotment lapses, not for a
hold's lifetime.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable, Mapping

from ..core.gpus import format_gpu_set, parse_gpu_set
from ..placement import walk
from ..placement.placer import CONFLICT
from ..state.holds import Reservation
from ..state.index import ClusterIndex
from ..state.ports import Allotted
from .claims_text import sets_of

ALLOTMENT_PREFIX = "allotment/"  # a replica's allotment: claims key allotment/<identity>
ALLOTMENT_SHARE = 8  # an allotment holds at most 1/ALLOTMENT_SHARE of the free GPUs its replica sees,
ALLOTMENT_MOST_GPUS = 512  # and at most this many (a leaf of a large cluster): more is written, read and held for nothing
ALLOTMENT_LIFETIMES = 6  # an allotment is claimed for this many claims' time budgets (12 s by default)
ALLOTMENT_IDLE_SECONDS = 5.0  # unused for this long, it is given back
FLUSH_SECONDS = 0.25  # placements taken from the allotment are written together, this long at most after the first
WANT_PREFIX = "wanted/"  # wanted/<an allotment's key>: another replica asks for it back, until the claim's time
WANT_LEAST_SECONDS = 1.0  # a want lasts at least this long: its holder sees it within a poll, a flush and a write

Chosen = tuple[tuple, dict[str, frozenset[int]], tuple[str, ...]]  # an allotment to write: its domain's path,
# node -> GPU ids, its nodes for spreads


def claim_of(now: float, seconds: float, sets: Mapping[str, list[tuple[int, ...]]]) -> dict:
    """A claim as the Lease carries it: lapsing `seconds` after `now` (wall clock)."""
    return {"expires": round(now + seconds, 3),
            "sets": {node: [format_gpu_set(ids) for ids in gpu_sets] for node, gpu_sets in sets.items()}}


def claim_of_hold(hold: Reservation, index: ClusterIndex, now: float) -> dict:
    """The claim of a hold of this replica's ledger: its sets, lapsing when the hold does once
    firm, and the admission it was made for: every replica holds it as provisional until its
    own watch shows that admission stored (state/holds.py)."""
    claim = claim_of(now, (hold.firm_until or hold.expires_at) - index.now(), hold.sets)
    return {**claim, "stamp": hold.stamp} if hold.stamp else claim


def made(problem: str | None) -> bool | None:
    """Whether a write answered `problem` was made: yes, no (409: another replica's came first),
    or unknown (a timeout, or a failure the API may have answered after making it)."""
    return True if problem is None else False if problem == CONFLICT else None


def want_of(now: float, seconds: float) -> dict:
    """What asks for an allotment back: a claim of no GPUs, lapsing `seconds` after `now`."""
    return claim_of(now, seconds, {})


def asking_back(applied: Mapping[str, dict], own: str, lifetime: float, now: float, seconds: float
                ) -> tuple[int, dict[str, dict]]:
    """The GPUs the other replicas' allotments hold now (where a wait may be decided for want of
    GPUs that only stand in for another replica's next placements), and the claims that ask for
    those not asked for yet (or no longer than a flush from now), for `seconds` or WANT_LEAST_SECONDS."""
    theirs = [key for key, claim in applied.items() if key.startswith(ALLOTMENT_PREFIX) and key != own
              and claim["sets"] and lapses(key, claim, lifetime) > now]
    held = sum(len(ids) for key in theirs for sets in sets_of(applied[key]).values() for ids in sets)
    asked = {key for key in theirs if applied.get(WANT_PREFIX + key, {}).get("expires", 0.0) > now + FLUSH_SECONDS}
    seconds = max(seconds, WANT_LEAST_SECONDS)
    return held, {WANT_PREFIX + key: want_of(now, seconds) for key in theirs if key not in asked}


def lapses(key: str, claim: dict, lifetime: float) -> float:
    """When a replica stops holding a claim (wall clock): when it says, and another replica's
    allotment one `lifetime` later, so that clocks ahead of its writer's do not free GPUs it may
    still take."""
    return claim["expires"] + (lifetime if key.startswith(ALLOTMENT_PREFIX) else 0.0)


class Allotment:
    """This replica's allotment, as the newest applied version of the Lease has it, and the
    placements taken from it. Read and changed under the index's lock."""

    def __init__(self, index: ClusterIndex, identity: str, budget_seconds: float, wall: Callable[[], float],
                 share: int) -> None:
        self.index = index
        self.key = ALLOTMENT_PREFIX + identity
        self.budget_seconds = budget_seconds
        self.wall = wall
        self.share = share  # 0 (the default, serve --claims-allotments for ALLOTMENT_SHARE): no allotment
        self.gpus: dict[str, frozenset[int]] = {}  # node -> GPU ids
        self.expires = 0.0  # wall clock
        self.path: tuple | None = None  # the domain it lies in
        self.spread: tuple[str, ...] = ()  # and its nodes for spreads, across leaves
        self.spreads_asked = float("-inf")  # time.monotonic(): a spread last asked for it
        self.next: dict[str, frozenset[int]] | None = None  # what the write in flight keeps of it
        self.spent: dict[str, Reservation] = {}  # placed inside it, not yet written as claims
        self.uncovered: set[str] = set()  # of those, the ones whose allotment lapsed (said once)
        self.last_used = float("-inf")  # time.monotonic(): last taken, or taken from
        self.wake = threading.Event()  # a placement was taken from it
        self.wanted_until = 0.0  # wall clock: another replica asked for it back until then

    @property
    def seconds(self) -> float:
        return ALLOTMENT_LIFETIMES * self.budget_seconds

    def applied(self, claim: dict | None, wanted: dict | None = None) -> None:
        """A version of the Lease was applied, with this replica's allotment `claim` or without, and
        another replica's asking for it back (`wanted`) or not."""
        self.wanted_until = wanted["expires"] if wanted else 0.0
        self.gpus = {node: frozenset(i for text in texts for i in parse_gpu_set(text))
                     for node, texts in claim["sets"].items()} if claim else {}
        self.expires = claim["expires"] if claim else 0.0
        self.path = tuple(tuple(pair) for pair in claim.get("domain") or ()) or None if claim else None
        self.spread = tuple(sorted(claim.get("spread") or ())) if claim else ()

    def wanted(self) -> bool:
        """Another replica asked for it back: nothing more is taken from it, and it is given back now."""
        return self.wanted_until > self.wall()

    def _spendable(self) -> bool:
        return (bool(self.gpus) and self.expires - self.wall() >= 2 * self.budget_seconds + FLUSH_SECONDS
                and not self.wanted())

    def touch(self) -> None:
        """It is in use: not idle."""
        self.last_used = time.monotonic()

    def allotted(self, spreading: bool = False) -> Allotted | None:
        """The allotment's domain and nodes for spreads, while placements may be taken from it.
        `spreading`: a spread asks, so its next writes hold nodes for spreads (while spreads come)."""
        if spreading:
            self.spreads_asked = time.monotonic()
        return Allotted(self.path, self.spread) if self.path and self._spendable() else None

    def spend(self, key: str) -> bool:
        """Whether `key`'s hold (just made) lies wholly inside the allotment, which then stands for
        it until it is written: True means no write is needed now."""
        hold = self.index.hold(key)
        if hold is None or not self._spendable():
            return False
        for allotted in (self.gpus, self.next):
            if allotted is not None and not all(set(ids) <= allotted.get(node, frozenset())
                                                for node, sets in hold.sets.items() for ids in sets):
                return False
        self.spent[key] = hold
        self.uncovered.discard(key)
        self.touch()
        self.wake.set()
        return True

    def due(self) -> bool:
        """Whether a write is due: placements to write, or the allotment to renew or give back."""
        return bool(self.spent) or (bool(self.gpus) and (time.monotonic() - self.last_used >= ALLOTMENT_IDLE_SECONDS
                                                         or self.expires - self.wall() < self.seconds / 2
                                                         or self.wanted()))

    def compose(self, claims: dict[str, dict], near: str | None, keep: bool = True) -> dict[str, Reservation]:
        """Add to a write's `claims` the placements taken and not yet written, and the allotment
        chosen around node `near` (the latest placement written; None: around its own domain),
        unless it is not to be kept. Until the write is answered, only GPUs in both allotments may
        be taken."""
        spent = dict(self.spent)
        for key, hold in spent.items():
            if self.index.hold(key) is hold:
                claims[key] = claim_of_hold(hold, self.index, self.wall())
        theirs = {node for key, claim in claims.items() if key.startswith(ALLOTMENT_PREFIX) and key != self.key
                  for node in claim["sets"]}
        chosen = self._choose(near, theirs) if keep and not self.wanted() else None
        self.next = chosen[1] if chosen else {}
        if chosen:
            claims[self.key] = {**claim_of(self.wall(), self.seconds,
                                           {node: [tuple(sorted(ids))] for node, ids in chosen[1].items()}),
                                "domain": [list(pair) for pair in chosen[0]], "spread": list(chosen[2])}
        return spent

    def written(self, spent: dict[str, Reservation], outcome: bool | None) -> None:
        """After the write `compose` added to: made (True), refused (False: what it carried stays
        to write), or unknown (None: it may have been made, so until a newer version is applied
        only GPUs both versions allot are taken); `made` tells which."""
        kept, self.next = self.next or {}, None
        if outcome is None:
            self.gpus = {node: ids & kept[node] for node, ids in self.gpus.items() if ids & kept.get(node, frozenset())}
        if not outcome:
            return
        for key, hold in spent.items():
            if self.spent.get(key) is hold:  # not placed anew since
                del self.spent[key]

    def lapsed(self) -> list[str]:
        """Placements still unwritten whose allotment has lapsed, each named once: nothing covers them."""
        if self.expires > self.wall():
            return []
        lapsed = sorted(self.spent.keys() - self.uncovered)
        self.uncovered.update(lapsed)
        return lapsed

    def _choose(self, near: str | None, theirs: set[str]) -> Chosen | None:
        """The allotment's own domain while a quarter of what an allotment may hold is free there,
        else the widest domain around node `near` (the latest placement written) holding at most
        1/share of the free GPUs and ALLOTMENT_MOST_GPUS, below the whole cluster: every node of
        it but those in other replicas' allotments (`theirs`), whole, so that GPUs freed there
        later are the allotment's too. None when the allotment is given back: idle, or no domain
        small enough has room.

        Why it stays: placements that miss it (distributed spreads, a pod larger than its room)
        land anywhere, and an allotment following each of them moves under the placements being
        taken from it, which then miss too."""
        tree = self.index.whole_tree()
        if not self.share or time.monotonic() - self.last_used >= ALLOTMENT_IDLE_SECONDS:
            return None
        cap = min(tree.root.free_gpus // self.share, ALLOTMENT_MOST_GPUS)
        own: Any = walk.lookup(tree, self.path) if self.path else None
        member: Any = own if own is not None and cap // 4 <= own.free_gpus <= cap else tree.nodes.get(near or "", own)
        if member is None or member.free_gpus > cap:
            return None
        while member.parent is not None and member.parent is not tree.root and member.parent.free_gpus <= cap:
            member = member.parent
        gpus = {node.name: frozenset(range(node.gpus)) for node in walk.nodes_under(member)
                if node.eligible and node.name not in theirs}
        spread = self._spread_nodes(member, cap, theirs | gpus.keys())
        gpus.update((name, frozenset(range(tree.nodes[name].gpus))) for name in spread)
        return (member.path, gpus, spread) if gpus else None

    def _spread_nodes(self, domain: Any, cap: int, left_out: set[str]) -> tuple[str, ...]:
        """Nodes for its spreads while spreads come, whole: those it had that still have free GPUs,
        then the roomiest node of each of the roomiest leaves it has none in (outside `domain`),
        leaf after leaf, until their free GPUs reach `cap`. A spread round-robins over leaves,
        which one small domain cannot hold; these let it be answered without a write too."""
        tree = self.index.whole_tree()
        if not tree.levels or time.monotonic() - self.spreads_asked >= ALLOTMENT_IDLE_SECONDS:
            return ()
        usable = [tree.nodes[name] for name in self.spread if name in tree.nodes and name not in left_out]
        chosen = [node for node in usable if node.eligible and node.free]
        free = sum(node.free for node in chosen)
        had = {node.parent for node in chosen}
        for leaf in sorted(tree.levels[-1].values(), key=lambda leaf: -leaf.free_gpus) if free < cap else ():
            if free >= cap or not leaf.free_gpus:
                break
            if leaf in had or walk.is_under(leaf.path, domain.path):
                continue
            node = max((n for n in walk.nodes_under(leaf) if n.eligible and n.free and n.name not in left_out),
                       key=lambda n: n.free, default=None)
            if node is not None:
                chosen.append(node)
                free += node.free
        return tuple(sorted(node.name for node in chosen))
