"""API keys of the management API: only hashes stored, found by the key, bad files said precisely."""

from __future__ import annotations

import pytest
from fleetmq.broker import apikeys
from fleetmq.broker.apikeys import ApiKeys, ApiKeysError


def test_a_key_is_found_by_itself_and_the_file_holds_only_its_hash(tmp_path):
    path = tmp_path / "keys.yaml"
    admin = apikeys.add(path, "ops", "admin")
    viewer = apikeys.add(path, "grafana", "viewer", zone="devices")
    text = path.read_text()
    assert admin not in text and viewer not in text and apikeys.digest(admin) in text
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    keys = ApiKeys(path)
    assert (keys.check(admin).name, keys.check(admin).role) == ("ops", "admin")
    assert (keys.check(viewer).role, keys.check(viewer).zone) == ("viewer", "devices")
    for wrong in ("", admin[:-1], admin + "x", "fmq_ops_" + "A" * 43, viewer.replace("fmq_", "xyz_")):
        assert keys.check(wrong) is None


def test_replacing_a_key_revokes_the_old_one_once_the_file_is_read_again(tmp_path):
    path = tmp_path / "keys.yaml"
    old = apikeys.add(path, "ops", "admin")
    keys = ApiKeys(path)
    new = apikeys.add(path, "ops", "viewer")
    assert keys.reload() is True
    assert keys.check(old) is None and keys.check(new).role == "viewer" and len(keys) == 1
    assert keys.reload() is False  # unchanged


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("keys: [{name: ops, role: root, hash: 'sha256:" + "0" * 64 + "'}]", "keys.0.role"),
        ("keys: [{name: ops, role: admin, hash: 'md5:abc'}]", "keys.0.hash"),
        ("keys: [{name: Ops!, role: admin, hash: 'sha256:" + "0" * 64 + "'}]", "keys.0.name"),
        ("keys: [{name: ops, role: admin, hash: 'sha256:" + "0" * 64 + "', colour: red}]", "keys.0.colour"),
        (
            "keys: [{name: ops, role: admin, hash: 'sha256:" + "0" * 64 + "'}, "
            "{name: ops, role: viewer, hash: 'sha256:" + "1" * 64 + "'}]",
            "appears twice",
        ),
        ("keys: [", "not YAML"),
    ],
)
def test_a_bad_file_is_said_precisely_and_keeps_the_keys_read_before(tmp_path, text, said):
    path = tmp_path / "keys.yaml"
    good = apikeys.add(path, "ops", "admin")
    keys = ApiKeys(path)
    with pytest.raises(ApiKeysError, match=said.replace(".", r"\.")):
        apikeys.parse(text, "f")
    path.write_text(text)
    keys.reload()
    assert keys.error is not None and said in keys.error and str(path) in keys.error
    assert keys.check(good) is not None
