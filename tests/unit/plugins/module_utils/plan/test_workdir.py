"""The workdir: what of a user's directory ships to the nodes (git's view, the excludes), its size, its hash."""
import os
import subprocess

import pytest

from ansible_collections.multinode.deepspeed.plugins.module_utils.plan import workdir
from ansible_collections.multinode.deepspeed.plugins.module_utils.plan.workdir import (
    WorkdirError, digest, excluded, git_info, human, list_files, plan, short_id, size_report, validate)

MIB = 1024 * 1024


def git(root, *args):
    return subprocess.run(["git", "-C", str(root)] + list(args), check=True, capture_output=True).stdout


def write(root, path, data=b"x", mode=None):
    full = root / path
    full.parent.mkdir(parents=True, exist_ok=True)
    full.write_bytes(data)
    if mode is not None:
        full.chmod(mode)
    return full


@pytest.fixture
def repo(tmp_path):
    """A git work tree: a tracked script, data file and .gitignore, an ignored big file and log, an untracked
    file, a committed file deleted from the tree (still in the index), a symlink to the script."""
    root = tmp_path / "proj"
    root.mkdir()
    git(root, "init", "-q", "-b", "main")
    git(root, "config", "user.email", "t@example.com")
    git(root, "config", "user.name", "T")
    write(root, ".gitignore", b"big.bin\n*.log\n")
    write(root, "train.py", b"print('hi')\n", 0o755)
    write(root, "data/shard0.txt", b"0123456789")
    write(root, "gone.py", b"old\n")
    (root / "link.py").symlink_to("train.py")
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "first")
    write(root, "big.bin", b"\0" * (2 * MIB))
    write(root, "run.log", b"log\n")
    write(root, "notes.txt", b"notes\n")
    (root / "gone.py").unlink()
    return root


SHIPPED = [".gitignore", "data/shard0.txt", "link.py", "notes.txt", "train.py"]


def test_git_tree_ships_tracked_and_untracked_files_but_not_ignored_or_deleted(repo):
    assert list_files(str(repo)) == SHIPPED
    # A workdir below the repository's top: paths relative to the workdir.
    assert list_files(str(repo / "data")) == ["shard0.txt"]


def test_plain_directory_ships_every_file_but_dot_git(tmp_path):
    write(tmp_path, "a.py")
    write(tmp_path, "sub/b.bin")
    write(tmp_path, ".git/config")
    write(tmp_path, "sub/.git", b"gitdir: elsewhere\n")
    (tmp_path / "sublink").symlink_to("sub")
    # The link to a directory ships as a link: its files are not listed twice.
    assert list_files(str(tmp_path)) == ["a.py", "sub/b.bin", "sublink"]


def test_a_nested_untracked_repository_is_walked(repo):
    inner = repo / "vendor"
    inner.mkdir()
    git(inner, "init", "-q")
    write(inner, "lib.py")
    assert "vendor/lib.py" in list_files(str(repo))
    assert not any(p.startswith("vendor/.git") for p in list_files(str(repo)))


@pytest.mark.parametrize("path, patterns, out", [
    ("data/shard0.txt", ["*.txt"], True),
    ("data/shard0.txt", ["data"], True),
    ("data/shard0.txt", ["data/"], True),
    ("data", ["data/"], False),
    ("x/data/a.bin", ["data/"], True),
    ("data/shard0.txt", ["/data"], True),
    ("x/data/a.bin", ["/data"], False),
    ("data/raw/a.bin", ["data/raw"], True),
    ("data/raw/a.bin", ["data/*.bin"], True),
    ("data/shard0.txt", ["data/raw"], False),
    ("src/__pycache__/m.pyc", ["__pycache__"], True),
    ("train.py", ["*.pt", "ckpt/"], False),
    ("train.py", [], False),
])
def test_exclude_patterns(path, patterns, out):
    assert excluded(path, patterns) is out


def test_excludes_drop_files_from_git_and_plain_trees(repo, tmp_path):
    assert list_files(str(repo), ["data/", "*.txt"]) == [".gitignore", "link.py", "train.py"]
    plain = tmp_path / "plain"
    write(plain, "out/ckpt.pt")
    write(plain, "train.py")
    assert list_files(str(plain), ["out/"]) == ["train.py"]


def test_a_symlink_out_of_the_workdir_is_an_error_naming_it(repo, tmp_path):
    write(tmp_path, "secret.txt")
    (repo / "escape.txt").symlink_to(tmp_path / "secret.txt")
    with pytest.raises(WorkdirError, match="escape.txt is a symlink to .*secret.txt, outside the workdir"):
        list_files(str(repo))
    # Excluded, it is not shipped and not a problem.
    assert "escape.txt" not in list_files(str(repo), ["escape.txt"])


