"""A marked workspace is read-only to the ranks (issue 44, point 3): sealed once it is whole, removed whole when
it changed, and the ranks' working directory's links are left out of the pull (plan/workdir.py)."""
import os
import shlex
import shutil
import subprocess
import tempfile

import pytest

from ansible_collections.multinode.deepspeed.plugins.module_utils.plan import workdir

NOBODY = 65534


def make_tree(root):
    (root / "data").mkdir(parents=True)
    (root / "data" / "points.txt").write_text("1 2\n")
    (root / "train.py").write_text("print('x')\n")
    (root / "train.py").chmod(0o700)
    (root / "helper.py").write_text("X = 1\n")
    (root / "helper.py").chmod(0o600)
    return root


def modes(root):
    return dict((os.path.relpath(os.path.join(here, n), root), oct(os.lstat(os.path.join(here, n)).st_mode & 0o777))
                for here, dirs, names in os.walk(root) for n in dirs + names)


def test_seal_keeps_the_owners_read_and_execute_bits_only_and_the_hash(tmp_path):
    root = make_tree(tmp_path / "ws")
    (root / "lnk").symlink_to("train.py")
    before = workdir.digest(str(root), workdir.tree(str(root)))
    workdir.seal(str(root))
    assert modes(root) == {"data": "0o500", "data/points.txt": "0o400", "train.py": "0o500", "helper.py": "0o400",
                           "lnk": "0o777"}
    assert oct(os.stat(root).st_mode & 0o777) == "0o500"
    # The hash reads the owner's execute bit, which the seal keeps: a sealed copy still verifies.
    assert workdir.digest(str(root), workdir.tree(str(root))) == before


def test_remove_takes_a_sealed_tree_and_follows_no_link_out_of_it(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("mine\n")
    outside.chmod(0o555)
    root = make_tree(tmp_path / "ws")
    (root / "data" / "out").symlink_to(outside)
    workdir.seal(str(root))
    workdir.remove(str(root))
    assert not os.path.lexists(root)
    assert (outside / "keep.txt").read_text() == "mine\n" and oct(outside.stat().st_mode & 0o777) == "0o555"
    workdir.remove(str(root))  # nothing there: nothing to do
    link = tmp_path / "link"
    link.symlink_to(outside)
    workdir.remove(str(link))  # a link is not a workspace
    assert (outside / "keep.txt").exists()


SEALED_SCRIPT = """
import os, sys
sys.path.insert(0, sys.argv[1])
import workdir
ws = os.path.join(sys.argv[1], "ws")
os.makedirs(ws + "/data")
with open(ws + "/data/points.txt", "w") as fh:
    fh.write("1 2\\n")
workdir.seal(ws)
refused = []
for what, act in (("new", lambda: open(ws + "/data/new.txt", "w")), ("append", lambda: open(ws + "/data/points.txt", "a")),
                  ("rename", lambda: os.rename(ws + "/data/points.txt", ws + "/p.txt"))):
    try:
        act()
    except PermissionError:
        refused.append(what)
print(",".join(refused))
workdir.remove(ws)
print(os.path.exists(ws))
"""


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/usr/bin/python3"),
                    reason="needs root to act as another account, and a Python that account may run")
def test_the_owner_cannot_write_into_a_sealed_tree_by_accident_and_the_play_still_removes_it():
    """As the run's account (not root, which no mode stops): a new file, an append, a rename fail; remove works.
    The module is stdlib only: a copy of it runs as that account."""
    base = tempfile.mkdtemp(prefix="mnds-seal-")
    try:
        shutil.copyfile(workdir.__file__, os.path.join(base, "workdir.py"))
        for path in (base, os.path.join(base, "workdir.py")):
            os.chown(path, NOBODY, -1)
        os.chmod(base, 0o755)
        proc = subprocess.run(["/usr/bin/python3", "-c", SEALED_SCRIPT, base], capture_output=True, text=True,
                              check=False, preexec_fn=lambda: os.setuid(NOBODY), timeout=60, cwd=base)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.split() == ["new,append,rename", "False"]
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_the_pull_leaves_out_each_top_entry_of_the_work_directory_quoted_for_synchronizes_shell_split():
    names = ["data", "train.py", "a b", "it's", "*.py", "x[1]", "back\\slash", "-rf"]
    opts = workdir.pull_excludes(names)
    # ansible.posix.synchronize joins its options with spaces and run_command splits them as a shell would.
    assert shlex.split(" ".join(opts)) == [
        "--exclude=/work/data", "--exclude=/work/train.py", "--exclude=/work/a b", "--exclude=/work/it's",
        "--exclude=/work/\\*.py", "--exclude=/work/x\\[1]", "--exclude=/work/back\\slash", "--exclude=/work/-rf"]


@pytest.mark.skipif(not os.path.exists("/usr/bin/rsync"), reason="rsync is not installed")
def test_rsync_with_these_options_pulls_the_outputs_and_no_link(tmp_path):
    run = tmp_path / "run"
    work = run / "work"
    work.mkdir(parents=True)
    names = ["data", "*.py", "x[1]", "a b"]
    for name in names:
        (work / name).symlink_to("/etc")
    (work / "out.txt").write_text("rank output\n")
    (work / "x1").write_text("not x[1]\n")
    cmd = " ".join(["rsync", "-a", "--no-links"] + workdir.pull_excludes(names) + ["%s/" % run, "%s/" % (tmp_path / "got")])
    proc = subprocess.run(shlex.split(cmd), capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "skipping non-regular file" not in proc.stdout + proc.stderr
    assert sorted(os.listdir(tmp_path / "got" / "work")) == ["out.txt", "x1"]


def test_the_plan_names_the_top_entries():
    assert workdir.top_names(["train.py", "data/a", "data/b/c", ".gitignore", "#x"]) == [
        "#x", ".gitignore", "data", "train.py"]
