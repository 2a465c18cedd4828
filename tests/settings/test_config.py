import dataclasses
import json
import pathlib

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from webhook.cli import main
from webhook.kube.demo import make_node, make_pod
from webhook.objects import feed
from webhook.objects.feed import index_of
from webhook.settings.config import DEFAULT_PROFILES, Config, ConfigError
from webhook.settings.loading import config_from_mapping, levels_from, load_config
from webhook.settings.presets import PRESETS, detect_preset
from webhook.state.index import NodeGone

FIXTURES = pathlib.Path(__file__).parents[1] / "fixtures"


def test_default_levels_are_zone_spine_leaf():
    assert [lv.label for lv in Config().levels] == [
        "topology.kubernetes.io/zone", "topology.scheduler/spine", "topology.scheduler/leaf"]


def test_hostname_last_is_implicit_and_links_default_from_the_bottom():
    levels = levels_from(["a/x", "b/y", "kubernetes.io/hostname"])
    assert [(lv.label, lv.link) for lv in levels] == [("a/x", "spine"), ("b/y", "leaf")]


@pytest.mark.parametrize("spec, fragment", [
    ("nope", "unknown preset"),
    (["kubernetes.io/hostname", "a"], "may only be last"),
    (["a", "a"], "unique"),
    ([{"label": "a", "link": "warp"}], "link 'warp'"),
])
def test_bad_levels_name_the_problem(spec, fragment):
    with pytest.raises(ConfigError, match=fragment):
        levels_from(spec)


def test_presets_cover_the_platforms():
    assert {"default", "gke", "aws", "nvl72"} <= set(PRESETS)
    assert PRESETS["nvl72"][-1].label == "nvidia.com/gpu.clique" and PRESETS["nvl72"][-1].link == "nvlink"


