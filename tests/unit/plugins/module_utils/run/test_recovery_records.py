"""The quarantine and spares records (issue 44, point 12): changed under a lock (no change of another play or
controller is lost), written whole, a damaged file named with its fix and never taken as empty, a spare's hold
that ends with its run or after a bounded time, and let out by -e unquarantine."""
import json
import os
import threading
import time

import pytest

from ansible_collections.multinode.deepspeed.plugins.module_utils.run import recovery


@pytest.mark.parametrize("key, text, why", [
    ("nodes", "", "it is empty"), ("nodes", "{not json", "it is not JSON"),
    ("nodes", "[1, 2]", "it is not a JSON object with nodes"), ("nodes", '{"nodes": []}', "not a JSON object"),
    ("spares", "", "it is empty"), ("spares", '{"spares": "w3"}', "it is not a JSON object with spares"),
])
def test_a_damaged_record_is_an_error_naming_the_file_and_the_fix_and_is_left_as_it_is(tmp_path, key, text, why):
    path = tmp_path / "record.json"
    path.write_text(text)
    load = recovery.load_quarantine if key == "nodes" else recovery.load_spares
    with pytest.raises(recovery.RecordError) as err:
        load(str(path))
    msg = str(err.value)
    kind = "quarantine" if key == "nodes" else "spares"
    assert msg.startswith("%s is not a %s file (%s_file)" % (path, kind, kind))
    assert why in msg and "Fix: repair it" in msg and "or remove it" in msg
    update = recovery.update_quarantine if key == "nodes" else recovery.update_spares
    with pytest.raises(recovery.RecordError):
        update(str(path), lambda old: ({"w9": {}}, None))
    assert path.read_text() == text


def test_a_missing_record_is_empty_and_a_write_is_whole(tmp_path):
    path = tmp_path / "state" / "quarantine.json"
    assert recovery.load_quarantine(str(path)) == {} and recovery.load_spares(str(tmp_path / "none.json")) == {}
    recovery.save_quarantine(str(path), {"w2": {"since": 0, "reason": "lost twice", "run_id": "r1"}})
    assert json.loads(path.read_text()) == {"nodes": {"w2": {"since": 0, "reason": "lost twice", "run_id": "r1"}}}
    assert sorted(os.listdir(path.parent)) == ["quarantine.json", "quarantine.json.lock"]  # no temporary left


def test_two_controllers_quarantining_at_once_lose_nothing(tmp_path):
    path = str(tmp_path / "quarantine.json")
    inside = threading.Event()

    def first(nodes):
        inside.set()
        time.sleep(0.3)  # the second controller reads now, unless the lock holds it back
        return recovery.quarantine(nodes, {"w1": "lost twice"}, "run-a"), None

    def second(nodes):
        return recovery.quarantine(nodes, {"w2": "stalled twice"}, "run-b"), None

    a = threading.Thread(target=recovery.update_quarantine, args=(path, first))
    a.start()
    inside.wait(5)
    recovery.update_quarantine(path, second)
    a.join()
    held = recovery.load_quarantine(path)
    assert sorted(held) == ["w1", "w2"] and held["w1"]["run_id"] == "run-a" and held["w2"]["run_id"] == "run-b"


def test_a_spare_hold_ends_with_its_run_or_after_its_time_and_can_be_let_out():
    held = recovery.hold_spares({}, ["w3"], "run-a", now=100.0, seconds=600)
    held = recovery.hold_spares(held, ["w4"], "run-b", now=100.0, seconds=600)
    assert recovery.spares_held(held, "run-c", 200.0) == ["w3", "w4"]
    assert recovery.spares_held(held, "run-c", 701.0) == []              # bounded by the run's timeout
    assert sorted(recovery.release_spares(held, "run-a")) == ["w4"]      # the run ended
    assert sorted(recovery.release_nodes(held, ["w4"])) == ["w3"]        # -e unquarantine=w4
    note = recovery.held_note("w3", held["w3"])
    assert note.startswith("spare w3 is held by another run (run-a, until 1970-01-01 00:11 UTC;")
    assert "-e unquarantine=w3 lets it out" in note


def test_a_link_in_place_of_a_record_is_refused_and_what_it_points_at_is_left_alone(tmp_path):
    """The records are in the shared runs/ on the coordinator, which rank code can write: a change reads the record
    without following a link, so a link there stops it, naming the file and the fix."""
    target = tmp_path / "elsewhere.json"
    target.write_text('{"nodes": {"w1": {"since": 0, "reason": "x", "run_id": "r0"}}}')
    path = tmp_path / "state" / "quarantine.json"
    path.parent.mkdir()
    os.symlink(str(target), str(path))
    with pytest.raises(recovery.RecordError) as err:
        recovery.update_quarantine(str(path), lambda old: (recovery.quarantine(old, {"w2": "lost twice"}, "r1"), None))
    assert str(err.value).startswith("%s is not a regular file" % path) and "Fix: remove it" in str(err.value)
    assert os.path.islink(str(path)) and json.loads(target.read_text())["nodes"].keys() == {"w1"}
