"""Every manifest we ship, accepted by the real kube-apiserver (hack/local-cluster): each example in
examples/ and every chart render the tests make (tests/artifacts/test_chart.py's VALUE_SETS, rendered as
there), through `kubectl apply --dry-run=server` with kubectl's strict field validation, after our
own webhook (registered as the chart registers it) has had its say.

The operators' kinds are served from the CRD schemas in tests/fixtures/crds/ (schemas only: the
CustomResourceDefinitions are built here around them), installed for this module and removed
after it. Kinds without a CRD here are listed in EXCLUDED with the reason; the list is checked
both ways, so a new kind cannot slip past unchecked and a stale entry does not linger.
"""
from __future__ import annotations

import copy
import gzip
import json
import pathlib

import pytest
import yaml
from conftest import eventually
from kubernetes import client as k8s_client
from tests.artifacts.test_chart import VALUE_SETS, rendered

from webhook.objects.kinds import kind_of_object
from webhook.objects.templates import pod_templates

ROOT = pathlib.Path(__file__).resolve().parents[2]
CRDS = ROOT / "tests" / "fixtures" / "crds"
EXAMPLES = sorted(path.name for path in (ROOT / "examples").glob("*.yaml"))
PLACEMENT = "topology.scheduler/placement"
OUR_ENTRY = "placement.topology.scheduler"
# The scope each project's CRD declares (tests/fixtures/crds holds the schemas only): Karpenter's
# NodePool is cluster-scoped, every other operator kind is namespaced.
CLUSTER_SCOPED = {"NodePool"}

EXCLUDED = {
    ("cert-manager.io/v1", "Certificate"): "cert-manager publishes no CRD schema in tests/fixtures/crds; "
                                           "tests/artifacts/test_chart.py checks these objects field by field",
    ("cert-manager.io/v1", "Issuer"): "as Certificate",
    ("resource.nvidia.com/v1beta1", "ComputeDomain"): "NVIDIA's DRA driver CRD is not in tests/fixtures/crds; "
                                                      "the webhook only reads a ComputeDomain, never writes one",
    ("kubeflow.org/v1", "PyTorchJob"): "no CRD schema at a version we pin (tests/fixtures/crds/README.md); its "
                                       "pod templates are dry-run as Pods instead",
}


# ----- what there is to check ---------------------------------------------------------------------

def example(name: str) -> list[dict]:
    out = []
    for doc in yaml.safe_load_all((ROOT / "examples" / name).read_text()):
        if doc:
            out.extend(doc["items"] if doc.get("kind") == "List" else [doc])
    return out


def render(case: str) -> list[dict]:
    return [copy.deepcopy(obj) for obj in rendered(case)]


def every_object() -> list[dict]:
    return [obj for name in EXAMPLES for obj in example(name)] + [obj for case in VALUE_SETS for obj in render(case)]


def kind_of(obj: dict) -> tuple[str, str]:
    return obj["apiVersion"], obj["kind"]


def crd_files() -> dict[tuple[str, str], pathlib.Path]:
    """(apiVersion, kind) -> its schema file, named group_version_Kind.json.gz."""
    out = {}
    for path in CRDS.glob("*.json.gz"):
        group, version, kind = path.name.removesuffix(".json.gz").split("_")
        out[(f"{group}/{version}", kind)] = path
    return out


def structural(schema):
    """The schema as the apiserver takes it: `additionalProperties: false` beside `properties` (the
    JSON-schema catalogue's way of saying "no other fields") is not allowed in a CRD, where unknown
    fields are what kubectl's strict field validation refuses anyway."""
    if isinstance(schema, dict):
        out = {key: structural(value) for key, value in schema.items()}
        if out.get("additionalProperties") is False:
            del out["additionalProperties"]
        return out
    if isinstance(schema, list):
        return [structural(value) for value in schema]
    return schema