def test_unknown_setting_is_an_error(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("levels: gke\nreservation_ttl: 5\n")
    with pytest.raises(ConfigError, match="reservation_ttl"):
        load_config(str(path))


def test_load_config_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("levels: gke\nnccl_profiles:\n  leaf: {NCCL_CROSS_NIC: '1'}\n")
    config = load_config(str(path))
    assert config.levels == PRESETS["gke"]
    assert config.nccl_profiles["leaf"] == {"NCCL_CROSS_NIC": "1"}
    assert config.nccl_profiles["nvlink"]  # other classes keep their defaults


@pytest.mark.parametrize("product, profile", [
    ("NVIDIA-H100-80GB-HBM3", "h100-sxm"), ("NVIDIA-H100-PCIe", "h100-pcie"), ("NVIDIA-A100-SXM4-80GB", "a100-sxm"),
    ("NVIDIA-GB200", "gb200-nvl72"), ("NVIDIA-H200", "h100-sxm"), ("Tesla-T4", "generic-pcie"), ("", "generic-pcie"),
])
def test_profile_for_product(product, profile):
    assert Config().profile_for(product).name == profile


def test_mapping_rejects_bad_profile():
    with pytest.raises(ConfigError, match="profiles"):
        config_from_mapping({"profiles": [{"name": "x"}]})


@pytest.mark.parametrize("text, fragment", [
    # wrong type
    ("reservation_ttl_seconds: abc\n", "reservation_ttl_seconds: 'abc' is not a number; allowed: a number from 1 to 86400"),
    ("max_body_bytes: 100\n", "max_body_bytes: 100 is out of range; allowed: 1024 to 3145728"),
    ("preferred_weight: 101\n", "preferred_weight: 101 is out of range; allowed: 1 to 100"),
    ("max_body_bytes: 2048.5\n", "max_body_bytes: 2048.5 is not a whole number"),
    ("pin_when_waiting: maybe\n", "pin_when_waiting: 'maybe' is not allowed; allowed: true, false"),
    ("refuse_unplaceable: 1\n", "refuse_unplaceable: 1 is not allowed; allowed: true, false"),
    ("provisioning_request_class: atomic\n", "provisioning_request_class: 'atomic' is not allowed; allowed: an empty "
     "string (none), best-effort-atomic-scale-up.autoscaling.x-k8s.io, check-capacity.autoscaling.x-k8s.io"),
    ("stale_after_seconds: true\n", "stale_after_seconds: True is not a number"),
    ("scheduler_names: my-scheduler\n", "scheduler_names: 'my-scheduler' is not a list"),
    ("nccl_profiles: {leaf: {NCCL_CROSS_NIC: [1]}}\n", "nccl_profiles.leaf.NCCL_CROSS_NIC: [1] is not allowed"),
    ("profiles: [{name: x, match: '(', nvlink_gbs: 1, pcie_gbs: 1, nic_gbs: 1, nics_per_node: 1}]\n",
     "profiles[0].match: '(' is not a regular expression"),
    # out of range
    ("reservation_ttl_seconds: -3\n", "reservation_ttl_seconds: -3 is out of range; allowed: 1 to 86400"),
    ("reservation_ttl_seconds: 0\n", "reservation_ttl_seconds: 0 is out of range"),
    ("cluster_oversubscription: 0.5\n", "cluster_oversubscription: 0.5 is out of range; allowed: 1 to 1000"),
    ("levels: [{label: a/b, oversubscription: -1}]\n", "levels[0].oversubscription: -1 is out of range"),
    ("profiles: [{name: x, match: x, nvlink_gbs: 0, pcie_gbs: 1, nic_gbs: 1, nics_per_node: 1}]\n",
     "profiles[0].nvlink_gbs: 0 is out of range"),
    # unknown key
    ("reservation_ttl: 5\n", "unknown setting(s) reservation_ttl; allowed: "),
    ("nccl_profiles: {nvswitch: {NCCL_P2P_LEVEL: NVL}}\n", "nccl_profiles: unknown key(s) nvswitch; allowed: "),
    ("levels: [{label: a/b, speed: 3}]\n", "levels[0]: unknown key(s) speed; allowed: label, link, name, oversubscription"),
    # what Kubernetes itself would refuse where we write it
    ('default_scheduler: "a\\nb"\n', "is not allowed; allowed: a scheduler name (a DNS-1123 subdomain"),
    ("default_scheduler: My_Scheduler\n", "default_scheduler: 'My_Scheduler' is not allowed"),
    ("scheduler_names: [ok, 'not ok']\n", "scheduler_names[1]: 'not ok' is not allowed; allowed: a scheduler name"),
    ("levels: ['not a label!!']\n", "levels[0]: 'not a label!!' is not a node label key"),
    ("levels: ['example.com/rack', '/leaf']\n", "levels[1]: '/leaf' is not a node label key"),
])
@pytest.mark.parametrize("command", ["serve", "mutate"])
def test_a_bad_setting_refuses_to_start_with_one_line_naming_key_value_and_allowed(
        tmp_path, capsys, monkeypatch, command, text, fragment):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    (tmp_path / "config.yaml").write_text(text)
    (tmp_path / "job.yaml").write_text("{}")
    argv = {"serve": ["serve", "--bind", "127.0.0.1:1", "--metrics-bind", "127.0.0.1:2"],
            "mutate": ["mutate", "-f", "job.yaml", "--nodes", str(FIXTURES / "demo-nodes.yaml")]}[command]
    code = main([*argv, "--config", "config.yaml"])
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.splitlines()) == 1 and fragment in err, err
    assert "serving" not in err


