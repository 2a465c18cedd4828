"""Best fit and roomiest at one level of the tree without visiting every domain of that level.

The consolidated rule takes, at a level, the domain with the least room that still holds the
workload: the smallest `orderings.best_fit` key (pods of g GPUs that fit, partly used nodes, free
GPUs, path) that fits `pods`. The distributed rule spreads over the leaves with the most nodes open
to one more pod: the smallest `orderings.roomiest` key (-slots(g), path). Both keys end with the
domain's path, which the orders read back. Scanning a level costs its number of domains (3,125 leaves at 100,000 nodes);
this keeps, per level, rule and pod size g, the level's domains sorted by that key, so an answer is
one binary search or the first few entries.

Events must stay cheap, and every pod event moves the free GPUs (part of the key) of every domain
above its node, for every g. So events only append the domains they touch to the level's change
list, and an order brings itself up to date from that list when it is next read: the cost is paid
by the decisions that read it (one that a single node holds never does), in proportion to what
changed since, never per event and never per domain.
"""
from __future__ import annotations

from bisect import bisect_left, insort
from typing import Callable, Generic, Mapping, Protocol, TypeVar

from ..core import orderings


class Tracked(orderings.Ranked, Protocol):
    """A domain the orders keep (topology.Domain meets it)."""

    touched: int  # the epoch of its last entry in `changed`


R = TypeVar("R", bound=Tracked)

FIT, OPEN = "fit", "open"


class LevelOrders(Generic[R]):
    """Sorted orders of one level's domains, one per rule and pod size asked for, kept lazily."""

    def __init__(self, domains: Callable[[], Mapping[tuple, R]], keys: orderings.Orderings = orderings.DEFAULT):
        self._domains = domains  # the level's current domains by path
        # Each rule's key: the tree's orderings, which the decision ranks by too.
        self._keys: dict[str, Callable[[R, int], tuple]] = {FIT: keys.best_fit, OPEN: keys.roomiest}
        self.changed: list[R] = []  # domains touched since the oldest order last caught up
        # (rule, g) -> (sorted keys, key by path), and how far into `changed` that order is current
        self._orders: dict[tuple[str, int], tuple[list[tuple], dict[tuple, tuple]]] = {}
        self._seen: dict[tuple[str, int], int] = {}
        self._limit = 1024  # changes past which sorting afresh is cheaper than catching up
        # One entry per domain between two catch-ups is enough: an order reads the domain as it
        # is when it catches up. Every catch-up starts a new epoch.
        self.epoch = 0

    def touch(self, domain: R) -> None:
        if domain.touched == self.epoch:
            return
        domain.touched = self.epoch
        self.changed.append(domain)
        if len(self.changed) > self._limit:
            self.reset()

    def reset(self) -> None:
        self.changed.clear()
        self._orders.clear()
        self._seen.clear()

    def _current(self, rule: str, gpus: int) -> list[tuple]:
        """The sorted keys of `rule` for pods of `gpus` GPUs, brought up to date first."""
        domains = self._domains()
        key, which = self._keys[rule], (rule, gpus)
        if which not in self._orders:
            keyed = {path: key(d, gpus) for path, d in domains.items()}
            self._orders[which] = (sorted(keyed.values()), keyed)
        else:
            keys, keyed = self._orders[which]
            for domain in {id(d): d for d in self.changed[self._seen[which]:]}.values():
                path = domain.path
                live = domains.get(path) is domain  # not pruned since
                new = key(domain, gpus) if live else None
                old = keyed.get(path)
                if old == new:  # a move this order does not see (about half of them for `open`)
                    continue
                if old is not None:
                    del keys[bisect_left(keys, old)]
                    del keyed[path]
                if new is not None:
                    keyed[path] = new
                    insort(keys, new)
        self._seen[which] = len(self.changed)
        self.epoch += 1
        self._limit = 4 * len(domains) + 1024
        done = min(self._seen.values())
        if done > len(self.changed) // 2:  # every order is past these: forget them
            del self.changed[:done]
            self._seen = {g: seen - done for g, seen in self._seen.items()}
        return self._orders[which][0]

    def best_fit(self, gpus: int, pods: int) -> R | None:
        """The domain with the least room that holds `pods` pods of `gpus` GPUs."""
        keys = self._current(FIT, gpus)
        i = bisect_left(keys, (pods,))
        return self._domains()[keys[i][3]] if i < len(keys) else None

    def roomiest(self, gpus: int, count: int) -> list[R]:
        """Up to `count` domains with the most nodes open to a pod of `gpus` GPUs, none without one."""
        keys = self._current(OPEN, gpus)
        domains = self._domains()
        return [domains[path] for slots, path in keys[:count] if slots < 0]
