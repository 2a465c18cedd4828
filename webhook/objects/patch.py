"""The JSONPatch (RFC 6902) from the object the apiserver sent to the object we want.

Only what changed is patched: the parts equal on both sides are left out before anything is
diffed (`changed_parts`), and a list only appended to (our env after a user's, our expressions
after theirs) is patched by adding its new items after the kept ones, with no diff at all: a
review's patch costs what we write, not what the user's lists hold. The rest is diffed by
`jsonpatch`, which escapes `~` and `/` in keys (`topology.scheduler~1placement`) and adds a
missing parent as a whole value instead of adding under it. A patch that decodes but does not
apply is a 500 the apiserver does not let failurePolicy absorb, so every diff is applied here to
the received parts first and must give exactly the mutated ones; the appends are exact by
construction (`make_patch`).
"""
from __future__ import annotations

import base64
import functools
from typing import Any

import jsonpatch
import orjson

# What JSON has not is written as `str` writes it (a `creationTimestamp` YAML loaded as a datetime,
# keys YAML loaded as numbers), as json.dumps(default=str) did.
_AS_JSON = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_NON_STR_KEYS
_APPENDED = object()  # what changed_parts gives for a list only appended to: left out of the diff
_POINTER_ESCAPES = str.maketrans({"~": "~0", "/": "~1"})  # RFC 6901, as jsonpatch writes a key in a path
# Patches remembered by the shape of what changed: pods placed alike (a group's members, a
# controller's replicas, a burst of copies of one manifest, single-node pods of one size and
# strategy) change alike but for their strings, and their patch is made and checked once.
_REMEMBERED = 256


class PatchError(RuntimeError):
    """The computed patch does not turn the received object into the mutated one (a bug)."""


def make_patch(received: Any, mutated: Any) -> list[dict]:
    """The operations that turn `received` into `mutated`; [] when they are equal. Both are taken
    as JSON documents, as the apiserver holds them: no shared sub-objects, and values YAML gives
    that JSON has not (a `creationTimestamp` loaded as a datetime) compared as text.

    The diff's operations come first, then one `add` per item appended to a list, at its index.
    That is exact: such a list is at the same path on both sides, so are its parents (mappings on
    both sides, or items of lists of one length, matched by index: changed_parts), and the diff
    neither replaces nor removes a parent both sides hold, nor shifts the indices of a list it
    sees at one length, so every add lands after the items the received list holds."""
    appended: dict[tuple[str, ...], tuple[int, list]] = {}
    received_part, mutated_part = changed_parts(received, mutated, appended)
    operations = [] if received_part is _APPENDED else _checked_diff(received_part, mutated_part)
    for path, (kept, items) in appended.items():
        pointer = "".join(f"/{part.translate(_POINTER_ESCAPES)}" for part in path)
        values = orjson.loads(orjson.dumps(items, default=str, option=_AS_JSON))  # fresh, and as JSON has them
        operations += [{"op": "add", "path": f"{pointer}/{kept + i}", "value": value} for i, value in enumerate(values)]
    return operations


def _checked_diff(received: Any, mutated: Any) -> list[dict]:
    """jsonpatch's operations from one document to the other, applied to the first to check them;
    fresh objects each call, whether made now or remembered.

    They are made for the documents' shape: every string value stood in for by a placeholder,
    equal strings by the same one. Two pods placed alike but on other nodes, GPUs or names then
    share one patch, made and checked once, and each gets it with its own strings put back. That
    is exact: a patch of adds, removes and replaces reaches values only by their paths, which name
    keys and indices, never strings in values; so renaming the strings of both documents and of
    the operations alike keeps a patch that applies, and gives what it gave. It holds for a diff
    that compares values only for equality, as `JsonPatch.from_diff` does (a diff that reads
    strings' text, such as one finding appends to strings, would see the placeholders')."""
    placeholders: dict[str, str] = {}
    texts = (orjson.dumps(_shape(doc, placeholders), option=orjson.OPT_NON_STR_KEYS) for doc in (received, mutated))
    operations = orjson.loads(_checked_operations(*texts))
    strings = {placeholder: text for text, placeholder in placeholders.items()}
    for operation in operations:
        if "value" in operation:
            operation["value"] = _named(operation["value"], strings)
    return operations


