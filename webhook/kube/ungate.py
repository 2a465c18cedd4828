"""`topology-webhook ungate`: lift our scheduling gate from the pods it holds, through the API.

The chart's pre-delete hook runs `ungate --all` before an uninstall, because nothing releases a
gated pod once the webhook is gone; a person runs the same after removing the webhook by hand.
Only our gate goes (the pod's record says we added it), with the wait's annotations; every other
gate stays. A pod pinned while waiting (gate_waits off) keeps its pin: Kubernetes lets a pod's node
affinity change only while it is gated, so such a pod is named, not changed. A gated Job's pod
template keeps our gate: the API lets it change only while the Job is suspended with no active pod,
which a running Job is not (why not suspend it, or widen our rights: docs/operations/upgrades.md).
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Iterator, Mapping

from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException

from ..core import injection
from ..objects import mutation
from ..objects.patch import make_patch
from ..objects.feed import holds_our_gate
from ..credentials.kubeclient import KubeconfigError, api_client_from

JSON_PATCH = "application/json-patch+json"
PAGE = 500


def register(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "ungate", help="lift our scheduling gate from the pods it holds (before an uninstall)",
        description="Lift the scheduling gate topology.scheduler/placement from every pod the webhook gated "
                    "(only ours: other gates stay), so kube-scheduler places them without us. Run by the chart's "
                    "pre-delete hook. Exit codes: 0 every gated pod lifted, 1 some could not be, 2 bad arguments "
                    "or no cluster.")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--all", action="store_true", help="in every namespace")
    where.add_argument("-n", "--namespace", metavar="NS", help="in this namespace only")
    parser.add_argument("--dry-run", action="store_true", help="say what would be lifted; change nothing")
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster service account)")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    try:
        api: Any = k8s_client.CoreV1Api(api_client_from(args.kubeconfig))
    except KubeconfigError as err:
        print(f"ungate: {err}", file=sys.stderr)
        return 2
    lifted = failed = pinned = 0
    try:
        for pod in _pods(api, None if args.all else args.namespace):
            meta = pod.get("metadata") or {}
            who = f"{meta.get('namespace')}/{meta.get('name')}"
            if _pinned_wait(pod):
                pinned += 1
                print(f"pod {who}: waits pinned to {meta['annotations'][injection.WAITING_FOR]}; its pin stays "
                      "(delete the pod to let its controller make one without it)")
                continue
            if not (holds_our_gate(pod) and injection.recorded(pod).gated):
                continue
            operations = [{"op": "test", "path": "/spec/schedulingGates", "value": pod["spec"]["schedulingGates"]},
                          *make_patch(pod, mutation.ungated(pod))]
            if args.dry_run:
                print(f"pod {who}: would lift gate {injection.GATE}")
                lifted += 1
                continue
            try:
                api.patch_namespaced_pod(meta["name"], meta["namespace"], operations, _content_type=JSON_PATCH,
                                         _preload_content=False)
                lifted += 1
                print(f"pod {who}: gate {injection.GATE} lifted")
            except ApiException as err:
                if err.status == 404:
                    continue  # gone meanwhile
                failed += 1
                print(f"pod {who}: could not lift the gate (HTTP {err.status} {err.reason})", file=sys.stderr)
    except ApiException as err:
        print(f"ungate: listing pods failed (HTTP {err.status} {err.reason})", file=sys.stderr)
        return 2
    print(f"ungate: {lifted} pod(s) {'to lift' if args.dry_run else 'lifted'}, {failed} failed, "
          f"{pinned} pinned wait(s) left as they are", file=sys.stderr)
    return 1 if failed else 0


def _pods(api: Any, namespace: str | None) -> Iterator[dict]:
    """Every pending pod, a page at a time (bound pods are no gate's)."""
    token = None
    while True:
        kwargs = {"limit": PAGE, "field_selector": "spec.nodeName=", "_preload_content": False}
        if token:
            kwargs["_continue"] = token
        answer = (api.list_namespaced_pod(namespace, **kwargs) if namespace
                  else api.list_pod_for_all_namespaces(**kwargs))
        page = json.loads(answer.data)
        yield from page.get("items") or ()
        token = (page.get("metadata") or {}).get("continue")
        if not token:
            return


def _pinned_wait(pod: Mapping) -> bool:
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    return (injection.WAITING_FOR in annotations and not holds_our_gate(pod)
            and bool(injection.recorded(pod).required))