@pytest.mark.parametrize("command", ["serve", "mutate"])
def test_a_binary_config_file_refuses_to_start_with_one_line(tmp_path, capsys, monkeypatch, command):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    (tmp_path / "config.yaml").write_bytes(bytes(range(256)) * 4)
    argv = {"serve": ["serve", "--bind", "127.0.0.1:1", "--metrics-bind", "127.0.0.1:2"],
            "mutate": ["mutate", "-f", "job.yaml", "--nodes", str(FIXTURES / "demo-nodes.yaml")]}[command]
    assert main([*argv, "--config", "config.yaml"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [err.strip()] and "config file config.yaml: not" in err, err


@pytest.mark.parametrize("key", ["topology.kubernetes.io/zone", "rack", "example.com/a_b.c-d", "a.b/C9"])
def test_label_keys_kubernetes_accepts_are_accepted_as_levels(key):
    assert levels_from([key])[0].label == key


def test_good_settings_load_as_typed_values(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("reservation_ttl_seconds: 60\nmax_body_bytes: 1048576\npin_when_waiting: false\n"
                    "scheduler_names: [a, b]\nnccl_profiles: {leaf: {NCCL_CROSS_NIC: 1}}\n")
    config = load_config(str(path))
    assert (config.reservation_ttl_seconds, config.max_body_bytes, config.pin_when_waiting) == (60.0, 1048576, False)
    assert isinstance(config.reservation_ttl_seconds, float) and config.scheduler_names == ("a", "b")
    assert config.nccl_profiles["leaf"] == {"NCCL_CROSS_NIC": "1"}


def test_scheduler_names_may_be_empty_and_are_dns_subdomains():
    # As docs/reference/settings.md says: an empty list (only annotations make a workload ours), and
    # names the API takes as schedulerName, so "non-empty" is not enough.
    assert config_from_mapping({"scheduler_names": []}).scheduler_names == ()
    assert config_from_mapping({"scheduler_names": ["gpu.sched-1"]}).scheduler_names == ("gpu.sched-1",)
    for name in ("Upper", "under_score", "-lead", "a" * 254):
        with pytest.raises(ConfigError, match=r"DNS-1123 subdomain"):
            config_from_mapping({"scheduler_names": [name]})


# ----- levels: auto -------------------------------------------------------------------------------

@pytest.mark.parametrize("labels, preset", [
    ({"cloud.google.com/gce-topology-block": "b1", "cloud.google.com/gce-topology-subblock": "s1",
      "cloud.google.com/gce-topology-host": "h1", "topology.kubernetes.io/zone": "us-central1-a"}, "gke"),
    ({"topology.k8s.aws/network-node-layer-1": "nn-1", "topology.k8s.aws/network-node-layer-2": "nn-2",
      "topology.k8s.aws/network-node-layer-3": "nn-3", "topology.kubernetes.io/zone": "us-east-1a"}, "aws"),
    ({"nvidia.com/gpu.clique": "cluster-1.0", "topology.scheduler/leaf": "leaf-1"}, "nvl72"),  # GFD's clique label
    ({"topology.kubernetes.io/zone": "z", "topology.scheduler/spine": "s", "topology.scheduler/leaf": "l"}, "default"),
], ids=["gke", "aws", "gfd-clique", "default"])
def test_levels_auto_picks_the_preset_the_nodes_are_labelled_for(labels, preset):
    config = config_from_mapping({"levels": "auto"})
    assert config.levels_auto
    nodes = [make_node(f"n{i}", labels) for i in range(3)] + [make_node("bare", {})]
    index = index_of(config, nodes)
    assert index.config.levels == PRESETS[preset] and index.preset == preset and index.levels_warning is None


def test_levels_auto_is_the_default_and_explicit_levels_turn_it_off():
    assert Config().levels_auto and load_config(None).levels_auto
    assert not config_from_mapping({"levels": "gke"}).levels_auto
    assert not config_from_mapping({"levels": ["example.com/rack"]}).levels_auto
    index = index_of(config_from_mapping({"levels": "default"}),
                                      [make_node("g", {"cloud.google.com/gce-topology-block": "b1"})])
    assert index.preset is None and index.config.levels == PRESETS["default"]


def test_levels_auto_on_an_unlabelled_cluster_warns_and_keeps_the_default():
    index = index_of(Config(), [make_node("a", {}), make_node("b", {})])
    assert index.config.levels == PRESETS["default"]
    assert "levels: auto found none of" in index.levels_warning and "on 2 node(s)" in index.levels_warning


def test_gke_nodes_with_no_configuration_keep_a_four_node_job_in_one_sub_block():
    from tests.fixtures.builders import gpu_job
    from webhook import admission
    nodes = [make_node(f"h{block}{sub}{i}", {"cloud.google.com/gce-topology-block": f"b{block}",
                                             "cloud.google.com/gce-topology-subblock": f"b{block}-sb{sub}",
                                             "cloud.google.com/gce-topology-host": f"h{block}{sub}{i}"})
             for block in range(2) for sub in range(2) for i in range(4)]
    index = index_of(Config(), nodes)
    job = gpu_job("train", 4, 8, placement_strategy="consolidated")
    result = admission.review(admission.make_review(job), index, Config())
    assert result.outcome == "placed"
    assert {result.decision.scope.path[-1][0]} == {"cloud.google.com/gce-topology-subblock"}
    pinned = {e["key"]: e for term in result.admitted["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
              ["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"] for e in term["matchExpressions"]}
    assert len(pinned["cloud.google.com/gce-topology-subblock"]["values"]) == 1


def test_levels_auto_moves_to_the_preset_most_nodes_call_for_as_nodes_join_and_leave():
    index = index_of(Config(), [make_node("leafy", {"topology.scheduler/leaf": "l1"}),
                                                 make_node("busy-one", {"topology.scheduler/leaf": "l1"})])
    feed.upsert(index, make_pod("busy", "busy-one", 8), "Pod")
    assert index.preset == "default"
    aws = {"topology.k8s.aws/network-node-layer-1": "nn-1", "topology.k8s.aws/network-node-layer-2": "nn-2",
           "topology.k8s.aws/network-node-layer-3": "nn-3"}
    for i in range(3):
        feed.upsert(index, make_node(f"aws-{i}", aws), "Node")
    assert index.preset == "aws" and index.config.levels == PRESETS["aws"]
    assert index.nodes["busy-one"].free == 0  # pods counted across the rebuild
    assert index.root.free_gpus == 4 * 8 and set(index.nodes) == {"leafy", "busy-one", "aws-0", "aws-1", "aws-2"}
    for i in range(3):
        index.apply(NodeGone(f"aws-{i}"))
    assert index.preset == "default" and index.root.free_gpus == 8


MARK_LABELS = {"nvl72": {"nvidia.com/gpu.clique": "c1"}, "gke": {"cloud.google.com/gce-topology-block": "b1"},
               "aws": {"topology.k8s.aws/network-node-layer-1": "nn-1"}, "leaf": {"topology.scheduler/leaf": "l1"},
               "none": {}}


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.sets(st.sampled_from(sorted(MARK_LABELS)), max_size=3)),
                min_size=1, max_size=25))
def test_levels_auto_kept_node_by_node_is_what_the_nodes_call_for_read_at_once(changes):
    # node i gets the labels of its marks; an empty set deletes it
    index = index_of(Config(), [])
    labels: dict[str, dict] = {}
    for number, marks in changes:
        name = f"n{number}"
        if marks:
            labels[name] = {k: v for mark in sorted(marks) for k, v in MARK_LABELS[mark].items()}
            feed.upsert(index, make_node(name, labels[name]), "Node")
        elif name in labels:
            del labels[name]
            index.apply(NodeGone(name))
        if labels:
            preset, warning = detect_preset(labels.values())
            assert (index.preset, index.levels_warning) == (preset, warning)
            assert index.config.levels == PRESETS[preset]


def test_mutate_with_levels_auto_places_by_the_detected_levels(tmp_path, capsys):
    from tests.fixtures.builders import gpu_job
    from webhook.kube.demo import make_node
    nodes = [make_node(f"h{i}", {"cloud.google.com/gce-topology-block": "b1",
                                 "cloud.google.com/gce-topology-subblock": f"sb{i // 2}",
                                 "cloud.google.com/gce-topology-host": f"h{i}"}) for i in range(4)]
    (tmp_path / "nodes.yaml").write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": nodes}))
    (tmp_path / "config.yaml").write_text("levels: auto\n")
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(gpu_job("train", 2, 8, placement_strategy="consolidated")))
    assert main(["mutate", "--config", str(tmp_path / "config.yaml"), "--nodes", str(tmp_path / "nodes.yaml"),
                 "-f", str(tmp_path / "job.yaml")]) == 0
    assert "cloud.google.com/gce-topology-subblock" in capsys.readouterr().out  # pinned to one sub-block


