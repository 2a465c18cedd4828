import pytest

from webhook.core import gpus


@pytest.mark.parametrize("text, domains", [
    ("0-3,4-7", ((0, 1, 2, 3), (4, 5, 6, 7))),
    ("0-7", ((0, 1, 2, 3, 4, 5, 6, 7),)),
    ("0+2,1+3", ((0, 2), (1, 3))),
    ("4-7, 0-3", ((0, 1, 2, 3), (4, 5, 6, 7))),
    ("", ()),
], ids=["two islands", "one NVSwitch domain", "bridged pairs", "unordered with spaces", "empty means no NVLink"])
def test_nvlink_domains_parse(text, domains):
    assert gpus.parse_nvlink_domains(text) == domains


@pytest.mark.parametrize("text", ["0-3,3-7", "a-b", "3-1", "0--1", "\u0660-\u0667", "\uff10-\uff17"])
def test_nvlink_domains_reject(text):
    with pytest.raises(ValueError):
        gpus.parse_nvlink_domains(text)


@pytest.mark.parametrize("domains", [((0, 1, 2, 3), (4, 5, 6, 7)), ((0, 2), (1, 3)), ((0, 1, 5, 6, 7),)])
def test_nvlink_domains_round_trip(domains):
    assert gpus.parse_nvlink_domains(gpus.format_nvlink_domains(domains)) == domains


@pytest.mark.parametrize("amount", ["\u0668", "\uff18", "\u00b2"])
def test_a_gpu_quantity_in_digits_other_than_0_to_9_is_not_a_number(amount):
    with pytest.raises(ValueError, match="is not a whole number"):
        gpus.quantity_to_int(amount)


def test_pod_gpus_counts_sidecars_and_init_peak():
    spec = {
        "containers": [{"name": "a", "resources": {"limits": {"nvidia.com/gpu": "2"}}},
                       {"name": "b", "resources": {"requests": {"nvidia.com/gpu": 1}}}],
        "initContainers": [{"name": "warm", "resources": {"limits": {"nvidia.com/gpu": "4"}}},
                           {"name": "side", "restartPolicy": "Always",
                            "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
    }
    assert gpus.pod_gpus(spec) == 4
    spec["initContainers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "3"
    assert gpus.pod_gpus(spec) == 4  # 2 + 1 + sidecar 1 beats the init peak of 3


@pytest.mark.parametrize("text, gbps", [("400Gb", 400), ("100Gbps", 100), ("1.6Tb", 1600), ("50GB", 400),
                                        ("200G", 200), ("25Gb/s", 25)])
def test_bandwidth(text, gbps):
    assert gpus.parse_bandwidth_gbps(text) == pytest.approx(gbps)


@pytest.mark.parametrize("text", ["fast", "", "400", "-1Gb", "\uff14\uff10\uff10Gb"])
def test_bandwidth_rejects(text):
    with pytest.raises(ValueError):
        gpus.parse_bandwidth_gbps(text)


@pytest.mark.parametrize("text", ["50GB", "50GBps", "1.6TB/s", "400MB"])
def test_bandwidth_in_bytes_is_refused_where_only_bits_are_taken(text):
    # The annotation takes bits only (links are rated in bits); a node label in bytes still reads, x8.
    with pytest.raises(gpus.BandwidthInBytes):
        gpus.parse_bandwidth_gbps(text, bits_only=True)
    assert gpus.parse_bandwidth_gbps(text) > 0
    assert gpus.parse_bandwidth_gbps(text.replace("B", "b"), bits_only=True) * 8 == pytest.approx(
        gpus.parse_bandwidth_gbps(text))