def crd(api_version: str, kind: str, path: pathlib.Path) -> dict:
    group, _, version = api_version.partition("/")
    plural = f"{kind.lower()}s"
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.{group}"},
            "spec": {"group": group, "scope": "Cluster" if kind in CLUSTER_SCOPED else "Namespaced",
                     "names": {"kind": kind, "plural": plural, "singular": kind.lower(), "listKind": f"{kind}List"},
                     "versions": [{"name": version, "served": True, "storage": True, "schema": {
                         "openAPIV3Schema": structural(json.loads(gzip.decompress(path.read_bytes())))}}]}}


def get(cluster, path: str) -> tuple[int, bytes]:
    api = cluster.api
    answer = api.call_api("GET", f"{api.configuration.host}{path}", header_params={
        "Accept": "application/json", "Authorization": api.configuration.api_key["BearerToken"]})
    answer.read()
    return answer.status, answer.data


def raw(cluster, path: str) -> dict:
    status, data = get(cluster, path)
    assert status == 200, (path, status)
    return json.loads(data)


def served_kinds(cluster) -> set[tuple[str, str]]:
    """Every (apiVersion, kind) the apiserver serves now, from its discovery."""
    def kinds(path: str) -> set[tuple[str, str]]:
        listing = raw(cluster, path)
        return {(listing["groupVersion"], r["kind"]) for r in listing["resources"] if "/" not in r["name"]}
    groups = raw(cluster, "/apis")["groups"]
    out = kinds("/api/v1")
    for group in groups:
        for version in group["versions"]:
            out |= kinds(f"/apis/{version['groupVersion']}")
    return out


def established(cluster, definition: dict) -> bool:
    """Whether the CRD is Established and discovery serves its kind: a busy apiserver lists the new
    group in /apis and answers 404 at /apis/<group>/<version> for a moment after Established."""
    found = k8s_client.ApiextensionsV1Api(cluster.api).read_custom_resource_definition(definition["metadata"]["name"])
    if not any(c.type == "Established" and c.status == "True" for c in (found.status.conditions or ())):
        return False
    spec = definition["spec"]
    status, data = get(cluster, f"/apis/{spec['group']}/{spec['versions'][0]['name']}")
    return status == 200 and any(r["kind"] == spec["names"]["kind"] for r in json.loads(data)["resources"])


def dry_run(cluster, objects: list[dict]) -> list[dict]:
    """`kubectl apply --dry-run=server` of the objects; fails the test naming every object the
    apiserver (or an admission step before it) refused. Returns what the apiserver answered."""
    result = cluster.kubectl("apply", "--dry-run=server", "-o", "json", "-f", "-",
                             stdin=yaml.safe_dump_all(objects), check=False)
    assert result.returncode == 0, f"the apiserver refused: {result.stderr.strip()}"
    answer = json.loads(result.stdout)
    items = answer["items"] if answer.get("kind") == "List" else [answer]
    names = sorted((o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]) for o in items)
    assert names == sorted((o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]) for o in objects)
    return items


# ----- the cluster, ready for them ------------------------------------------------------------------

