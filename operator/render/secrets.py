"""The Secrets the operator writes: the fleet's bridge and users Secrets (mounted by every pod whatever
the fleet holds, so adding a bridge or a user rolls no pod) and an MqttUser's generated password."""

from __future__ import annotations

import base64
from typing import Any

from ..crds import API_VERSION
from .common import API_ADMIN_KEY, API_KEYS_FILE, L_MANAGED, MANAGER, Fleet, names, object_meta

L_USER = "fleetmq.io/user"  # on an MqttUser's generated password Secret


def bridge_secret_files(name: str, password: str | None, tls: dict[str, str] | None) -> dict[str, str]:
    """A bridge's files in the fleet's bridge Secret (base64 data by file name): its password, and its TLS
    Secret's ca.crt and tls.crt with tls.key where that Secret has them."""
    files = {f"{name}.password": password} if password is not None else {}
    for keys in (("ca.crt",), ("tls.crt", "tls.key")):
        if tls and all(k in tls for k in keys):
            files |= {f"{name}.{k}": tls[k] for k in keys}
    return files


def bridge_secret(fleet: Fleet, files: dict[str, str]) -> dict[str, Any]:
    """The fleet's bridge Secret: copies of its bridges' Secrets' files, refreshed at each reconciliation."""
    meta = object_meta(fleet, names(fleet.name)["bridge_secrets"])
    return {"apiVersion": "v1", "kind": "Secret", "metadata": meta, "type": "Opaque", "data": dict(files)}


def api_keys_secret(fleet: Fleet, keys_file: str, admin_key: str) -> dict[str, Any]:
    """The generated keys of a fleet's API (spec.api without keysSecretRef): the keys file the pods mount
    (hashes) and the admin key itself, for the user to read. Created once, owned by the fleet, never
    rewritten: add keys to keys.yaml with `fleetmq-broker apikey` as to any keys file."""
    meta = object_meta(fleet, names(fleet.name)["api_keys"])
    data = {API_KEYS_FILE: keys_file, API_ADMIN_KEY: admin_key}
    return {"apiVersion": "v1", "kind": "Secret", "metadata": meta, "type": "Opaque",
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}}  # fmt: skip


def users_secret(fleet: Fleet, files: dict[str, bytes]) -> dict[str, Any]:
    """The fleet's users Secret: one users file per zone with MqttUsers (salted hashes, never passwords)."""
    meta = object_meta(fleet, names(fleet.name)["users"])
    data = {zone: base64.b64encode(content).decode() for zone, content in files.items()}
    return {"apiVersion": "v1", "kind": "Secret", "metadata": meta, "type": "Opaque", "data": data}


def user_password_secret(
    user: dict[str, Any], name: str, key: str, username: str, password: str
) -> dict[str, Any]:
    """An MqttUser's generated password: created once, owned by the user (deleted with it), never rewritten."""
    meta = user["metadata"]
    data = {key: password}
    if key != "username":
        data["username"] = username
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": name,
            "namespace": meta.get("namespace", "default"),
            "labels": {L_MANAGED: MANAGER, L_USER: meta["name"]},
            "ownerReferences": [
                {"apiVersion": API_VERSION, "kind": "MqttUser", "name": meta["name"], "uid": meta["uid"]}
            ],
        },
        "type": "Opaque",
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
    }


def user_file_entries(secret: dict[str, Any] | None) -> dict[str, list[str]]:
    """username -> the hashes the fleet's users Secret holds for it (to keep a hash while its password
    stays: a new salt each time would rewrite the Secret at every reconciliation)."""
    out: dict[str, list[str]] = {}
    for value in ((secret or {}).get("data") or {}).values():
        try:
            text = base64.b64decode(value).decode()
        except (ValueError, UnicodeDecodeError):
            continue
        for line in text.splitlines():
            user, sep, encoded = line.partition(":")
            if sep:
                out.setdefault(user, []).append(encoded)
    return out
