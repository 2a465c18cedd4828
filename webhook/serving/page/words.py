"""What the page says of a domain in words, and how any name gets onto it: escaped."""
from __future__ import annotations

from html import escape


def e(value: object) -> str:
    """Text as HTML, quotes included: a pod named `<script>` shows as text, in an attribute too."""
    return escape(str(value), quote=True)


def fits(block: dict) -> str:
    fitting = ", ".join(f"{count}\u00d7{size}" for size, count in block["pods_fitting"].items() if count)
    return fitting or "nothing"


def room(block: dict) -> str:
    """The largest job that fits now: whole-node pods (what multi-node training asks for), else
    the largest single pod."""
    width = max(map(int, block["pods_fitting"]))
    whole = block["pods_fitting"][str(width)]
    if whole:
        return f"room for {whole}\u00d7{width}-GPU pods"
    return f'room for 1\u00d7{block["largest_pod_gpus"]}-GPU pod' if block["largest_pod_gpus"] else "no room"


def gpu_sums(gpus: dict) -> str:
    """'2 used, 6 free of 8 GPUs': the parts that are not zero."""
    parts = ", ".join(f"{gpus[part]} {word}" for part, word in (("used", "used"), ("held", "held"), ("free", "free"),
                                                                 ("out", "out of service")) if gpus[part])
    return f'{parts or "none"} of {gpus["total"]} GPUs'
