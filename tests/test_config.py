import pytest

from webhook.config import PRESETS, Config, ConfigError, config_from_mapping, levels_from, load_config


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
