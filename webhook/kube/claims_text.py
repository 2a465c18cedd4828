"""What the replicas' claims Lease carries (shared_claims.py): its name, the annotation holding
the claims (reservation key -> {"expires": unix seconds, "sets": {node: GPU sets as text}, and
"stamp": the admission it was made for, where one was}), and the claims read from it and written
into it."""
from __future__ import annotations

import datetime
import logging
from typing import Mapping

import orjson

from ..core.gpus import parse_gpu_set

log = logging.getLogger(__name__)

LEASE_NAME = "topology-webhook-claims"
CLAIMS_ANNOTATION = "topology.scheduler/claims"


def read_claims(lease: dict | None, known: Mapping[str, dict] | None = None) -> dict[str, dict]:
    """The claims a Lease carries: key -> {"expires": unix seconds, "sets": {node: ["0-7", ...]}}.
    A claim that cannot be read is left out (logged): it must not stop the others. A claim equal
    to one in `known` (read before) is not checked again and is returned as that very object, so
    a reader tells it unchanged by identity: a write changes one claim of many."""
    text = (((lease or {}).get("metadata") or {}).get("annotations") or {}).get(CLAIMS_ANNOTATION)
    if not text:
        return {}
    try:
        claims = orjson.loads(text)
    except ValueError:
        log.warning("lease %s: annotation %s is not JSON; ignoring its claims", LEASE_NAME, CLAIMS_ANNOTATION)
        return {}
    readable: dict[str, dict] = {}
    known = known or {}
    for key, claim in claims.items() if isinstance(claims, dict) else ():
        before = known.get(key)
        if before is not None and before == claim:
            readable[key] = before
            continue
        try:
            sets_of(claim)
            if not isinstance(claim["expires"], (int, float)):
                raise TypeError("expires is not a number")
            if not isinstance(claim.get("stamp", ""), str):
                raise TypeError("stamp is not text")
            readable[key] = claim
        except (ValueError, TypeError, KeyError, AttributeError):
            log.warning("lease %s: claim %s cannot be read; ignoring it", LEASE_NAME, key)
    return readable


def claims_text(claims: dict[str, dict]) -> str:
    """The annotation's value: compact JSON, keys sorted. A write of ~500 pending claims (37 KB)
    encodes in 0.1 ms with orjson against 1.5 ms with json, on every placed review."""
    return orjson.dumps(claims, option=orjson.OPT_SORT_KEYS).decode()


def sets_of(claim: dict) -> dict[str, list[tuple[int, ...]]]:
    """node -> GPU sets of a claim; raises on anything else."""
    return {str(node): [parse_gpu_set(text) for text in sets]
            for node, sets in claim["sets"].items()}


def lease_body(claims: dict[str, dict], namespace: str, holder: str, replaces: dict | None, seconds: int) -> dict:
    """The Lease carrying `claims`, written by `holder`: in place of the version `replaces` (a
    compare-and-swap on its resourceVersion), or created when None."""
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    metadata: dict = {"name": LEASE_NAME, "namespace": namespace,
                      "labels": {"app.kubernetes.io/managed-by": "topology-webhook"},
                      "annotations": {CLAIMS_ANNOTATION: claims_text(claims)}}
    if replaces is not None:
        metadata["resourceVersion"] = replaces["metadata"]["resourceVersion"]
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata,
            "spec": {"holderIdentity": holder, "renewTime": now, "leaseDurationSeconds": seconds}}