@pytest.fixture(scope="module")
def ready(cluster):
    """The operators' CRDs the manifests need, the namespaces they name, and our webhook registered
    for the operators' kinds as the chart's `webhook.operators` list registers it; all removed after."""
    objects = every_object()
    files = crd_files()
    served = served_kinds(cluster)
    needed = sorted({kind_of(o) for o in objects if kind_of(o) not in served and kind_of(o) in files})
    definitions = [crd(api_version, kind, files[(api_version, kind)]) for api_version, kind in needed]
    namespaces = sorted({ns for o in objects if (ns := o["metadata"].get("namespace"))}
                        - {n.metadata.name for n in cluster.core.list_namespace().items})
    live = json.loads(cluster.kubectl("get", "mutatingwebhookconfigurations", "-o", "json").stdout)["items"]
    entry = next(w for c in live for w in c["webhooks"] if w["name"] == OUR_ENTRY)
    registered = {g for rule in entry["rules"] for g in rule["apiGroups"]}
    chart_entry = next(w for o in render("operators") if o["kind"] == "MutatingWebhookConfiguration"
                       for w in o["webhooks"] if w["name"] == OUR_ENTRY)
    operators = copy.deepcopy(entry)  # the live entry's URL, CA and match conditions
    operators["name"] = "operators.e2e.topology.scheduler"
    operators["rules"] = [r for r in chart_entry["rules"] if not set(r["apiGroups"]) & registered]
    assert operators["rules"], "the operators value set registers no operator kinds"
    configuration = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
                     "metadata": {"name": "e2e-operators"}, "webhooks": [operators]}
    try:
        for name in namespaces:
            cluster.core.create_namespace({"metadata": {"name": name}})
        cluster.kubectl("apply", "--server-side", "-f", "-", stdin=yaml.safe_dump_all([*definitions, configuration]))
        for definition in definitions:
            eventually(lambda: established(cluster, definition), timeout=30,
                       what=f"CRD {definition['metadata']['name']} established")
        yield served_kinds(cluster)
    finally:
        cluster.kubectl("delete", "mutatingwebhookconfiguration", "e2e-operators", "--ignore-not-found", check=False)
        for definition in definitions:
            cluster.kubectl("delete", "crd", definition["metadata"]["name"], "--ignore-not-found", "--wait=false",
                            check=False)
        for name in namespaces:
            cluster.kubectl("delete", "namespace", name, "--ignore-not-found", "--wait=false", check=False)


# ----- the checks ---------------------------------------------------------------------------------------

def test_every_kind_is_served_or_excluded_for_a_stated_reason(ready):
    unserved = {kind_of(o) for o in every_object()} - ready
    assert unserved == set(EXCLUDED), (f"kinds neither served nor excluded: {sorted(unserved - set(EXCLUDED))}; "
                                       f"excluded but not met any more: {sorted(set(EXCLUDED) - unserved)}")


@pytest.mark.parametrize("name", EXAMPLES)
def test_every_example_is_accepted_by_the_apiserver(cluster, ready, name):
    objects = example(name)
    checked = [o for o in objects if kind_of(o) not in EXCLUDED]
    if checked:
        dry_run(cluster, checked)
    for obj in objects:  # an excluded workload kind: its pod templates, as the Pods they become
        if kind_of(obj) in EXCLUDED and kind_of_object(obj) is not None:
            pods = [{"apiVersion": "v1", "kind": "Pod", "metadata": {
                **found.template.get("metadata", {}), "name": f"{obj['metadata']['name']}-{index}",
                "namespace": obj["metadata"]["namespace"]}, "spec": found.template["spec"]}
                for index, found in enumerate(pod_templates(kind_of_object(obj), obj))]
            assert pods, f"{kind_of(obj)} has no pod templates to check"
            dry_run(cluster, pods)


@pytest.mark.parametrize("case", VALUE_SETS)
def test_every_chart_render_is_accepted_by_the_apiserver(cluster, ready, case):
    objects = render(case)
    checked = [o for o in objects if kind_of(o) not in EXCLUDED]
    assert checked
    dry_run(cluster, checked)


@pytest.mark.parametrize("name", ["jobset.yaml", "mpijob.yaml", "raycluster.yaml"])
def test_our_placement_of_an_operator_object_survives_its_crd_schema(cluster, ready, name):
    """Our patch to a custom resource is not refused or pruned: every pod template comes back with
    the placement written into it."""
    (obj,) = example(name)
    (answer,) = dry_run(cluster, [obj])
    templates = pod_templates(kind_of_object(answer), answer)
    assert templates
    for found in templates:
        assert PLACEMENT in (found.template.get("metadata") or {}).get("annotations", {}), found.template
        assert found.template["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
