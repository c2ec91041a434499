"""API keys of the management API: a file of named keys, each with a role, storing only a hash.

A key is ``fmq_<name>_<43 random url-safe characters>``: 256 random bits, so a plain SHA-256 of it is as
safe to keep as a slow password hash (nobody guesses a 256-bit secret) and lets a request's key be found
in one dictionary lookup. The name in the key is only a hint for people reading logs; the hash decides.
The file is YAML, written by ``fleetmq-broker apikey FILE NAME --role admin|viewer`` or by the operator
(it imports this module), and read again when it changes (a rotated Secret needs no restart)::

    keys:
      - {name: ops, role: admin, hash: "sha256:<hex>", created: "2026-11-28T10:00:00Z"}
      - {name: grafana, role: viewer, hash: "sha256:<hex>", zone: devices}

A key bound to a zone publishes only as that zone's ACL allows.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

Role = Literal["admin", "viewer"]
PREFIX = "fmq_"
NAME = r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?"  # a Kubernetes-style name: it goes inside the key
_HASH = re.compile(r"sha256:[0-9a-f]{64}")


class ApiKeysError(Exception):
    """A keys file that cannot be used; the message names the file and what is wrong."""


class ApiKey(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=f"^{NAME}$", description="Who the key is for (in logs and the console).")
    role: Role = Field(description="admin: every route; viewer: GET only.")
    hash: str = Field(pattern=_HASH.pattern, description="sha256:<hex> of the whole key.")
    zone: str | None = Field(None, description="Publishing checks this zone's ACL (none: no check).")
    created: str = Field("", description="When the key was made (RFC 3339), for people.")


class KeysFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    keys: list[ApiKey] = Field(default_factory=list)


def digest(key: str) -> str:
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


def new_key(name: str, role: Role, zone: str | None = None) -> tuple[str, ApiKey]:
    """A fresh key and its record (the only time the key itself exists outside the client)."""
    key = f"{PREFIX}{name}_{secrets.token_urlsafe(32)}"
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return key, ApiKey(name=name, role=role, hash=digest(key), zone=zone, created=created)


def parse(text: str, source: str = "<keys>") -> list[ApiKey]:
    try:
        doc = yaml.safe_load(text) or {}
        keys = KeysFile.model_validate(doc).keys
    except yaml.YAMLError as e:
        raise ApiKeysError(f"{source}: not YAML: {e}") from e
    except ValidationError as e:
        where = "; ".join(f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors())
        raise ApiKeysError(f"{source}: {where}") from e
    names = [k.name for k in keys]
    if len(set(names)) != len(names):
        raise ApiKeysError(
            f"{source}: a key name appears twice: {sorted({n for n in names if names.count(n) > 1})}"
        )
    return keys


def dump(keys: Iterable[ApiKey]) -> str:
    doc = {"keys": [k.model_dump(exclude_none=True, exclude_defaults=False) for k in keys]}
    return yaml.safe_dump(doc, sort_keys=False)


def add(path: str | Path, name: str, role: Role, zone: str | None = None) -> str:
    """Add (or replace) the key `name` in the file, created if missing; returns the new key."""
    path = Path(path)
    try:
        keys = parse(path.read_text(), str(path)) if path.exists() else []
    except OSError as e:
        raise ApiKeysError(f"cannot read {path}: {e.strerror}") from e
    key, record = new_key(name, role, zone)
    keys = [k for k in keys if k.name != name] + [record]
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(dump(keys))
    os.chmod(tmp, 0o600)
    tmp.replace(path)
    return key


class ApiKeys:
    """The keys of a file, looked up by a request's key; read again when the file changes."""

    def __init__(self, path: str | Path | None) -> None:
        self.path = Path(path) if path is not None else None
        self._by_hash: dict[str, ApiKey] = {}
        self._stamp: tuple[int, int, int] | None = None
        self.error: str | None = None  # why the file last failed to load (the keys before it stay)
        self.reload()

    def reload(self) -> bool:
        """Read the file if it changed; whether it did. A bad file keeps the keys read before."""
        if self.path is None:
            return False
        try:
            st = self.path.stat()
            stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
            if stamp == self._stamp:
                return False
            keys = parse(self.path.read_text(), str(self.path))
        except OSError as e:
            self.error = f"cannot read {self.path}: {e.strerror}"
            return False
        except ApiKeysError as e:
            self.error = str(e)
            return False
        self._by_hash = {k.hash: k for k in keys}
        self._stamp, self.error = stamp, None
        return True

    def __len__(self) -> int:
        return len(self._by_hash)

    def check(self, key: str) -> ApiKey | None:
        """The key's record, or None for a key this file does not hold."""
        if not key.startswith(PREFIX):
            return None
        return self._by_hash.get(digest(key))
