"""`topology-webhook` commands: serve, mutate, certs. The composition root: a command reads the
settings and builds the index, the API adapters over it and the feed that keeps it current
(live.py: the claims Lease, scale-ups, the releaser, kube.clusterview.ApiFeed), the app and the
server. Here the parser and the dispatch, one module per command beside it.

Exit codes: 0 success (every object admitted), 1 some object denied (mutate), 2 usage or input error,
141 stdout closed by its reader before all was written (`| head`: quietly, EXIT_STDOUT_CLOSED).
Each command's module, and those of other packages, adds its subcommand with one
`register(subparsers)` call in `build_parser`.
"""
from __future__ import annotations

import argparse
import os
import select
import sys
from typing import Sequence

from .. import __version__
from ..discover import command as discover_command
from ..kube import ungate
from ..objects.manifests import ManifestError
from ..serving import logs
from ..credentials.certs import CertError
from ..settings.config import ConfigError
from . import certs, mutate, serve
from .inputs import CLUSTER_FILE_MAX_BYTES, MANIFEST_FILE_MAX_BYTES, OBJECT_MAX_BYTES, file_index
from .program import PROG, UsageError, log
from .serve import reread, self_managed_tls

# What other code imports from `webhook.cli`: defined here or in the command modules.
__all__ = ["CLUSTER_FILE_MAX_BYTES", "EXIT_STDOUT_CLOSED", "MANIFEST_FILE_MAX_BYTES", "OBJECT_MAX_BYTES",
           "UsageError", "build_parser", "file_index", "main", "reread", "self_managed_tls"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="Place GPU workloads by network and NVLink topology.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve.register(subparsers)
    mutate.register(subparsers)
    certs.register(subparsers)
    discover_command.register(subparsers)
    ungate.register(subparsers)
    parser.add_argument("--log-level", choices=logs.LEVELS, default="info",
                        help="least severe level logged (default: %(default)s)")
    parser.add_argument("--log-format", choices=logs.FORMATS,
                        help="log lines as JSON objects or text (default: json for serve, text otherwise)")
    for command in subparsers.choices.values():  # also after the command; there they override
        command.add_argument("--log-level", choices=logs.LEVELS, default=argparse.SUPPRESS,
                             help="least severe level logged (default: info)")
        command.add_argument("--log-format", choices=logs.FORMATS, default=argparse.SUPPRESS,
                             help="log lines as JSON objects or text (default: json for serve, text otherwise)")
    return parser


# The exit status when whoever reads stdout closed it early (`mutate ... | head`): 128 + SIGPIPE (13),
# what a shell reports for a command SIGPIPE ended, as it ends `cat` or `yes`. Never 1: for mutate
# that means "denied".
EXIT_STDOUT_CLOSED = 141


def main(argv: Sequence[str] | None = None) -> int:
    try:
        code = _run(argv)
        sys.stdout.flush()  # so a reader gone shows here, not as an error in the interpreter's exit
        return code
    except BrokenPipeError:
        if not _stdout_closed():
            raise  # a pipe or socket of something else: a bug to see, not a reader that had enough
        # Python's recipe (the signal module's "Note on SIGPIPE"): whatever is still buffered for
        # stdout goes to /dev/null, so the flush at exit does not fail again; no traceback.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_STDOUT_CLOSED


def _stdout_closed() -> bool:
    """Whether stdout is a pipe whose reader has gone (poll reports an error on its write end)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
    except (OSError, ValueError, AttributeError):  # no file descriptor (replaced in tests), no poll
        return False


def _run(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    log_format = args.log_format or ("json" if args.func is serve.cmd_serve else "text")
    logs.configure(log_format, args.log_level)
    try:
        return args.func(args)
    except (UsageError, ConfigError, ManifestError, CertError) as err:
        if log_format == "json":
            log.error("%s: error: %s", PROG, err)
        else:
            print(f"{PROG}: error: {err}", file=sys.stderr)
        return 2
