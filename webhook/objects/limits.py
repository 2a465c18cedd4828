"""How much of an object a review takes on, and what the apiserver takes back.

A review's work grows with the lists of a pod template that it walks, copies and patches: its
containers above all (each is counted for GPUs and resources, checked, and the ones that get our
environment are patched one by one). The apiserver bounds the body (3 MiB), not those lists: a
template of 20,000 containers fits, and took seconds a review. So an object of ours is taken on
only within bounds far above any workload, checked before anything walks it, and refused past
them with the count and the bound (`check_counts`). The node terms are bounded as a sealed gated
request is (webhook/core/injection.py): a wait with more could never be released.

What we write back must be what the apiserver stores: it refuses an object whose annotations
total more than 256 KiB (`oversized_annotations`), and a template's annotations carry our record.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..core.injection import INJECTED, MOST_NODE_TERMS, REQUIRED_TERMS, at
from ..core.model import ANNOTATION_PREFIX, MAPPINGS
from .kinds import WorkloadKind
from .templates import PodTemplate, field_path, mapping_of, pod_templates
from .user_annotations import InvalidWorkload

# Containers in all the pod templates of one object, init containers included. A training pod runs
# a few, a service-mesh pod a dozen; each costs a review tens of microseconds, this many a few ms.
MAX_CONTAINERS = 256
CONTAINER_LISTS = ("initContainers", "containers")
# The apiserver's limit on the annotations of one object (or pod template), keys and values in
# bytes: apimachinery's ValidateAnnotations, TotalAnnotationSizeLimitB.
ANNOTATIONS_MAX_BYTES = 256 * 1024


def check_counts(templates: Sequence[PodTemplate], who: str) -> None:
    """Raise InvalidWorkload when the pod templates hold more containers (or templates) than a
    review takes on, or a template more required node terms; counts only, nothing walked."""
    if len(templates) > MAX_CONTAINERS:
        raise InvalidWorkload(f"{who}: has {len(templates)} pod templates; allowed: at most {MAX_CONTAINERS}")
    counted = []
    for found in templates:
        spec = mapping_of(mapping_of(found.template).get("spec"))
        where = field_path(found.where, "spec")
        counted.append((where, [_length(spec.get(key)) for key in CONTAINER_LISTS]))
        terms = _length(at(spec, REQUIRED_TERMS))
        if terms > MOST_NODE_TERMS:
            raise InvalidWorkload(f"{who}: {where}.{'.'.join(REQUIRED_TERMS)} has {terms} terms; allowed: at most "
                                  f"{MOST_NODE_TERMS}")
    total = sum(sum(lengths) for _, lengths in counted)
    if total > MAX_CONTAINERS:
        largest = sorted(counted, key=lambda item: -sum(item[1]))[:3]
        where = ", ".join(f"{path}.{key}: {count}" for path, lengths in largest
                          for key, count in zip(CONTAINER_LISTS, lengths) if count)
        raise InvalidWorkload(f"{who}: has {total} containers in its pod templates ({where}); allowed: at most "
                              f"{MAX_CONTAINERS} in all, init containers included")


def oversized_annotations(kind: WorkloadKind | None, obj: Mapping, who: str) -> str | None:
    """Why the apiserver would refuse `obj` for the size of its annotations, or of a pod
    template's (their keys and values in UTF-8 bytes); None when it would not."""
    places = [("metadata", obj)]
    if kind is not None:
        places += [(field_path(found.where, "metadata"), found.template) for found in pod_templates(kind, obj)
                   if found.template is not obj and isinstance(found.template, MAPPINGS)]
    for where, node in places:
        annotations = mapping_of(mapping_of(node.get("metadata")).get("annotations"))
        sizes = {str(key): len(str(key).encode()) + len(str(value).encode()) for key, value in annotations.items()}
        total = sum(sizes.values())
        if total > ANNOTATIONS_MAX_BYTES:
            ours = sum(size for key, size in sizes.items() if key.startswith(ANNOTATION_PREFIX))
            return (f"{who}: {where}.annotations would total {total} bytes, {ours} of them topology.scheduler/ "
                    f"annotations ({sizes.get(INJECTED, 0)} in {INJECTED}); allowed: at most "
                    f"{ANNOTATIONS_MAX_BYTES} bytes, the apiserver's limit on the annotations of an object")
    return None


def _length(items: object) -> int:
    return len(items) if isinstance(items, list) else 0
