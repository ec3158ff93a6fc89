import pytest

from ansible_collections.multinode.deepspeed.plugins.module_utils.common.hostfile import (
    HostfileError, build, parse, with_slots)


def test_layout_follows_hostfile_order():
    out = build([{"name": "w1", "slots": 2}, {"name": "w2", "slots": 1}])
    assert out["text"] == "w1 slots=2\nw2 slots=1\n"
    assert out["world_size"] == 3
    assert out["master"] == "w1"
    assert [(r["rank"], r["host"], r["local_rank"]) for r in out["ranks"]] == [
        (0, "w1", 0), (1, "w1", 1), (2, "w2", 0)]
    assert [h["first_rank"] for h in out["hosts"]] == [0, 2]


def test_duplicate_host_is_rejected_naming_the_host():
    with pytest.raises(HostfileError, match="host w1 appears twice"):
        build([{"name": "w1", "slots": 1}, {"name": "w1", "slots": 1}])


@pytest.mark.parametrize("slots", [0, -1, "0"])
def test_zero_slots_rejected(slots):
    with pytest.raises(HostfileError, match="host w1: slots=.*at least one slot"):
        build([{"name": "w1", "slots": slots}])


@pytest.mark.parametrize("slots", ["two", 1.5, True, None, "1.5"])
def test_non_numeric_slots_rejected(slots):
    with pytest.raises(HostfileError, match="not a whole number"):
        build([{"name": "w1", "slots": slots}])


def test_string_slots_from_inventory_are_accepted():
    assert build([{"name": "w1", "slots": "4"}])["world_size"] == 4


def test_bad_name_rejected():
    with pytest.raises(HostfileError, match="not a valid host name"):
        build([{"name": "w 1", "slots": 1}])


def test_exclude_and_include():
    hosts = [{"name": n, "slots": 1} for n in ("a", "b", "c")]
    assert build(hosts, exclude=["b"])["text"] == "a slots=1\nc slots=1\n"
    assert build(hosts, include=["c"])["master"] == "c"
    with pytest.raises(HostfileError, match="host z is named in include/exclude"):
        build(hosts, exclude=["z"])


def test_nothing_left_is_an_error():
    with pytest.raises(HostfileError, match="no rank hosts are left"):
        build([{"name": "a", "slots": 1}], exclude=["a"])
    with pytest.raises(HostfileError, match="no rank hosts"):
        build([])


def test_with_slots_names_missing_variable():
    assert with_slots(["a"], {}, 1) == [{"name": "a", "slots": 1}]
    with pytest.raises(HostfileError, match="host b: no slots known .*deepspeed_slots"):
        with_slots(["a", "b"], {"a": 2})


def test_parse_round_trip():
    out = build([{"name": "w1", "slots": 2}, {"name": "w2", "slots": 1}])
    assert parse("# comment\n\n" + out["text"]) == [{"name": "w1", "slots": 2}, {"name": "w2", "slots": 1}]


def test_deepspeed_reads_our_hostfile(tmp_path):
    runner = pytest.importorskip("deepspeed.launcher.runner")
    out = build([{"name": "worker1", "slots": 2}, {"name": "worker2", "slots": 1}])
    path = tmp_path / "hostfile"
    path.write_text(out["text"])
    pool = runner.fetch_hostfile(str(path))
    assert list(pool.items()) == [("worker1", 2), ("worker2", 1)]


def test_slots_from_vars_prefers_the_inventory_then_gpus_and_leaves_cpu_nodes_out():
    from ansible_collections.multinode.deepspeed.plugins.module_utils.common.hostfile import slots_from_vars
    hv = {
        "gpu8": {"deepspeed_gpu_count": "8"},
        "pinned": {"deepspeed_gpu_count": 8, "deepspeed_slots": 4},
        "cpu": {"deepspeed_gpu_count": 0},
        "cpu-explicit": {"deepspeed_gpu_count": 0, "deepspeed_slots": 1},
        "zero": {"deepspeed_slots": 0},
        "no-facts": {},
    }
    out = slots_from_vars(list(hv), hv.__getitem__)
    assert out == {"gpu8": 8, "pinned": 4, "cpu-explicit": 1, "zero": 0}
    assert list(out) == ["gpu8", "pinned", "cpu-explicit", "zero"]
