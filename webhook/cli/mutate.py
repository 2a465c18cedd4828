"""`topology-webhook mutate`: the webhook's dry run on manifest files, for CI. Each object is
admitted in turn against the cluster from files, seeing the reservations of the ones before it."""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
import uuid
from typing import Any, Sequence

import yaml

from .. import admission
from ..objects.manifests import read_objects
from ..serving.page.render import write_page
from ..admission.recent import RecentDecisions
from ..settings.loading import load_config
from ..objects import feed
from ..objects.dra_objects import in_namespace
from ..objects.kinds import kind_of_object
from ..state.dra import DRA_KINDS, RESOURCE_SLICE_MAX_DEVICES
from .inputs import (CLUSTER_FILE_MAX_BYTES, MANIFEST_FILE_MAX_BYTES, OBJECT_MAX_BYTES, MiB, file_index, read_cluster,
                     say_levels, within_api_limits)
from .program import PROG, UsageError


class _Expanded(yaml.SafeDumper):
    """Every object written out where it stands, never as an anchor and aliases: the mutation
    shares what it leaves alone with the manifest read, whose anchors can make one object stand in
    two places of the output (webhook/objects/reconcile.py)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def register(subparsers: Any) -> None:
    mutate = subparsers.add_parser(
        "mutate", help="dry-run the webhook on manifest files (for CI)",
        description="Place and mutate the workloads in the files, in order (each sees the reservations of the "
                    "ones before). Exit 0 when all are admitted, 1 when any is denied, 2 on bad input. Refused as "
                    f"bad input: a --nodes/--pods file over {CLUSTER_FILE_MAX_BYTES // MiB} MiB, a -f file over "
                    f"{MANIFEST_FILE_MAX_BYTES // MiB} MiB, an object over the apiserver's {OBJECT_MAX_BYTES // MiB} "
                    f"MiB, what else the apiserver would refuse for its size (a ResourceSlice of over "
                    f"{RESOURCE_SLICE_MAX_DEVICES} devices), "
                    "and YAML whose aliases expand without end.")
    mutate.add_argument("-f", "--filename", metavar="FILE", action="append", required=True,
                        help="YAML or JSON manifests, a directory of them, '-' for stdin; repeatable")
    mutate.add_argument("--nodes", metavar="FILE", required=True,
                        help="Node objects, and Karpenter NodePools or cluster-autoscaler's status ConfigMap to "
                             "know how the cluster can grow (kubectl get nodes,nodepools -o yaml)")
    mutate.add_argument("--pods", metavar="FILE", help="Pod objects (kubectl get pods -A -o yaml)")
    mutate.add_argument("--config", metavar="FILE", help="settings file (YAML)")
    mutate.add_argument("-o", "--output", choices=("yaml", "json", "patch"), default="yaml",
                        help="mutated objects as YAML or JSON, or per admitted object one line holding its JSON "
                             "Patch, as `kubectl patch --type=json -p` takes it (default: yaml)")
    mutate.add_argument("--explain", action="store_true", help="print each decision and its reasons on stderr")
    mutate.add_argument("--html", metavar="FILE",
                        help="also write the topology page (the cluster with these objects placed and held, and "
                             "their decisions) to FILE, one self-contained HTML file")
    mutate.set_defaults(func=cmd_mutate)


def describe(obj: dict, namespace: str) -> str:
    """`Job ml/train`, `Pod ml/trainer-` for a generateName object, `Job.batch.volcano.sh ml/run` for
    a kind whose name another group's kind has (webhook/objects/kinds.py)."""
    meta = obj.get("metadata") or {}
    kind = kind_of_object(obj)
    return f"{kind.key if kind else obj.get('kind')} {namespace}/{meta.get('name') or meta.get('generateName') or '?'}"


