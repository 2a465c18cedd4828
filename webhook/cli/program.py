"""What every command shares: the program's name, the logger they write to, the error a bad flag
or input raises, and the DNS label check of flag values."""
from __future__ import annotations

import logging
import re

PROG = "topology-webhook"
# One logger for the whole command line, whichever command's module writes.
log = logging.getLogger("webhook.cli")
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


class UsageError(ValueError):
    """A bad flag value or input file: printed as one line, exit 2."""
