from ansible_collections.multinode.deepspeed.plugins.modules import hostfile


def test_writes_hostfile_and_is_idempotent(tmp_path, run_module):
    path = tmp_path / "hostfile"
    args = {"path": str(path), "hosts": ["worker1", "worker2"], "slots": {"worker1": 2}, "default_slots": 1}
    res = run_module(hostfile, args)
    assert res["changed"] is True
    assert path.read_text() == "worker1 slots=2\nworker2 slots=1\n"
    assert res["world_size"] == 3 and res["master"] == "worker1"
    assert oct(path.stat().st_mode & 0o777) == "0o644"
    again = run_module(hostfile, args)
    assert again["changed"] is False


def test_check_mode_writes_nothing(tmp_path, run_module):
    path = tmp_path / "hostfile"
    res = run_module(hostfile, {"path": str(path), "hosts": ["w1"], "default_slots": 1, "_ansible_check_mode": True})
    assert res["changed"] is True and not path.exists()


def test_missing_slots_fail_naming_host_and_variable(tmp_path, run_module):
    res = run_module(hostfile, {"path": str(tmp_path / "h"), "hosts": ["w1", "w2"], "slots": {"w1": 1}})
    assert res["failed"] is True
    assert "host w2: no slots known" in res["msg"] and "deepspeed_slots" in res["msg"]
    assert not (tmp_path / "h").exists()
