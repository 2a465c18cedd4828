"""The chart's alert rules (charts/topology-webhook/files/alerts.yaml) checked and unit-tested by
Prometheus's own promtool (Debian's `prometheus` package; .ci/run installs it where it can)."""
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "charts" / "topology-webhook" / "files" / "alerts.yaml"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed (apt-get install prometheus)")


@needs_promtool
def test_promtool_accepts_the_alert_rules():
    done = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 5 rules found" in done.stdout


@needs_promtool
def test_the_alerts_fire_as_their_unit_tests_say():
    done = subprocess.run([PROMTOOL, "test", "rules", "alerts_test.yaml"], cwd=ROOT / "tests" / "fixtures",
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
