"""The placement strategies, each registered once with its rules (as kube-scheduler registers its
plugins): how its pods are laid out and which ordering ranks the candidate domains, how a placed
decision and a wait are held, and its line in docs/reference/annotations.md. The decision, the
holds, the mutation and the annotation's check read a strategy's rules from REGISTRY; none asks
which strategy it is. A new strategy is a name in `Strategy` and its rules here, nothing else.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Mapping


class Strategy(str, enum.Enum):
    """How a workload wants its pods laid out (annotation `placement-strategy`): the name a request
    carries. What each does is its registration in REGISTRY (`Strategy.rules`)."""

    CONSOLIDATED = "consolidated"
    DISTRIBUTED = "distributed"
    BALANCED = "balanced"

    @property
    def rules(self) -> StrategyRules:
        return REGISTRY[self]


class Layout(str, enum.Enum):
    """How the pods are laid out, and the ordering of core/orderings.py that ranks the domains."""

    TIGHTEST = "tightest"  # every pod in the tightest domain that holds them all (`best_fit`), held to its nodes
    SPREAD = "spread"  # one pod per node, round-robin over the leaves with most open nodes (`roomiest`), held to
    # the scope the spread runs in, and kept apart by topology spread constraints


class Waits(str, enum.Enum):
    """How a wait (no room now) is held, with `pin_when_waiting` on and waiting there paying
    (placement/enforce.py, placement/waiting.py)."""

    PINNED = "pinned"  # required where it waits, widened as far as waiting pays
    PINNED_WHERE_IT_PAYS = "pinned-where-it-pays"  # so only with `pin_only_where_locality_pays`, in a workload
    # whose work ends that asked for no preference of its own (`PlacementRequest.may_pin_wait`); else preferred
    PREFERRED = "preferred"  # only preferred: the scheduler may start its pods anywhere


@dataclass(frozen=True)
class StrategyRules:
    """One strategy: its name, how it lays pods out, how its decisions are held, and what it does in a line."""

    name: Strategy
    layout: Layout
    pinned: bool  # a placed decision is required node affinity; False: a preference
    waits: Waits
    doc: str  # its row in docs/reference/annotations.md


DEFAULT = Strategy.BALANCED  # a workload that names none

REGISTRY: Mapping[Strategy, StrategyRules] = {rules.name: rules for rules in (
    StrategyRules(Strategy.CONSOLIDATED, Layout.TIGHTEST, pinned=True, waits=Waits.PINNED,
                  doc="every pod in the tightest domain that holds them all (the best fit), required; a wait is "
                      "pinned as wide as waiting pays"),
    StrategyRules(Strategy.DISTRIBUTED, Layout.SPREAD, pinned=True, waits=Waits.PREFERRED,
                  doc="one pod per node, round-robin over the leaves, for failure isolation; with `latency-sensitive` "
                      "inside one domain of the level above the leaves; a wait is only preferred"),
    StrategyRules(Strategy.BALANCED, Layout.TIGHTEST, pinned=False, waits=Waits.PINNED_WHERE_IT_PAYS,
                  doc="the consolidated choice as a preference; a wait is pinned where waiting pays, unless the "
                      "user asked only for a preference"),
)}