def test_a_line_break_in_a_name_is_refused(tmp_path):
    write(tmp_path, "bad\nname.py")
    with pytest.raises(WorkdirError, match="line break"):
        list_files(str(tmp_path))


@pytest.mark.parametrize("size, text", [(0, "0 B"), (1023, "1023 B"), (3 * 1024, "3.0 KiB"), (812 * MIB, "812.0 MiB")])
def test_sizes_read_as_a_person_would(size, text):
    assert human(size) == text


def test_size_under_the_limit_is_the_total(repo):
    files = list_files(str(repo))
    assert size_report(str(repo), files, 1) == sum(os.lstat(repo / f).st_size for f in files)
    assert size_report(str(repo), files, None) > 0


def test_size_over_the_limit_names_the_biggest_entries(tmp_path):
    write(tmp_path, "data/a.bin", b"\0" * (3 * MIB))
    write(tmp_path, "data/b.bin", b"\0" * (MIB // 2))
    write(tmp_path, "model.bin", b"\0" * MIB)
    for i in range(5):
        write(tmp_path, "f%d.txt" % i)
    files = list_files(str(tmp_path))
    with pytest.raises(WorkdirError) as err:
        size_report(str(tmp_path), files, 2)
    assert str(err.value) == (
        "workdir %s is 4.5 MiB, over workdir_max_mb=2: the biggest entries are data/ (3.5 MiB), model.bin (1.0 MiB), "
        "f0.txt (1 B), f1.txt (1 B), f2.txt (1 B), … — add them to .gitignore or workdir_exclude, or "
        "raise workdir_max_mb" % tmp_path)


def test_hash_follows_paths_contents_and_the_executable_bit_not_mtimes(repo):
    files = list_files(str(repo))
    first = digest(str(repo), files)
    assert len(first) == 64 and short_id(first) == first[:16]
    os.utime(repo / "train.py", (1, 1))
    os.utime(repo / "data" / "shard0.txt", (2, 2))
    assert digest(str(repo), files) == first
    write(repo, "data/shard0.txt", b"0123456788")
    changed = digest(str(repo), files)
    assert changed != first
    (repo / "data" / "shard0.txt").chmod(0o755)
    assert digest(str(repo), files) not in (first, changed)
    (repo / "data" / "shard0.txt").chmod(0o644)
    assert digest(str(repo), files) == changed
    # A symlink hashes as its target's name.
    (repo / "link.py").unlink()
    (repo / "link.py").symlink_to("data/shard0.txt")
    assert digest(str(repo), files) != changed


def test_git_info_clean_dirty_and_outside_git(repo, tmp_path):
    info = git_info(str(repo))
    head = git(repo, "rev-parse", "HEAD").decode().strip()
    assert info == {"commit": head, "dirty": True, "branch": "main"}
    (repo / "notes.txt").unlink()
    git(repo, "rm", "-q", "--cached", "gone.py")
    git(repo, "commit", "-q", "-m", "rm")
    assert git_info(str(repo))["dirty"] is False
    write(repo, "train.py", b"changed\n")
    assert git_info(str(repo))["dirty"] is True
    git(repo, "checkout", "-q", "--detach")
    assert git_info(str(repo))["branch"] is None
    plain = tmp_path / "plain"
    plain.mkdir()
    assert git_info(str(plain)) == {"commit": None, "dirty": None, "branch": None}


def test_git_info_before_the_first_commit(tmp_path):
    git(tmp_path, "init", "-q", "-b", "dev")
    write(tmp_path, "a.py")
    assert git_info(str(tmp_path)) == {"commit": None, "dirty": True, "branch": "dev"}


def test_validate_resolves_a_relative_workdir_against_where_ansible_runs(repo, tmp_path):
    assert validate("proj", "train.py", str(tmp_path)) == (str(repo), "train.py")
    assert validate(str(repo), str(repo / "data" / "shard0.txt"), "/") == (str(repo), "data/shard0.txt")
    assert validate("proj", None, str(tmp_path)) == (str(repo), None)


@pytest.mark.parametrize("workdir, entrypoint, message", [
    ("nowhere", "train.py", r"workdir=nowhere does not exist \(looked for .*/nowhere; a relative path is taken from"),
    ("proj/train.py", None, r"workdir=proj/train.py is a file, not a directory. Fix: .*-e entrypoint=train.py"),
    ("", "train.py", "workdir is empty"),
    ("proj", "../other.py", r"entrypoint=\.\./other.py is outside workdir"),
    ("proj", "data/../../x.py", "is outside workdir"),
    ("proj", "/etc/hostname", "entrypoint=/etc/hostname is outside workdir"),
    ("proj", ".", "is outside workdir"),
    ("proj", "missing.py", "entrypoint=missing.py is not a file in workdir"),
    ("proj", "data", "entrypoint=data is not a file in workdir"),
])
def test_validate_refuses(repo, tmp_path, workdir, entrypoint, message):
    with pytest.raises(WorkdirError, match=message):
        validate(workdir, entrypoint, str(tmp_path))


def test_an_ignored_or_excluded_entrypoint_is_not_shipped(repo, tmp_path):
    write(repo, "scratch.log", b"print(1)\n")
    with pytest.raises(WorkdirError, match="entrypoint=scratch.log is in workdir .* but not shipped: .gitignore"):
        plan("proj", "scratch.log", [], None, str(tmp_path))
    with pytest.raises(WorkdirError, match="not shipped"):
        plan("proj", "train.py", ["train.py"], None, str(tmp_path))


def test_plan_is_everything_the_copy_needs(repo, tmp_path):
    out = plan("proj", "train.py", ["notes.txt"], 64, str(tmp_path))
    files = [".gitignore", "data/shard0.txt", "link.py", "train.py"]
    assert out["root"] == str(repo) and out["files"] == files and out["count"] == 4
    assert out["bytes"] == sum(os.lstat(repo / f).st_size for f in files)
    assert out["hash"] == digest(str(repo), files) and out["id"] == out["hash"][:16]
    assert out["entrypoint"] == "train.py" and out["git"]["branch"] == "main" and out["git"]["dirty"] is True
    assert out["files_from"] == "./.gitignore\n./data/shard0.txt\n./link.py\n./train.py\n"
    biggest = r"is 50 B, over workdir_max_mb=0: the biggest entries are \.gitignore \(14 B\), train.py \(12 B\), data/ "
    with pytest.raises(WorkdirError, match=biggest):
        plan("proj", "train.py", [], 0, str(tmp_path))


def test_a_repository_git_cannot_read_is_an_error_not_a_walk(repo, monkeypatch):
    # git missing from PATH: walking instead would ship big.bin, which .gitignore leaves out.
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(WorkdirError, match="in the git repository %s, and git cannot read it .*install git" % repo):
        list_files(str(repo))


def test_a_repository_another_user_owns_is_an_error_naming_the_fix(repo, monkeypatch):
    def refused(root, *args):
        return 128, b"", "fatal: detected dubious ownership in repository at '%s' ... safe.directory" % root
    monkeypatch.setattr(workdir, "_git", refused)
    with pytest.raises(WorkdirError, match="another user owns.*git config --global --add safe.directory"):
        list_files(str(repo))


def test_a_workdir_with_nothing_to_ship_is_refused(repo, tmp_path):
    write(repo, "build/out.bin")
    write(repo, ".gitignore", b"big.bin\n*.log\nbuild/\n")
    with pytest.raises(WorkdirError, match="has no file to ship"):
        plan("proj/build", None, [], None, str(tmp_path))
    with pytest.raises(WorkdirError, match="has no file to ship"):
        plan("proj", None, ["*"], None, str(tmp_path))


def test_a_fifo_or_a_socket_in_the_workdir_is_refused_before_it_is_read(tmp_path):
    """Issue 44, point 7: a FIFO hung the plan's hash (open() waits for a writer); a socket or a device is no file
    to ship either. Refused at listing time, naming it and the fix."""
    import socket as _socket
    wd = workdir
    (tmp_path / "train.py").write_text("print(1)\n")
    os.mkfifo(str(tmp_path / "pipe"))
    with pytest.raises(wd.WorkdirError, match="pipe is a FIFO: only files, directories and symlinks ship. Fix: "
                                              "remove it, or add pipe to workdir_exclude"):
        wd.plan(str(tmp_path), "train.py", [], 100, str(tmp_path))
    assert wd.plan(str(tmp_path), "train.py", ["pipe"], 100, str(tmp_path))["files"] == ["train.py"]
    os.unlink(str(tmp_path / "pipe"))
    sock = _socket.socket(_socket.AF_UNIX)
    try:
        sock.bind(str(tmp_path / "s.sock"))
        with pytest.raises(wd.WorkdirError, match="s.sock is a socket"):
            wd.plan(str(tmp_path), "train.py", [], 100, str(tmp_path))
    finally:
        sock.close()
