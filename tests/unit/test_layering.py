"""The broker's layering (docs/design.md "Core layering"): calls go one way, so imports do.

Each module of broker/ sits in one layer below; it may import only modules of lower layers (imports for
type checking count too: a lower module that needs a higher one declares a Protocol instead). A module
added to broker/ must be placed here, so the contract covers everything.
"""

from __future__ import annotations

import ast
from pathlib import Path

BROKER = Path(__file__).resolve().parents[2] / "broker"

# top to bottom
LAYERS: list[set[str]] = [
    {"__main__"},
    {"cli"},
    {"server", "workers"},
    {"connection", "http"},
    {"node"},  # the composition root: the one module that imports everything of the core
    {"bridge"},  # a bridge's link on the node that leads it (a channel of the node, a lease in the store)
    {"cm", "cluster"},  # they talk through Protocols (cm.Fleet, cluster.Sessions)
    {"redisstore"},
    {"bridgelink"},  # speaks MQTT to a channel and a remote (bytes in, bytes out)
    {"channel", "store"},
    {"session", "zone"},
    {"events"},  # the event log writes through the store's connections (redisclient)
    {"inflight", "mqueue", "journal", "retained", "wire", "telemetry", "negotiation", "redisclient"},
    {"message", "auth", "metrics", "router", "config"},
    {"bridges"},  # bridges' settings, built like zones' (zones.Duration, topic filters, templates)
    {"codec", "topic", "zones", "keepalive", "limiter", "eventschema", "keys", "websocket", "__init__"}
    | {"topicmap", "backoff", "bridgeloop", "rebalance", "clock"},
]
RANK = {module: len(LAYERS) - i for i, layer in enumerate(LAYERS) for module in layer}


def imports(path: Path) -> set[str]:
    """The broker modules a module imports (relative imports, TYPE_CHECKING ones included)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                out.add(node.module.split(".")[0])
            else:
                out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("fleetmq.broker."):
            out.add(node.module.split(".")[2])
    return out


def test_every_module_has_a_layer():
    modules = {p.stem for p in BROKER.glob("*.py")}
    assert modules == set(RANK), (
        f"place in LAYERS: {sorted(modules - set(RANK))}; gone: {sorted(set(RANK) - modules)}"
    )


def test_imports_go_down_only():
    wrong = []
    for path in sorted(BROKER.glob("*.py")):
        mine = RANK[path.stem]
        for dep in imports(path):
            if RANK.get(dep, len(LAYERS) + 1) >= mine:
                wrong.append(f"{path.stem} (layer {mine}) imports {dep} (layer {RANK.get(dep)})")
    assert not wrong, "\n".join(wrong)


def test_the_contract_can_fail(tmp_path):
    """The check itself sees an upward import (a lower module importing the node)."""
    bad = tmp_path / "session.py"
    bad.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .node import Node\n")
    assert "node" in imports(bad) and RANK["node"] > RANK["session"]
