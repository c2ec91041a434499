"""Every alert links a runbook that exists in the repository (docs/runbooks/<alert>.md) and says what the
alert means, how to check it and what to do; the metrics a runbook queries are ones fleetmq exports."""

from __future__ import annotations

import re

import pytest
from fleetmq.operator import metrics as operator_metrics
from fleetmq.operator import monitoring

from .metrics_support import broker_names, exported

RULES = [r for g in monitoring.alert_groups()["groups"] for r in g["rules"]]
NAMES = [r["alert"] for r in RULES]


@pytest.mark.parametrize("rule", RULES, ids=NAMES)
def test_every_alert_links_its_runbook_and_the_file_exists(rule: dict):
    url = rule["annotations"].get("runbook_url")
    assert url == f"{monitoring.RUNBOOK_BASE_URL}/{rule['alert']}.md", url
    path = monitoring.RUNBOOK_DIR / f"{rule['alert']}.md"
    assert path.is_file(), f"{rule['alert']}: no runbook at {path}"
    text = path.read_text()
    assert text.startswith(f"# {rule['alert']}\n"), path
    for section in ("**Means**", "**Check**", "**Act**"):
        assert section in text, f"{path.name} has no {section} section"
    assert "`kubectl " in text or "fleetmq_" in text or "up{" in text, (
        f"{path.name}: no command to check with"
    )


def test_every_runbook_belongs_to_an_alert():
    files = {p.stem for p in monitoring.RUNBOOK_DIR.glob("*.md")} - {"README"}
    assert files == set(NAMES)


def test_runbooks_query_only_exported_metrics():
    """A renamed metric fails here too, naming the runbook that still tells people to query it."""
    broker, operator = broker_names(), exported(operator_metrics.REGISTRY)
    for path in sorted(monitoring.RUNBOOK_DIR.glob("*.md")):
        for name in set(re.findall(r"\bfleetmq_\w+", path.read_text())):
            known = operator if name.startswith("fleetmq_operator_") else broker
            assert name in known, f"{path.name}: {name} is not exported"


def test_runbook_base_url_is_replaced_whole():
    assert monitoring.runbook_url(
        "FleetmqBrokerDown", "https://git.example/fleetmq/-/blob/main/docs/runbooks/"
    ) == ("https://git.example/fleetmq/-/blob/main/docs/runbooks/FleetmqBrokerDown.md")


def test_the_readme_names_every_alert():
    readme = (monitoring.RUNBOOK_DIR.parent.parent / "README.md").read_text()
    assert [name for name in NAMES if f"`{name}`" not in readme] == []
