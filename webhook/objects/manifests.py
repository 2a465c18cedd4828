"""Kubernetes objects from files: multi-document YAML or JSON, `kind: List` flattened, `-` for stdin.

Reads what `kubectl get ... -o yaml|json` prints and what users `kubectl apply -f`.
"""
from __future__ import annotations

import json
import sys
from typing import IO

import yaml

SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml: 10k-node dumps load in seconds


class ManifestError(ValueError):
    """A file cannot be read as Kubernetes objects; the message names the file and the problem."""


def _documents(text: str, source: str) -> list:
    if text.lstrip().startswith(("{", "[")):
        try:
            return [json.loads(text)]
        except ValueError:
            pass  # YAML flow style also starts with { or [: let the YAML parser judge
    try:
        return list(yaml.load_all(text, Loader=SafeLoader))
    except yaml.YAMLError as err:
        raise ManifestError(f"{source}: not valid YAML or JSON ({' '.join(str(err).split())})") from None


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


def read_objects(path: str, stdin: IO[str] | None = None, kind: str | tuple[str, ...] | None = None) -> list[dict]:
    """All objects in the file (`-` reads stdin), in order; with `kind` (one or several), every
    object must be of it."""
    source = "stdin" if path == "-" else path
    try:
        if path == "-":
            text = (stdin or sys.stdin).read()
        else:
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
    except OSError as err:
        raise ManifestError(f"{source}: {err.strerror}") from None
    except UnicodeDecodeError:
        raise ManifestError(f"{source}: not a UTF-8 text file") from None
    objects = []
    for number, doc in enumerate(_documents(text, source), start=1):
        if doc is not None:  # empty documents between `---` separators
            objects.extend(_flatten(doc, source, f"document {number}"))
    kinds = (kind,) if isinstance(kind, str) else kind
    if kinds:
        for obj in objects:
            if obj["kind"] not in kinds:
                name = (obj.get("metadata") or {}).get("name", "?")
                raise ManifestError(f"{source}: {obj['kind']} {name} found; this file may only hold "
                                    f"{', '.join(kinds)} objects")
    return objects
