"""The key every replica seals gated waits with (`serve --gate-key-secret NS/NAME`).

Kept in one Secret of the webhook's namespace, which the first replica to start makes with a
random key and every other reads: tenants who may edit their own gated pods cannot read it, so
they cannot seal an edited record (webhook/core/injection.py: seal_gate). Not a chart object, so
renders stay identical and the key outlives upgrades; a new key would leave the pods gated under
the old one unreleased.
"""
from __future__ import annotations

import base64
import os
from typing import Any

from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException

from ..settings.config import ConfigError

KEY_BYTES = 32
_FIELD = "key"


def ensure_gate_key(api_client: k8s_client.ApiClient, namespace: str, name: str) -> bytes:
    """The key in Secret namespace/name, made first if it does not exist. Raises ConfigError (one
    line) when it can be neither read nor made, or holds no usable key."""
    core: Any = k8s_client.CoreV1Api(api_client)
    for _ in range(3):  # a replica that lost the race to make it reads the winner's
        try:
            secret = core.read_namespaced_secret(name, namespace)
            text = (secret.data or {}).get(_FIELD) or ""
            try:
                key = base64.b64decode(text, validate=True)
            except ValueError:  # binascii.Error: not base64 (a Secret edited by hand)
                key = b""
            if len(key) < KEY_BYTES:
                raise ConfigError(f"--gate-key-secret {namespace}/{name}: data.{_FIELD} holds {len(key)} bytes; "
                                  f"allowed: at least {KEY_BYTES} (delete the Secret to have a new key made)")
            return key
        except ApiException as err:
            if err.status != 404:
                raise ConfigError(f"--gate-key-secret {namespace}/{name}: reading it failed (HTTP {err.status} "
                                  f"{str(err.reason or '').strip()})") from None
        body = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                "metadata": {"name": name, "namespace": namespace,
                             "labels": {"app.kubernetes.io/managed-by": "topology-webhook"}},
                "data": {_FIELD: base64.b64encode(os.urandom(KEY_BYTES)).decode()}}
        try:
            core.create_namespaced_secret(namespace, body)
        except ApiException as err:
            if err.status != 409:
                raise ConfigError(f"--gate-key-secret {namespace}/{name}: making it failed (HTTP {err.status} "
                                  f"{str(err.reason or '').strip()})") from None
    raise ConfigError(f"--gate-key-secret {namespace}/{name}: neither read nor made after 3 tries")
