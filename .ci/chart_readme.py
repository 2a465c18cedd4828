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
    A key's description is its own comment: the comment lines right above it at its indentation
    (a blank line ends a comment that belongs to no key; one indented otherwise belongs to the
    block above), plus its inline comment. Every key must have one: a SystemExit names those
    that do not."""
    out, comment, parents = [], [], []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            comment.append((len(line) - len(line.lstrip()), stripped.lstrip("#").strip()))
            continue
        match = KEY.match(line)
        if not match:
            if not stripped:
                comment = []
            continue
        indent = len(match["indent"])
        depth = indent // 2
        parents = parents[:depth] + [match["key"]]
        own = []
        for at, words in reversed(comment):  # the run just above the key, at its indentation
            if at != indent:
                break
            own.insert(0, words)
        inline = match["rest"].split(" #", 1)[1].strip() if " #" in match["rest"] else ""
        if depth <= 1:
            default = values
            for part in parents:
                default = default[part]
            shown = "" if isinstance(default, dict) and default and depth == 0 else json.dumps(default)
            out.append((".".join(parents), shown, " ".join([*own, inline]).strip()))
        comment = []
    undescribed = [key for key, _, description in out if not description]
    if undescribed:
        raise SystemExit(f"values.yaml: say what {', '.join(undescribed)} is for, in a comment right above it")
    return out


def render() -> str:
    text = (CHART / "values.yaml").read_text()
    table = "".join(f"| `{key}` | {f'`{default}`' if default else ''} | {description.replace('|', '/')} |\n"
                    for key, default, description in rows(text, yaml.safe_load(text)))
    return HEADER + table


if __name__ == "__main__":
    (CHART / "README.md").write_text(render())
    sys.exit(0)
