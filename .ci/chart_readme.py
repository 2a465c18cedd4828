"""Writes charts/topology-webhook/README.md: the chart's values table from values.yaml's own
comments, so the two cannot drift apart (tests/artifacts/test_chart.py checks the file is current).

    python .ci/chart_readme.py            # rewrite the README
"""
from __future__ import annotations

import json
import pathlib
import re
import sys

import yaml

CHART = pathlib.Path(__file__).resolve().parents[1] / "charts" / "topology-webhook"
KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z][A-Za-z0-9_]*):(?P<rest>.*)$")
HEADER = """# topology-webhook chart

Places GPU workloads by network and NVLink topology: a mutating admission webhook, its RBAC,
certificates, and optionally the node discovery DaemonSet, metrics scraping, alerts and a
dashboard. How to install and check it: [docs/operations/install.md](../../docs/operations/install.md).

## Values

Generated from `values.yaml` by `python .ci/chart_readme.py`; `values.schema.json` checks every
key at install time.

| key | default | description |
|---|---|---|
"""


def rows(text: str, values: dict) -> list[tuple[str, str, str]]:
    """(dotted key, default, description) for every key down to the second level, in file order.
    A key's description is the comment block just above it plus its inline comment."""
    out, comment, parents = [], [], []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            comment.append(stripped.lstrip("#").strip())
            continue
        match = KEY.match(line)
        if not match:
            if not stripped:
                comment = []
            continue
        depth = len(match["indent"]) // 2
        parents = parents[:depth] + [match["key"]]
        inline = match["rest"].split(" #", 1)[1].strip() if " #" in match["rest"] else ""
        if depth <= 1:
            default = values
            for part in parents:
                default = default[part]
            shown = "" if isinstance(default, dict) and default and depth == 0 else json.dumps(default)
            out.append((".".join(parents), shown, " ".join([*comment, inline]).strip()))
        comment = []
    return out


def render() -> str:
    text = (CHART / "values.yaml").read_text()
    table = "".join(f"| `{key}` | {f'`{default}`' if default else ''} | {description.replace('|', '/')} |\n"
                    for key, default, description in rows(text, yaml.safe_load(text)))
    return HEADER + table


if __name__ == "__main__":
    (CHART / "README.md").write_text(render())
    sys.exit(0)
