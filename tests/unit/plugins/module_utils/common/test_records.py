"""The quarantine and spares records as the coordinator reads them for the plan (issue 44, point 12): node_facts
with records reads <shared_dir>/runs/.records/ there - a missing record is empty, a damaged one is a problem naming
the file and the fix, a link (to the file or to its directory), a FIFO or a record too large is never read."""
import json
import os

from ansible_collections.multinode.deepspeed.plugins.module_utils.common import records
from ansible_collections.multinode.deepspeed.plugins.module_utils.provision import node_read
from ansible_collections.multinode.deepspeed.plugins.module_utils.run import recovery
from ansible_collections.multinode.deepspeed.plugins.plugin_utils import node_python
from tests.unit.plugins.plugin_utils.test_node_python import params, run_isolated

HELD = {"worker2": {"since": 0, "reason": "lost twice", "run_id": "r0"}}


def shared_dir(tmp_path):
    shared = tmp_path / "shared"
    (shared / "runs").mkdir(parents=True)
    return shared


def test_the_coordinator_answers_with_its_records_and_a_missing_one_is_empty(tmp_path):
    shared = shared_dir(tmp_path)
    recovery.save_quarantine(str(shared / "runs" / ".records" / "quarantine.json"), HELD)
    res = node_read.node_facts(params(tmp_path, records=True, shared_dir=str(shared), quarantine_file=None,
                                      spares_file=None))
    found = res["ansible_facts"]["multinode_node"]["records"]
    assert found == {"quarantine_file": str(shared / "runs" / ".records" / "quarantine.json"),
                     "spares_file": str(shared / "runs" / ".records" / "spares.json"),
                     "quarantine": HELD, "spares": {}, "problems": []}
    # A worker (records unset) answers without them.
    (tmp_path / "worker").mkdir()
    res = node_read.node_facts(params(tmp_path / "worker", records=False, shared_dir=str(shared)))
    assert "records" not in res["ansible_facts"]["multinode_node"]


def test_the_read_on_a_node_without_ansible_gives_the_records_too(tmp_path):
    shared = shared_dir(tmp_path)
    recovery.save_quarantine(str(shared / "runs" / ".records" / "quarantine.json"), HELD)
    checked = params(tmp_path, records=True, shared_dir=str(shared), quarantine_file=None, spares_file=None)
    rc, out, err = run_isolated(node_python.script(node_read.__name__, "node_facts", checked))
    assert rc == 0, err
    assert json.loads(out)["ansible_facts"]["multinode_node"]["records"]["quarantine"] == HELD


def test_a_damaged_record_is_a_problem_naming_the_file_and_the_fix(tmp_path):
    shared = shared_dir(tmp_path)
    path = shared / "runs" / ".records" / "spares.json"
    path.parent.mkdir()
    path.write_text('{"spares": ')
    found = records.read_all(str(shared))
    assert found["spares"] == {} and len(found["problems"]) == 1
    assert found["problems"][0].startswith("%s is not a spares file (spares_file): it is not JSON" % path)
    assert "Fix: repair it" in found["problems"][0] and path.read_text() == '{"spares": '


def test_a_link_in_place_of_a_record_or_of_its_directory_is_refused(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "quarantine.json").write_text(json.dumps({"nodes": HELD}))
    shared = shared_dir(tmp_path)
    # The records' directory is a link (rank code runs as the account that owns runs/).
    os.symlink(str(outside), str(shared / "runs" / ".records"))
    found = records.read_all(str(shared))
    path = shared / "runs" / ".records" / "quarantine.json"
    assert found["quarantine"] == {} and found["problems"][0].startswith(
        "%s is not a regular file (a symbolic link, a FIFO, a device or a directory on its way)" % path)
    assert "Fix: remove it (rm %s)" % path in found["problems"][0]
    # The record itself is a link.
    os.unlink(str(shared / "runs" / ".records"))
    (shared / "runs" / ".records").mkdir()
    os.symlink(str(outside / "quarantine.json"), str(path))
    found = records.read_all(str(shared))
    assert found["quarantine"] == {} and "is not a regular file" in found["problems"][0]
    # So is a FIFO (never waited on), and an override path that is a link.
    os.unlink(str(path))
    os.mkfifo(str(path))
    assert "is not a regular file" in records.read_all(str(shared))["problems"][0]
    link = tmp_path / "q.json"
    os.symlink(str(outside / "quarantine.json"), str(link))
    found = records.read_all(str(shared), quarantine_file=str(link))
    assert found["quarantine_file"] == str(link) and "is not a regular file" in found["problems"][0]


def test_a_record_too_large_is_not_read(tmp_path):
    path = tmp_path / "q.json"
    path.write_text(" " * (records.LIMIT + 1))
    found = records.read_all(str(tmp_path), quarantine_file=str(path))
    assert found["problems"] == ["%s is larger than %d bytes, too large for a quarantine file (quarantine_file). Fix: "
                                 "remove it (every entry in it is lost)" % (path, records.LIMIT)]


def test_a_records_path_must_be_absolute():
    assert records.path_problems("/x/q.json", None) == []
    assert records.path_problems(None, "s.json") == [
        "spares_file=s.json is not an absolute path. Fix: the path of the file on the coordinator, from / (or leave "
        "spares_file out: <shared_dir_path>/runs/.records/spares.json)"]
