"""The placement orderings, each named and written once.

The decision (placement.py) and the level orders kept sorted for it (bestfit.py) read them through
this module at call time, so an ablation (bench/ablation.py) switches a rule off in every place
it is used by replacing one name here. Each returns a sort key: the smallest key wins.
"""
from __future__ import annotations

from typing import Protocol

from .model import Interconnect


class Ranked(Protocol):
    """What the orderings read of a domain or a node (topology.Domain and NodeState meet it)."""

    @property
    def partly_used(self) -> int: ...

    @property
    def free_gpus(self) -> int: ...

    @property
    def path(self) -> tuple: ...

    def fits_now(self, gpus: int) -> int: ...

    def slots(self, gpus: int) -> int: ...


class GpuHost(Protocol):
    """What aligned_first reads of a node (topology.NodeState meets it)."""

    name: str

    @property
    def taken_ids(self) -> set[int]: ...

    def pick_gpus(self, count: int, taken: set[int]) -> tuple[int, ...]: ...

    def link_for(self, ids: tuple[int, ...]) -> Interconnect: ...


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
    return node.link_for(node.pick_gpus(gpus, node.taken_ids)) is not Interconnect.NVLINK, node.name


def with_small_jobs_first(domain: Ranked, gpus: int) -> tuple:
    """A single-node pod on its way down the tree: where small jobs already run, then the fullest.
    The gaps of a domain that a big job holds would break that domain up when the job ends
    (bench/RESULTS.md measures this)."""
    return -domain.partly_used, domain.fits_now(gpus), domain.free_gpus, domain.path