def explain(label: str, result: admission.AdmissionResult) -> list[str]:
    decision = result.decision
    where = f" in {decision.scope}" if decision is not None and decision.scope is not None else ""
    lines = [f"{label}: {result.outcome}{where}"]
    if decision is not None:
        lines.extend(f"  - {reason}" for reason in decision.reasons)
    return lines


MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")


def manifest_paths(paths: Sequence[str]) -> list[str]:
    """As kubectl -f takes them: a directory stands for its .yaml/.yml/.json files (not its
    subdirectories), in name order; `-` is stdin."""
    out = []
    for path in paths:
        if path != "-" and os.path.isdir(path):
            found = sorted(os.path.join(path, name) for name in os.listdir(path)
                           if name.endswith(MANIFEST_SUFFIXES) and os.path.isfile(os.path.join(path, name)))
            if not found:
                raise UsageError(f"-f {path}: the directory holds no .yaml, .yml or .json files")
            out.extend(found)
        else:
            out.append(path)
    return out


def cmd_mutate(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    cluster = read_cluster(args)
    # every input read and checked before anything is built or said: bad input is one line, exit 2
    objects = [obj for path in manifest_paths(args.filename)
               for obj in within_api_limits(path, read_objects(path, max_bytes=MANIFEST_FILE_MAX_BYTES))]
    if not objects:
        raise UsageError(f"no objects passed to mutate: {', '.join(args.filename)} hold(s) no Kubernetes object")
    index, _ = file_index(config, cluster)
    say_levels(index, lambda warning: print(f"Warning: {warning}", file=sys.stderr), logging.DEBUG)
    mutated, patches, denied = [], [], 0
    decisions = RecentDecisions()
    for position, obj in enumerate(objects):
        namespace = (obj.get("metadata") or {}).get("namespace") or "default"
        label = describe(obj, namespace)
        # A CREATE as the apiserver sends it; not dryRun, so later objects see this one's reservation.
        uid = str(uuid.uuid5(uuid.NAMESPACE_URL, f"{PROG}/mutate/{position}/{label}"))
        result = admission.review(admission.make_review(obj, namespace=namespace, uid=uid), index, config)
        decisions.record(result, time.time())
        response = result.review["response"]
        for warning in result.warnings:
            print(f"Warning: {warning}", file=sys.stderr)  # as kubectl prints them; they name the object
        if not response["allowed"]:
            denied += 1
            message = (response.get("status") or {}).get("message") or "no reason given"
            # The webhook's messages name the object already; name it here only when one does not.
            # With --explain this line is the object's headline (no second "denied" line), its
            # decision's reasons, if it had one, below it.
            print(f"Error: {label} denied: {message.removeprefix(label + ': ')}", file=sys.stderr)
            for reason in explain(label, result)[1:] if args.explain else []:
                print(reason, file=sys.stderr)
            continue
        if args.explain:
            print("\n".join(explain(label, result)), file=sys.stderr)
        patches.append(list(result.patch))
        mutated.append(result.admitted)
        if obj.get("kind") in DRA_KINDS:  # a workload's ResourceClaimTemplate or PodGroup, ahead of it
            feed.upsert(index, in_namespace(result.admitted or obj, namespace))
    if args.output == "patch":  # one line per admitted object, each what `kubectl patch --type=json -p` takes
        for patch in patches:
            print(json.dumps(patch, separators=(",", ":")))
    elif args.output == "json":
        single = mutated[0] if len(mutated) == 1 else {"apiVersion": "v1", "kind": "List", "items": mutated}
        print(json.dumps(single, indent=2))
    elif mutated:  # streamed: a reader that closes stdout early shows as BrokenPipeError (see main)
        yaml.dump_all(mutated, sys.stdout, Dumper=_Expanded, sort_keys=False, explicit_start=len(mutated) > 1)
    if args.html:
        try:
            write_page(args.html, index, decisions, time.time())
        except OSError as err:
            raise UsageError(f"--html {args.html}: cannot write it ({err.strerror})") from None
    return 1 if denied else 0
