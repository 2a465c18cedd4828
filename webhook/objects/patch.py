"""The JSONPatch (RFC 6902) from the object the apiserver sent to the object we want.

`jsonpatch` escapes `~` and `/` in keys (`topology.scheduler~1placement`) and adds a
missing parent as a whole value instead of adding under it. A patch that decodes but does not
apply is a 500 the apiserver does not let failurePolicy absorb, so every patch is applied here
to the received object first and must give exactly the mutated one.
"""
from __future__ import annotations

import base64
from typing import Any

import jsonpatch
import orjson

# The round trip that makes our private copies writes what JSON has not as `str` does (a
# `creationTimestamp` YAML loaded as a datetime, keys YAML loaded as numbers), as json.dumps did.
_AS_JSON = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_NON_STR_KEYS


class PatchError(RuntimeError):
    """The computed patch does not turn the received object into the mutated one (a bug)."""


def make_patch(received: Any, mutated: Any) -> list[dict]:
    """The operations that turn `received` into `mutated`; [] when they are equal. Both are taken
    as JSON documents, as the apiserver holds them: no shared sub-objects, and values YAML gives
    that JSON has not (a `creationTimestamp` loaded as a datetime) compared as text."""
    received, mutated = (orjson.loads(orjson.dumps(doc, default=str, option=_AS_JSON))
                         for doc in changed_parts(received, mutated))
    # add/remove/replace only: finding moves serializes every added and removed value (about a
    # tenth of a review's time), and our mutations add and remove items, they never move them
    diff = jsonpatch.JsonPatch.from_diff(received, mutated, optimization=False)
    try:  # `received` is our private copy from the round trip above, so it may be patched in place
        result = diff.apply(received, in_place=True)
    except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as err:
        raise PatchError(f"patch does not apply to the received object: {err}") from None
    if result != mutated:
        raise PatchError("patch applied to the received object does not give the mutated object")
    return diff.patch


def changed_parts(received: Any, mutated: Any) -> tuple[Any, Any]:
    """Both documents with every part that is equal on both sides left out, at every depth. The
    diff and its check then walk what changed, not the whole object (comparing and copying equal
    parts was most of a review's patching time), and give the same operations: a mapping key
    equal on both sides gives none, and the keys left keep their paths, their parents included.

    Two lists of one length are compared item by item, as a mapping from index to item: the same
    paths (`/spec/containers/0/env`), and what differs inside an item is patched inside it, never
    by replacing the list. Lists of different lengths are kept whole, for the diff to match up."""
    if isinstance(received, list) and isinstance(mutated, list) and len(received) == len(mutated):
        indices = [str(i) for i in range(len(received))]
        received, mutated = dict(zip(indices, received)), dict(zip(indices, mutated))
    if not (isinstance(received, dict) and isinstance(mutated, dict)):
        return received, mutated
    kept_received, kept_mutated = {}, {}
    for key, value in received.items():
        if key not in mutated:
            kept_received[key] = value
            continue
        other = mutated[key]
        if value is other or value == other:
            continue
        kept_received[key], kept_mutated[key] = changed_parts(value, other)
    for key, other in mutated.items():
        if key not in received:
            kept_mutated[key] = other
    return kept_received, kept_mutated


def encode(operations: list[dict]) -> str:
    """The `response.patch` field: base64 of the JSON array."""
    return base64.b64encode(orjson.dumps(operations)).decode("ascii")