def test_the_live_view_chooses_the_levels_from_the_nodes_it_watches(fake, make_view, caplog):
    fake.put_node(make_node("aws-1", {"topology.k8s.aws/network-node-layer-1": "nn-1"}))
    view = make_view(fake)
    with caplog.at_level("INFO", logger="webhook.kube.clusterview"):
        view.start()
        assert view.wait_synced(10)
    assert view.index.preset == "aws" and view.index.config.levels == PRESETS["aws"]
    assert any("levels: auto chose the aws preset" in r.getMessage() for r in caplog.records)


# ----- hardening: every key read, safe patterns, plain environment values, YAML 1.2 booleans -----

HARDENED = [
    ("levels_auto: 42\n", "unknown setting(s) levels_auto (levels_auto follows from levels: auto); allowed: "),
    ("levels_auto: false\n", "unknown setting(s) levels_auto"),
    ("profiles: [{name: x, match: '(a+)+$', nvlink_gbs: 1, pcie_gbs: 1, nic_gbs: 1, nics_per_node: 1}]\n",
     "profiles[0].match: '(a+)+$' is not allowed (a repeat inside a repeat: searching it could take exponential "
     "time); allowed: a regular expression of at most 256 characters with no backreference"),
    ("profiles: [{name: x, match: 'H100', nvlink_gbs: 1, pcie_gbs: 1, nic_gbs: 1, nics_per_node: 1},\n"
     "           {name: y, match: '(ab|a)*c', nvlink_gbs: 1, pcie_gbs: 1, nic_gbs: 1, nics_per_node: 1}]\n",
     "profiles[1].match: '(ab|a)*c' is not allowed (an alternation inside a repeat"),
    ('nccl_profiles: {leaf: {NCCL_CROSS_NIC: "1\\nLD_PRELOAD=/x.so"}}\n',
     "nccl_profiles.leaf.NCCL_CROSS_NIC: '1\\nLD_PRELOAD=/x.so' is not allowed; allowed: a string or number without "
     "control characters"),
    ("pin_when_waiting: yes\n", "pin_when_waiting: 'yes' is not allowed; allowed: true, false (YAML 1.1's "
     "yes/no/on/off are not booleans here)"),
    ("refuse_unplaceable: Off\n", "refuse_unplaceable: 'Off' is not allowed; allowed: true, false (YAML 1.1's"),
    ("gate_waits: NO\n", "gate_waits: 'NO' is not allowed; allowed: true, false (YAML 1.1's"),
    ("pin_only_where_locality_pays: n\n", "pin_only_where_locality_pays: 'n' is not allowed; allowed: true, false "
     "(YAML 1.1's"),
]


