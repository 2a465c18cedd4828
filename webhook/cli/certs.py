"""`topology-webhook certs`: a CA and a serving certificate for the webhook Service, written to a
directory, and the caBundle printed."""
from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from ..credentials.certs import CA_FILE, ca_bundle, write_certs
from .program import DNS_LABEL, PROG, UsageError


def register(subparsers: Any) -> None:
    certs_cmd = subparsers.add_parser(
        "certs", help="create a CA and a serving certificate for the webhook Service",
        description="Write ca.crt, tls.crt and tls.key to DIR for Service NAME in namespace NS and print the "
                    "base64 caBundle for the webhook configuration. The certificate's SANs cover NAME, NAME.NS, "
                    "NAME.NS.svc, NAME.NS.svc.cluster.local, localhost and 127.0.0.1. An existing DIR/ca.crt is "
                    "kept (exit 2) unless --force: a new CA breaks every caBundle made from the old one.")
    certs_cmd.add_argument("--service", metavar="NAME", required=True,
                           help="the webhook's Service, a DNS label")
    certs_cmd.add_argument("--namespace", metavar="NS", required=True, help="the Service's namespace")
    certs_cmd.add_argument("--out", metavar="DIR", required=True, help="where the three files go (made if missing)")
    certs_cmd.add_argument("--force", action="store_true", help="replace a CA already in DIR")
    certs_cmd.set_defaults(func=cmd_certs)


def cmd_certs(args: argparse.Namespace) -> int:
    for flag, value in (("--service", args.service), ("--namespace", args.namespace)):
        if not DNS_LABEL.fullmatch(value):
            raise UsageError(f"{flag} {value!r} is not a DNS label (lowercase letters, digits and '-', "
                             f"at most 63 characters)")
    existing = os.path.join(args.out, CA_FILE)
    if os.path.exists(existing) and not args.force:
        raise UsageError(f"{existing} exists: a new CA would break every caBundle made from it; "
                         "give --force to replace it")
    paths = write_certs(args.out, args.service, args.namespace)
    print(f"{PROG}: wrote {paths.ca}, {paths.cert}, {paths.key}; caBundle follows", file=sys.stderr)
    print(ca_bundle(paths.ca))
    return 0
