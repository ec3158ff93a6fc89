"""A full run directory's disk (issue 26, point 8): the watch names it and stops the run; the summary puts it first."""
from ansible_collections.multinode.deepspeed.plugins.module_utils.run.summary import blame
from ansible_collections.multinode.deepspeed.plugins.module_utils.run.watch import (
    DISK_FULL_BYTES, STOPPING, abort_for_disk, disk_full, size)

MIB = 1 << 20


def test_sizes_read_as_a_person_writes_them():
    assert (size(0), size(1023), size(1536), size(48 * MIB), size(3 << 40)) == (
        "0 B", "1023 B", "1.5 KiB", "48.0 MiB", "3.0 TiB")


def test_a_disk_with_less_than_a_mebibyte_free_is_full():
    disk = {"path": "/mnt/full/runs/r1", "free": 4096, "total": 48 * MIB}
    cause = disk_full(disk, "coord")
    assert cause.startswith("disk full on coord: /mnt/full/runs/r1 has 4.0 KiB free of 48.0 MiB")
    assert disk_full(dict(disk, free=DISK_FULL_BYTES), "coord") is None
    assert disk_full(dict(disk, free=DISK_FULL_BYTES - 1), "coord") is not None
    # No record (an older run_status, a statvfs that failed): nothing to say.
    assert disk_full(None, "coord") is None and disk_full({"free": None}, "coord") is None
    assert disk_full(dict(disk, free=0), "coord", floor=0) is None


def test_a_full_disk_stops_the_run_with_its_cause_in_the_abort():
    verdict, reason, action = abort_for_disk("disk full on coord: x")
    assert verdict == STOPPING and reason == "disk full on coord: x"
    assert action == ("abort", "disk full on coord: x", [], "disk full on coord: x")


def summary():
    return {"status": "ok", "problems": ["rank 1 wrote no metrics"]}


def test_the_cause_comes_before_the_rank_that_failed_because_of_it():
    s = summary()
    failure = {"rank": 0, "host": "worker1", "exit_code": 1}
    blame(s, failure, {"reason": "an abort record that cannot be read"}, [], "disk full on coord: x")
    assert s["status"] == "failed"
    assert s["problems"][:2] == ["disk full on coord: x", "rank 0 on worker1 exited with 1"]
    assert failure["consequence_of"] == "disk full on coord: x"


def test_the_abort_records_cause_is_used_and_not_repeated():
    s = summary()
    blame(s, None, {"reason": "disk full on coord: x", "host": "controller", "cause": "disk full on coord: x"}, [])
    assert s["problems"] == ["disk full on coord: x", "rank 1 wrote no metrics"]
    s = summary()
    blame(s, None, {"reason": "stopped by hand", "host": "controller"}, [])
    assert s["problems"][0] == "the run was aborted by controller: stopped by hand"
