"""The ports: what the index is handed by the adapters that kube/ builds (the claims Lease,
scale-ups), as the index and the placer call them, so that state/ and placement/ never import kube/."""
from __future__ import annotations

from typing import Mapping, NamedTuple, Protocol, Sequence

from ..core.model import PlacementRequest


class Allotted(NamedTuple):
    """What this replica's allotment offers a placement now: the domain a consolidated or balanced
    one searches first, and the nodes (one per leaf, across leaves) a spread tries first."""

    domain: tuple
    spread: tuple[str, ...]


class SharedClaims(Protocol):
    """Holds shared with other replicas; see webhook/kube/shared_claims.py."""

    budget_seconds: float

    def basis(self) -> int: ...  # the claims version decisions now see (read under the index lock)
    def claim(self, key: str, basis: int, deadline: float) -> str | None: ...  # None, CONFLICT or why not
    def allotted(self, spreading: bool = False) -> Allotted | None: ...  # to search first; None: none usable
    def spend(self, key: str) -> bool: ...  # True: key's new hold lies in the allotment, no claim needed now
    def ask_back(self, deadline: float, request: PlacementRequest) -> bool: ...  # True: others' allotments given back
    def unclaim(self, key: str, deadline: float) -> str | None: ...
    def alone(self, what: str, why: str) -> str: ...  # counts and logs; the warning to give


class ScaleUps(Protocol):
    """Scale-up requests (ProvisioningRequests) made for groups that wait for nodes; see
    webhook/kube/scaleups.py."""

    def create(self, objects: Sequence[Mapping]) -> str | None: ...  # None: they exist now; else why not
    def delete(self, namespace: str, name: str) -> None: ...
