"""The placement orderings, each named and written once.

They travel as one value, `Orderings` (DEFAULT: the functions below): a cluster index is built
with one, its tree and the level orders kept sorted for the decision (state/bestfit.py) hold it,
and the decision (placement/decide.py) and the wait (placement/waiting.py) read their keys from
that tree, so both always rank by the same keys. An ablation (bench/ablation.py) builds its index
with a copy of DEFAULT that has one key replaced, and switches that rule off everywhere it is used.
Each returns a sort key: the smallest key wins (most_room_left's, the largest). Sorts that only
make output deterministic (by name or path) or order the reasons' text are not placement rules
and stay where they are.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol


class Ranked(Protocol):
    """What the orderings read of a domain or a node (topology.Domain and NodeState meet it)."""

    @property
    def partly_used(self) -> int: ...

    @property
    def free_gpus(self) -> int: ...

    @property
    def path(self) -> tuple: ...

    @property
    def freeing(self) -> int: ...

    def fits_now(self, gpus: int) -> int: ...

    def slots(self, gpus: int) -> int: ...


class GpuHost(Protocol):
    """What the node orderings read of a node (state/members.NodeState meets it)."""

    free: int

    @property
    def name(self) -> str: ...

    def pod_aligned(self, gpus: int) -> bool: ...


def best_fit(domain: Ranked, gpus: int) -> tuple:
    """Consolidated: the domain with the least room that still holds the pods (pods of `gpus` GPUs
    that fit), then the one with fewer partly used nodes, so jobs that span nodes stay apart from
    where small jobs run (the mirror of with_small_jobs_first), then the fewest free GPUs."""
    return domain.fits_now(gpus), domain.partly_used, domain.free_gpus, domain.path


def roomiest(domain: Ranked, gpus: int) -> tuple:
    """Distributed: the domain with the most nodes open to one more pod of `gpus` GPUs."""
    return -domain.slots(gpus), domain.path


def aligned_first(node: GpuHost, gpus: int) -> tuple:
    """A single-node pod among equally full nodes: one whose NVLink domain holds the pod whole wins."""
    return not node.pod_aligned(gpus), node.name


def with_small_jobs_first(domain: Ranked, gpus: int) -> tuple:
    """A single-node pod on its way down the tree: where small jobs already run, then the fullest.
    The gaps of a domain that a big job holds would break that domain up when the job ends
    (bench/RESULTS.md measures this)."""
    return -domain.partly_used, domain.fits_now(gpus), domain.free_gpus, domain.path


def closest_to_fitting(domain: Ranked, gpus: int) -> tuple:
    """A wait: of the domains that could ever hold the job, the one where most pods fit now, then
    the one freeing most GPUs soon (terminating pods), then the one with most free."""
    return -domain.fits_now(gpus), -domain.freeing, -domain.free_gpus, domain.path


# ----- how a job's pods are split under the domain chosen (placement/decide.py: _split) -------------

def roomiest_child(child: Ranked, gpus: int) -> tuple:
    """The children a split looks at, roomiest first: the fewest of them hold the pods."""
    return -child.fits_now(gpus), child.free_gpus, child.path


def even_share_fit(child: Ranked, gpus: int) -> tuple:
    """Across nodes, among the nodes that take an even share: the least room first. Unlike
    best_fit, partly used nodes do not count: every node chosen takes the same share of one job."""
    return child.fits_now(gpus), child.free_gpus, child.path


def smallest_first(child: Ranked, gpus: int) -> tuple:
    """Across nodes of uneven room: filled from the smallest, so the least share is as large as it can be."""
    return child.fits_now(gpus), child.path


def tightest_for_rest(child: Ranked, gpus: int, rest: int) -> tuple:
    """Across switches, the child the rest of the pods go to: the tightest that holds them all."""
    return child.fits_now(gpus) < rest, child.fits_now(gpus), child.free_gpus, child.path


# ----- distributed: where pods spread (placement/decide.py: _distributed, _spread) ---------------------

def one_pod_per_node_fit(domain: Ranked, gpus: int, pods: int) -> tuple:
    """Latency-sensitive: the tightest domain with a node open for every pod, else the one with most."""
    return domain.slots(gpus) < pods, domain.slots(gpus), domain.free_gpus, domain.path


def widest_spread(domain: Ranked, gpus: int) -> tuple:
    """A max-domain level: the domain with the most nodes open to a pod, then the fullest."""
    return -domain.slots(gpus), domain.free_gpus, domain.path


def tightest_node(node: GpuHost) -> tuple:
    """Inside a leaf, the open node with the least room takes a pod first."""
    return node.free, node.name


def round_robin(taken: int, open_left: int, group: int) -> tuple:
    """The next leaf to take a pod: the one that took fewest, then the one with most open nodes left."""
    return taken, -open_left, group


def most_room_left(node: GpuHost, gpus: int, pods_here: int) -> tuple:
    """More pods than open nodes: the next pod stacks onto the node with the most room left (the
    largest key wins)."""
    return node.free - gpus * pods_here, node.name


@dataclass(frozen=True)
class Orderings:
    """Every ordering above, as a value: DEFAULT, or a copy with one replaced (an ablation)."""

    best_fit: Callable[[Ranked, int], tuple] = best_fit
    roomiest: Callable[[Ranked, int], tuple] = roomiest
    aligned_first: Callable[[GpuHost, int], tuple] = aligned_first
    with_small_jobs_first: Callable[[Ranked, int], tuple] = with_small_jobs_first
    closest_to_fitting: Callable[[Ranked, int], tuple] = closest_to_fitting
    roomiest_child: Callable[[Ranked, int], tuple] = roomiest_child
    even_share_fit: Callable[[Ranked, int], tuple] = even_share_fit
    smallest_first: Callable[[Ranked, int], tuple] = smallest_first
    tightest_for_rest: Callable[[Ranked, int, int], tuple] = tightest_for_rest
    one_pod_per_node_fit: Callable[[Ranked, int, int], tuple] = one_pod_per_node_fit
    widest_spread: Callable[[Ranked, int], tuple] = widest_spread
    tightest_node: Callable[[GpuHost], tuple] = tightest_node
    round_robin: Callable[[int, int, int], tuple] = round_robin
    most_room_left: Callable[[GpuHost, int, int], tuple] = most_room_left


DEFAULT = Orderings()