def _shape(doc: Any, placeholders: dict[str, str]) -> Any:
    """`doc` with each string value replaced by its placeholder (numbered as first met); a value
    JSON has not (a `creationTimestamp` YAML loaded as a datetime) taken as its text, as
    json.dumps(default=str) writes it. Keys stay: they are the paths."""
    kind = type(doc)  # exact types first: this walks every changed part of every review
    if kind is dict:
        return {key: _shape(value, placeholders) for key, value in doc.items()}
    if kind is list or kind is tuple:
        return [_shape(value, placeholders) for value in doc]
    if doc is None or kind is int or kind is bool or kind is float:
        return doc
    if not isinstance(doc, str):  # anything else as JSON writes it (an enum by its value, a datetime as text)
        return _shape(orjson.loads(orjson.dumps(doc, default=str, option=_AS_JSON)), placeholders)
    doc = str.__str__(doc)  # its value, a str subclass's (a str enum) included, as JSON writes it
    placeholder = placeholders.get(doc)
    if placeholder is None:
        placeholder = placeholders[doc] = f"\x00{len(placeholders)}"
    return placeholder


def _named(value: Any, strings: dict[str, str]) -> Any:
    """A value of the shape's patch with its placeholders' strings put back."""
    kind = type(value)
    if kind is str:
        return strings[value]
    if kind is dict:
        return {key: _named(item, strings) for key, item in value.items()}
    if kind is list:
        return [_named(item, strings) for item in value]
    return value


@functools.lru_cache(maxsize=_REMEMBERED)
def _checked_operations(received_text: bytes, mutated_text: bytes) -> bytes:
    """The checked operations between two documents written as JSON, as JSON. The same two texts
    give the same operations, so they are remembered (an error is not: it is raised again)."""
    received, mutated = orjson.loads(received_text), orjson.loads(mutated_text)
    # add/remove/replace only: finding moves serializes every added and removed value (about a
    # tenth of a review's time), and our mutations add and remove items, they never move them
    diff = jsonpatch.JsonPatch.from_diff(received, mutated, optimization=False)
    try:  # `received` is our private copy, decoded above, so it may be patched in place
        result = diff.apply(received, in_place=True)
    except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as err:
        raise PatchError(f"patch does not apply to the received object: {err}") from None
    if result != mutated:
        raise PatchError("patch applied to the received object does not give the mutated object")
    return orjson.dumps(diff.patch)


def changed_parts(received: Any, mutated: Any, appended: dict[tuple[str, ...], tuple[int, list]] | None = None,
                  path: tuple[str, ...] = ()) -> tuple[Any, Any]:
    """Both documents with every part that is equal on both sides left out, at every depth. The
    diff and its check then walk what changed, not the whole object (comparing and copying equal
    parts was most of a review's patching time), and give the same operations: a mapping key
    equal on both sides gives none, and the keys left keep their paths, their parents included.

    Two lists of one length are compared item by item, as a mapping from index to item: the same
    paths (`/spec/containers/0/env`), and what differs inside an item is patched inside it, never
    by replacing the list. Given `appended`, a list only appended to (our env after a user's, our
    expressions after theirs) is left out too (`_APPENDED` on both sides), and recorded there by
    path with its kept length and its new items: jsonpatch would serialize every item of two lists
    of different lengths to match them up, a cost that grew with the user's list. Other lists of
    different lengths are kept whole, for the diff to match up."""
    if isinstance(received, list) and isinstance(mutated, list):
        kept = len(received)
        if kept == len(mutated):
            indices = [str(i) for i in range(kept)]
            received, mutated = dict(zip(indices, received)), dict(zip(indices, mutated))
        elif appended is not None and 0 < kept < len(mutated) and mutated[:kept] == received:
            appended[path] = (kept, mutated[kept:])
            return _APPENDED, _APPENDED
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
        received_part, mutated_part = changed_parts(value, other, appended, (*path, str(key)))
        if received_part is not _APPENDED:
            kept_received[key], kept_mutated[key] = received_part, mutated_part
    for key, other in mutated.items():
        if key not in received:
            kept_mutated[key] = other
    return kept_received, kept_mutated


def encode(operations: list[dict]) -> str:
    """The `response.patch` field: base64 of the JSON array."""
    return base64.b64encode(orjson.dumps(operations)).decode("ascii")
