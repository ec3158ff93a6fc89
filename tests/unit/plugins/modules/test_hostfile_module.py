import json

import pytest
from ansible.module_utils.testing import patch_module_args

from ansible_collections.multinode.deepspeed.plugins.modules import hostfile


def run_module(capsys, args):
    with patch_module_args(args):
        with pytest.raises(SystemExit):
            hostfile.main()
    return json.loads(capsys.readouterr().out)


def test_writes_hostfile_and_is_idempotent(tmp_path, capsys):
    path = tmp_path / "hostfile"
    args = {"path": str(path), "hosts": ["worker1", "worker2"], "slots": {"worker1": 2}, "default_slots": 1}
    res = run_module(capsys, args)
    assert res["changed"] is True
    assert path.read_text() == "worker1 slots=2\nworker2 slots=1\n"
    assert res["world_size"] == 3 and res["master"] == "worker1"
    assert oct(path.stat().st_mode & 0o777) == "0o644"
    again = run_module(capsys, args)
    assert again["changed"] is False


def test_check_mode_writes_nothing(tmp_path, capsys):
    path = tmp_path / "hostfile"
    res = run_module(capsys, {"path": str(path), "hosts": ["w1"], "default_slots": 1, "_ansible_check_mode": True})
    assert res["changed"] is True and not path.exists()


def test_missing_slots_fail_naming_host_and_variable(tmp_path, capsys):
    res = run_module(capsys, {"path": str(tmp_path / "h"), "hosts": ["w1", "w2"], "slots": {"w1": 1}})
    assert res["failed"] is True
    assert "host w2: no slots known" in res["msg"] and "deepspeed_slots" in res["msg"]
    assert not (tmp_path / "h").exists()
