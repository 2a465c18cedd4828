"""Answers of a pure function remembered by a key that holds all it reads."""
from __future__ import annotations

from typing import Any, Callable, Hashable, TypeVar

T = TypeVar("T")


class Memo:
    """Reading and counting 1M pods asks the same few questions again and again (pods made from
    one template, empty nodes of one kind), and answering afresh cost more than the rest. Forgotten
    wholesale past `limit` keys, so that a cluster of ever-new questions holds no more than that."""

    def __init__(self, limit: int = 4096) -> None:
        self.limit = limit
        self._answers: dict[Hashable, Any] = {}

    def get(self, key: Hashable, answer: Callable[..., T], *args: Any) -> T:
        """The answer for `key`, worked out as `answer(*args)` the first time (no closure is made
        per call: a relist asks once per pod)."""
        found = self._answers.get(key)
        if found is None:
            found = answer(*args)
            if len(self._answers) >= self.limit:
                self._answers.clear()
            self._answers[key] = found
        return found
