"""workspace_mark: the copy of a workdir on the shared directory is checked against the plan's hash (the same code
as the plan's), and only a whole copy gets its marker (issue 44, point 3)."""
import os
import shutil
import subprocess

import pytest

from ansible_collections.multinode.deepspeed.plugins.module_utils.plan import workdir
from ansible_collections.multinode.deepspeed.plugins.modules import workspace_mark

NAMES = ["#notes.py", ";semi.txt", "train.py", "sub/#deep.txt", " lead.txt", "trail.txt "]


@pytest.fixture(name="project")
def project_fixture(tmp_path):
    """A workdir whose names rsync's --files-from took for comments (#, ;), with spaces at either end."""
    root = tmp_path / "proj"
    for name in NAMES:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("content of %s\n" % name)
    (root / "train.py").chmod(0o755)
    return root


def rsync(src, dest, files_from, tmp_path):
    """The copy train.yml makes (ansible.posix.synchronize: rsync -a with these options)."""
    (tmp_path / "list").write_text(files_from)
    subprocess.run(["rsync", "-a", "--files-from=%s" % (tmp_path / "list"), "--mkpath", "--chmod=go-rwx",
                    "%s/" % src, "%s/" % dest], check=True, capture_output=True)


def mark(run_module, dest, plan, **extra):
    args = dict(path=str(dest), hash=plan["hash"], marker=str(dest) + ".json", content={"id": plan["id"]},
                files_from=plan["files_from"])
    args.update(extra)
    return run_module(workspace_mark, args)


needs_rsync = pytest.mark.skipif(shutil.which("rsync") is None, reason="rsync is not installed")


@needs_rsync
def test_every_name_is_copied_checked_and_marked_readable_by_the_owner_only(run_module, project, tmp_path):
    plan = workdir.plan(str(project), "train.py", [], None, "/")
    dest = tmp_path / "shared" / "workspaces" / plan["id"]
    rsync(project, dest, plan["files_from"], tmp_path)
    assert workdir.tree(str(dest)) == sorted(NAMES)
    assert oct(os.stat(dest).st_mode & 0o777) == "0o700" and oct(os.stat(dest / "train.py").st_mode & 0o777) == "0o700"
    assert oct(os.stat(dest / "sub" / "#deep.txt").st_mode & 0o777) == "0o600"
    res = mark(run_module, dest, plan)
    assert not res.get("failed"), res.get("msg")
    assert res["changed"] is True and res["count"] == len(NAMES)
    marker = dest.parent / (plan["id"] + ".json")
    assert marker.read_text() == '{\n    "id": "%s"\n}\n' % plan["id"]
    assert oct(os.stat(marker).st_mode & 0o777) == "0o600"
    # Marked, it is read-only to the ranks (its owner's read and execute bits only), and still the planned content.
    assert [oct(os.stat(dest / p).st_mode & 0o777) for p in ("", "sub", "train.py", "sub/#deep.txt")] == [
        "0o500", "0o500", "0o500", "0o400"]
    assert workdir.verify(str(dest), plan["hash"]) is None


@needs_rsync
def test_a_list_rsync_reads_comments_in_leaves_files_out_and_no_marker_is_written(run_module, project, tmp_path):
    plan = workdir.plan(str(project), "train.py", [], None, "/")
    dest = tmp_path / "ws"
    # The list as it was before: one bare name a line.
    rsync(project, dest, "".join(f + "\n" for f in plan["files"]), tmp_path)
    res = mark(run_module, dest, plan)
    assert res["failed"] is True and not os.path.exists(str(dest) + ".json")
    assert res["msg"].startswith("the copy in %s is not the content the plan hashed (%s planned, " % (
        dest, plan["id"]))
    assert "there: missing: #notes.py, ;semi.txt). Fix: launch again (no marker was written, so the copy is redone)" \
        in res["msg"]


def test_a_changed_or_extra_file_fails_and_check_mode_writes_nothing(run_module, project, tmp_path):
    plan = workdir.plan(str(project), "train.py", [], None, "/")
    dest = tmp_path / "ws"
    shutil.copytree(project, dest, symlinks=True)
    res = mark(run_module, dest, plan, _ansible_check_mode=True)
    assert not res.get("failed") and res["changed"] is False and not os.path.exists(str(dest) + ".json")
    (dest / "train.py").chmod(0o644)  # the execute bit is content
    res = mark(run_module, dest, plan)
    assert res["failed"] and "the files are the planned ones, with another content or kind" in res["msg"]
    (dest / "train.py").chmod(0o700)
    (dest / "out.log").write_text("a rank wrote here\n")
    res = mark(run_module, dest, plan)
    assert res["failed"] and "not planned: out.log" in res["msg"]
    res = mark(run_module, tmp_path / "nowhere", plan)
    assert res["failed"] and "is not a directory: the workdir was not copied there" in res["msg"]


def test_the_owners_execute_bit_is_what_the_hash_reads(tmp_path):
    (tmp_path / "a.sh").write_text("x\n")
    (tmp_path / "a.sh").chmod(0o654)  # the group's execute bit only: not executable for the run's account
    first = workdir.digest(str(tmp_path), ["a.sh"])
    (tmp_path / "a.sh").chmod(0o600)
    assert workdir.digest(str(tmp_path), ["a.sh"]) == first
    (tmp_path / "a.sh").chmod(0o700)
    assert workdir.digest(str(tmp_path), ["a.sh"]) != first


def test_planned_files_reads_the_list_back():
    assert workdir.planned_files("./#a\n./ b \n./c/d\n") == ["#a", " b ", "c/d"]
    assert workdir.planned_files(workdir.files_from(NAMES)) == NAMES
