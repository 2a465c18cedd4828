"""Kubernetes objects from files: multi-document YAML or JSON, `kind: List` flattened, `-` for stdin.

Reads what `kubectl get ... -o yaml|json` prints and what users `kubectl apply -f`.
"""
from __future__ import annotations

import json
import os
import stat
import sys
from typing import IO, Any

import yaml

SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml: 10k-node dumps load in seconds
# Aliases (*name) repeat what their anchor names without repeating its text: nested ones grow a
# small file exponentially ("billion laughs"). Per file they may add at most this many YAML nodes
# beyond those written; kubectl never writes an alias.
MAX_ALIAS_NODES = 1_000_000


class ManifestError(ValueError):
    """A file cannot be read as Kubernetes objects; the message names the file and the problem."""


def _documents(text: str, source: str) -> list:
    try:
        if text.lstrip().startswith(("{", "[")):
            try:
                return [json.loads(text)]
            except ValueError:
                pass  # YAML flow style also starts with { or [: let the YAML parser judge
        return _yaml_documents(text, source)
    except yaml.YAMLError as err:
        raise ManifestError(f"{source}: not valid YAML or JSON ({' '.join(str(err).split())})") from None


def _yaml_documents(text: str, source: str) -> list:
    """The documents, each parsed to its nodes first: aliases that would expand the file by more
    than MAX_ALIAS_NODES nodes, or an alias inside what it names, are refused before anything is
    built from them (the objects built share an alias's target; what reads them later does not)."""
    if "&" not in text:  # no anchor, so no alias: nothing to expand
        return list(yaml.load_all(text, Loader=SafeLoader))
    loader = SafeLoader(text)
    try:
        documents: list = []
        added = 0
        while loader.check_node():
            node = loader.get_node()
            added += _alias_nodes(node, source, len(documents) + 1, MAX_ALIAS_NODES - added)
            documents.append(loader.construct_document(node))
        return documents
    finally:
        loader.dispose()


def _alias_nodes(root: Any, source: str, number: int, allowed: int) -> int:
    """How many nodes the aliases of one document add to it once expanded (each node's expanded
    size counted once, so linear in the nodes written)."""
    # id(node) -> its expanded size; capped where it exceeds what the nodes finished so far could
    # allow, which already decides the answer (and keeps the numbers small)
    sizes: dict[int, int] = {}
    stack: list[tuple[Any, bool]] = [(root, False)]
    open_nodes: set[int] = set()
    while stack:
        node, finished = stack.pop()
        key = id(node)
        children = _children(node)
        if finished:
            sizes[key] = min(allowed + 2 + len(sizes), 1 + sum(sizes[id(c)] for c in children))
            open_nodes.discard(key)
        elif key in open_nodes:
            raise ManifestError(f"{source}: document {number} holds an alias inside the node it names (a "
                                "recursive structure, which no Kubernetes object is)")
        elif key not in sizes:
            open_nodes.add(key)
            stack.append((node, True))
            stack.extend((child, False) for child in children if id(child) not in sizes)
    added = sizes[id(root)] - len(sizes)
    if added > allowed:
        raise ManifestError(f"{source}: document {number}: aliases (*name) would expand the file by more than "
                            f"{MAX_ALIAS_NODES} YAML nodes; allowed: at most {MAX_ALIAS_NODES} nodes added by "
                            "aliases per file")
    return added


def _children(node: Any) -> list:
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _too_big(source: str, max_bytes: int, size: int | None = None) -> ManifestError:
    found = f"{size} bytes" if size is not None else f"more than {max_bytes} bytes"
    return ManifestError(f"{source}: {found} is too big; allowed: at most {max_bytes} bytes "
                         f"({max_bytes / 2 ** 20:g} MiB) per file")


def _read_text(path: str, source: str, stdin: IO[str] | None, max_bytes: int | None) -> str:
    """The file's text; with `max_bytes`, refused unread when larger (at most max_bytes + 1
    characters are read from a pipe)."""
    limit = -1 if max_bytes is None else max_bytes + 1
    if path == "-":
        text = (stdin or sys.stdin).read(limit)
    else:
        with open(path, encoding="utf-8") as handle:
            info = os.fstat(handle.fileno())
            if max_bytes is not None and stat.S_ISREG(info.st_mode) and info.st_size > max_bytes:
                raise _too_big(source, max_bytes, info.st_size)
            text = handle.read(limit)
    if max_bytes is not None and (len(text) > max_bytes or len(text.encode("utf-8", "surrogatepass")) > max_bytes):
        raise _too_big(source, max_bytes)
    return text


def _flatten(doc: object, source: str, position: str) -> list[dict]:
    if isinstance(doc, list):
        return [obj for i, item in enumerate(doc) for obj in _flatten(item, source, f"{position} item {i + 1}")]
    if not isinstance(doc, dict) or not isinstance(doc.get("kind"), str):
        raise ManifestError(f"{source}: {position} is not a Kubernetes object (a mapping with a kind)")
    if doc["kind"] == "List" or (doc["kind"].endswith("List") and isinstance(doc.get("items"), list)):
        items = doc.get("items") or []
        return [obj for i, item in enumerate(items) for obj in _flatten(item, source, f"{position} item {i + 1}")]
    for section in ("metadata", "spec", "status"):  # later steps read these as mappings
        if doc.get(section) is not None and not isinstance(doc[section], dict):
            raise ManifestError(f"{source}: {position} ({doc['kind']}): {section} is {doc[section]!r}, not a mapping")
    return [doc]


def read_objects(path: str, stdin: IO[str] | None = None, kind: str | tuple[str, ...] | None = None,
                 max_bytes: int | None = None) -> list[dict]:
    """All objects in the file (`-` reads stdin), in order; with `kind` (one or several), every
    object must be of it; with `max_bytes`, a larger file is refused before it is parsed."""
    source = "stdin" if path == "-" else path
    try:
        text = _read_text(path, source, stdin, max_bytes)
    except OSError as err:
        raise ManifestError(f"{source}: {err.strerror}") from None
    except UnicodeDecodeError:
        raise ManifestError(f"{source}: not a UTF-8 text file") from None
    objects = []
    try:
        for number, doc in enumerate(_documents(text, source), start=1):
            if doc is not None:  # empty documents between `---` separators
                objects.extend(_flatten(doc, source, f"document {number}"))
    except RecursionError:
        raise ManifestError(f"{source}: nested too deeply to read") from None
    kinds = (kind,) if isinstance(kind, str) else kind
    if kinds:
        for obj in objects:
            if obj["kind"] not in kinds:
                name = (obj.get("metadata") or {}).get("name", "?")
                raise ManifestError(f"{source}: {obj['kind']} {name} found; this file may only hold "
                                    f"{', '.join(kinds)} objects")
    return objects