@pytest.mark.parametrize("text, fragment", HARDENED)
@pytest.mark.parametrize("command", ["serve", "mutate"])
def test_settings_the_file_never_meant_are_refused_with_one_line_naming_the_key(
        tmp_path, capsys, monkeypatch, command, text, fragment):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    (tmp_path / "config.yaml").write_text(text)
    (tmp_path / "job.yaml").write_text("{}")
    # serve: a --bind it refuses right after the settings, so settings that pass never start a server
    argv = {"serve": ["serve", "--bind", "no-port"],
            "mutate": ["mutate", "-f", "job.yaml", "--nodes", str(FIXTURES / "demo-nodes.yaml")]}[command]
    code = main([*argv, "--config", "config.yaml"])
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.splitlines()) == 1, err
    message = json.loads(err)["message"] if command == "serve" else err  # serve logs JSON lines
    assert fragment in message, err


@pytest.mark.parametrize("pattern, problem", [
    ("(a+)+$", "a repeat inside a repeat"),
    ("(a*)*b", "a repeat inside a repeat"),
    ("(a?){30}a{30}", "a repeat inside a repeat"),
    ("(x+x+)+y", "a repeat inside a repeat"),
    ("(?:H100.*)+", "a repeat inside a repeat"),
    ("(a|aa)+$", "an alternation inside a repeat"),
    (r"(H100)\1", "a backreference"),
    (r"(?P<g>H)(?P=g)", "a backreference"),
    ("(a)?(?(1)b|c)", "a backreference"),
    ("a?" * 5 + "b", "5 repeats of variable length"),
    ("H" * 257, "257 characters"),
])
def test_profile_patterns_that_can_backtrack_without_end_are_refused_and_the_defaults_pass(pattern, problem):
    profile = {"name": "x", "nvlink_gbs": 1, "pcie_gbs": 1, "nic_gbs": 1, "nics_per_node": 1}
    with pytest.raises(ConfigError) as refused:
        config_from_mapping({"profiles": [{**profile, "match": "H100"}, {**profile, "match": pattern}]})
    message = str(refused.value)
    assert message.startswith("profiles[1].match: ") and f"is not allowed ({problem}:" in message, message
    assert "; allowed: a regular expression of at most 256 characters" in message
    # what a profile may well say passes: the built-in ones, alternatives as a class, fixed repeats
    defaults = [dataclasses.asdict(p) for p in DEFAULT_PROFILES]
    assert config_from_mapping({"profiles": defaults}).profiles[:-1] == DEFAULT_PROFILES
    for fine in (r"^NVIDIA-(H100|H200)(-SXM\d)?-\d+GB", "(a|b)+", "(ab{2})+c", "GB[23]00|B[23]00", ""):
        config_from_mapping({"profiles": [{**profile, "match": fine}]})


