"""A client-go exec credential plugin for tests: the `users[].user.exec` entry of a kubeconfig.

    entry, runs = exec_user(tmp_path, token_file, valid_seconds=3600)
    {"exec": entry}                        # a kubeconfig user; the plugin prints the token in token_file
    exec_runs(runs)                        # how many times a client has run the plugin

The plugin is a Python script (this interpreter) that answers with an ExecCredential
(client.authentication.k8s.io/v1) whose expirationTimestamp is `valid_seconds` from now, and appends a line
to the `runs` file on every run, so a test sees whether a client fetched the credential again once it
expired. Clients refresh a few minutes ahead of the expiry (the `kubernetes` package: 5 minutes), so a
credential valid for less than that is refetched on use.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

PLUGIN = """\
import datetime, json, os, sys
info = json.loads(os.environ["KUBERNETES_EXEC_INFO"])  # what client-go hands a plugin
with open(os.environ["RUNS_FILE"], "a") as f:
    f.write(info["apiVersion"] + "\\n")
expiry = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=int(os.environ["VALID_SECONDS"]))
json.dump({
    "apiVersion": "client.authentication.k8s.io/v1",
    "kind": "ExecCredential",
    "status": {
        "token": open(os.environ["TOKEN_FILE"]).read().strip(),
        "expirationTimestamp": expiry.strftime("%Y-%m-%dT%H:%M:%SZ"),
    },
}, sys.stdout)
"""


def exec_user(directory: Path, token_file: Path, valid_seconds: int) -> tuple[dict[str, Any], Path]:
    """The kubeconfig `exec` entry of a plugin printing the token in `token_file`, and its runs file."""
    directory.mkdir(parents=True, exist_ok=True)
    script, runs = directory / "credential-plugin.py", directory / "credential-plugin.runs"
    script.write_text(PLUGIN)
    runs.write_text("")
    env = {"RUNS_FILE": str(runs), "TOKEN_FILE": str(token_file), "VALID_SECONDS": str(valid_seconds)}
    entry = {
        "apiVersion": "client.authentication.k8s.io/v1",
        "command": sys.executable,
        "args": [str(script)],
        "env": [{"name": k, "value": v} for k, v in env.items()],
        "interactiveMode": "Never",
    }
    return entry, runs


def exec_runs(runs: Path) -> int:
    return len(runs.read_text().splitlines())
