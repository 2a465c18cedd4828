"""The index's front holds (state/queries.py): outside `state/`, code asks the index questions and
never reaches its parts (`tree`, `ledger`, `pods`), and the index's lock is taken only where
webhook/state/index.py says: by the placer, and through `locked()` by the claims Lease and the page.

Read from the source (AST), by attribute name: every ClusterIndex in the package is `index` or
`self.index`, and no other object outside `state/` has a `tree`, `ledger` or `lock` attribute, so
the names alone find a reach, through an alias (`ledger = index.ledger`) too. `pods` is also a
request's, a node's and a group's (a count, a dict, a list), so it counts as a reach only on an
index, or when what is read of it is a PodCounts attribute (`x.pods.gated`)."""
from __future__ import annotations

import ast
import pathlib
from typing import Any, cast

from webhook.state.pods import PodCounts

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "webhook"
PARTS = {"tree", "ledger", "pods"}
LOCK_HOLDERS = {"webhook/placement/placer.py"}  # decides and holds under one lock (placer.py's docstring)
# Callers of ClusterIndex.locked(), whose docstring says why each needs the index held still.
LOCKED_CALLERS = {
    "webhook/kube/shared_claims.py",  # its applied claims and allotment, which the placer reads under the lock
    "webhook/serving/page/snapshot.py",  # one moment's sums of the tree and the holds
}


# What a PodCounts has, read of one: its methods and what its __init__ sets (it calls nothing of the index).
POD_COUNTS = {name for name in [*dir(PodCounts), *vars(PodCounts(cast(Any, None)))] if not name.startswith("__")}


def _is_index(node: ast.expr) -> bool:
    return (isinstance(node, ast.Name) and node.id == "index") or (isinstance(node, ast.Attribute) and node.attr == "index")


def reaches(source: str, where: str) -> list[tuple[int, str]]:
    """(line, what) of every reach into the index's parts, and every use of its lock or of
    locked() not allowed at `where`, in line order."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute):
            name, value = node.attr, node.value
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in {"getattr", "setattr"}
              and len(node.args) > 1 and isinstance(node.args[1], ast.Constant)):
            name, value = str(node.args[1].value), node.args[0]
        else:
            continue
        if name in {"tree", "ledger"} or (name == "pods" and _is_index(value)):
            found.append((node.lineno, f".{name}"))
        elif isinstance(value, ast.Attribute) and value.attr == "pods" and name in POD_COUNTS:
            found.append((node.lineno, f".pods.{name}"))
        elif (name == "lock" and where not in LOCK_HOLDERS) or (name == "locked" and where not in LOCKED_CALLERS):
            found.append((node.lineno, f".{name}"))
    return sorted(found)


def test_nothing_outside_state_reaches_the_index_parts_or_takes_its_lock_unlisted():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        where = path.relative_to(PACKAGE.parent).as_posix()
        if not where.startswith("webhook/state/"):
            found += [f"{where}:{line} {what}" for line, what in reaches(path.read_text(), where)]
    assert found == []


def test_every_listed_lock_taker_still_takes_it():
    """An allowance nobody uses any more is taken off the lists."""
    for where, name in [*((w, "lock") for w in LOCK_HOLDERS), *((w, "locked") for w in LOCKED_CALLERS)]:
        source = (PACKAGE.parent / where).read_text()
        assert any(isinstance(node, ast.Attribute) and node.attr == name for node in ast.walk(ast.parse(source))), where


def test_the_check_finds_reaches_through_any_name_and_spares_other_pods():
    source = """
ledger = index.ledger
view.tree.root
self.index.pods.counted()
held.pods.gated
getattr(index, "ledger")
with view.lock:
    pass
with index.locked():
    pass
request.pods + sum(node.pods.values()) + len(group.pods) + claimed.pods
"""
    assert reaches(source, "webhook/kube/example.py") == [
        (2, ".ledger"), (3, ".tree"), (4, ".pods"), (4, ".pods.counted"), (5, ".pods.gated"), (6, ".ledger"),
        (7, ".lock"), (9, ".locked")]
    assert reaches("with index.lock:\n    index.hold(key)\n", "webhook/placement/placer.py") == []