def test_a_product_name_is_searched_as_far_as_a_label_value_goes():
    assert Config().profile_for("-" * 63 + "H100").name == "generic-pcie"  # past 63 characters: never a label value
    assert Config().profile_for("-" * 59 + "H100").name == "h100-sxm"


@pytest.mark.parametrize("value", ["a\nb", "tab\there", "\x00", "del\x7f", "cr\r"])
def test_nccl_values_with_control_characters_are_refused_naming_the_variable(value):
    with pytest.raises(ConfigError, match=r"^nccl_profiles\.spine\.NCCL_SOCKET_IFNAME: .* is not allowed; allowed: "
                                          r"a string or number without control characters"):
        config_from_mapping({"nccl_profiles": {"spine": {"NCCL_SOCKET_IFNAME": value}}})


def test_settings_yaml_has_only_true_and_false_as_booleans_and_every_reader_uses_it(tmp_path, caplog):
    from webhook.cli import reread
    from webhook.settings.loading import read_settings
    assert read_settings("a: yes\nb: On\nc: off\nd: Y\ne: true\nf: FALSE\ng: True\n") == {
        "a": "yes", "b": "On", "c": "off", "d": "Y", "e": True, "f": False, "g": True}
    path = tmp_path / "c.yaml"
    path.write_text("pin_when_waiting: false\n")
    previous = load_config(str(path))
    path.write_text("pin_when_waiting: on\n")  # a SIGHUP after this edit keeps the settings in use
    with caplog.at_level("ERROR", logger="webhook.cli"):
        assert reread(str(path), previous) is previous
    assert "pin_when_waiting: 'on' is not allowed; allowed: true, false (YAML 1.1's" in caplog.text
    path.write_text("pin_when_waiting: TRUE\n")
    assert reread(str(path), previous).pin_when_waiting is True
