"""The docs site's reference pages (docs/reference/) are what the code says: the custom resources from
operator/crds.py, the broker config file from broker/config.py, the metrics from broker/metrics.py and
operator/metrics.py (scripts/docsgen.py; `make docs-reference` writes them)."""

from __future__ import annotations

from fleetmq.broker.config import BrokerConfig
from fleetmq.operator import crdgen

from scripts import docsgen


def test_committed_reference_pages_are_current():
    stale = docsgen.stale()
    assert stale == [], f"stale: {stale}; run `make docs-reference`"


def test_every_custom_resource_has_a_page_naming_every_spec_field():
    pages = docsgen.render()
    for file, page in docsgen.RESOURCES:
        crd = crdgen.crds()[file]
        spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
        for name in spec["properties"]:
            assert f"| `spec.{name}` |" in pages[page], f"{page}: spec.{name} missing"


def test_the_config_page_names_every_top_level_field_and_every_zone_setting():
    from fleetmq.broker.zones import ZoneSettings

    page = docsgen.render()["config.md"]
    for name in BrokerConfig.model_fields:
        assert f"| `{name}` |" in page, name
    for name in ZoneSettings.model_fields:
        assert f"| `zones.<name>.{name}` |" in page, name


def test_the_metrics_page_lists_labels_and_never_a_client_id():
    page = docsgen.render()["metrics.md"]
    assert "| `fleetmq_messages_dropped_total` | counter | `zone`, `reason` |" in page
    assert "| `fleetmq_operator_reconciles_total` | counter | `result` |" in page
    assert "client" not in {cell.strip("` ") for line in page.splitlines() for cell in line.split("|")[3:4]}


def test_the_node_id_default_does_not_depend_on_the_machine():
    """BrokerConfig's node_id defaults to the host name: the page must read the same on every machine."""
    assert "| `node_id` | string, length ≥ 1 | `(the host name)` |" in docsgen.render()["config.md"]


def test_stale_pages_are_found(tmp_path):
    for name, text in docsgen.render().items():
        (tmp_path / name).write_text(text)
    assert docsgen.stale(tmp_path) == []
    (tmp_path / "metrics.md").write_text("old\n")
    (tmp_path / "mqttuser.md").unlink()
    assert sorted(docsgen.stale(tmp_path)) == ["metrics.md", "mqttuser.md"]
    assert docsgen.main(["--check", str(tmp_path)]) == 1
