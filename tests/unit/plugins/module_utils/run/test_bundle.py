"""A finished run's directory as one answer (module_utils/run/bundle.py): what it packs (what the play's rsync
copies), what makes it leave the run to rsync, and that unpacking writes only under its destination."""
import base64
import json
import os
import zlib

import pytest

from ansible_collections.multinode.deepspeed.plugins.module_utils.run import bundle


def a_run(root):
    (root / "logs").mkdir(parents=True)
    (root / "nodes").mkdir()
    (root / "monitor" / "train").mkdir(parents=True)
    (root / "checkpoints" / "global_step5").mkdir(parents=True)
    (root / "attempts" / "2").mkdir(parents=True)
    (root / "deep" / "checkpoints").mkdir(parents=True)
    (root / "hostfile").write_text("worker1 slots=1\n")
    (root / "rank.env").write_text("A=1\n")
    os.chmod(root / "rank.env", 0o600)
    (root / "launch.sh").write_text("#!/bin/sh\n")
    os.chmod(root / "launch.sh", 0o755)
    (root / "logs" / "rank0.log").write_bytes(b"\x00\xffbinary and text\n")
    (root / "nodes" / "coord.json").write_text(json.dumps({"state": "finished"}))
    (root / "monitor" / "train" / "loss.csv").write_text("step,loss\n1,2.0\n")
    (root / "checkpoints" / "global_step5" / "model.pt").write_bytes(b"x" * 100)
    (root / "attempts" / "2" / "summary.json").write_text("{}")
    (root / "deep" / "checkpoints" / "big").write_bytes(b"y" * 100)
    os.utime(root / "hostfile", (1000.0, 1000.0))
    return root


def listing(root):
    out = {}
    for here, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(here, name)
            st = os.lstat(path)
            rel = os.path.relpath(path, root)
            out[rel] = (oct(st.st_mode & 0o777), None if name in dirs else open(path, "rb").read())
    return out


def test_what_rsync_would_copy_comes_back_whole(tmp_path):
    src = a_run(tmp_path / "run")
    text, why, files = bundle.pack(str(src))
    assert why is None and files == 6
    dest = tmp_path / "controller" / "runs" / "r1"
    assert bundle.unpack(text, str(dest)) == 6
    got = listing(dest)
    # checkpoints/ and attempts/ stay behind at any depth, as rsync's --exclude=checkpoints/ leaves them.
    assert not any(p.split("/")[0] in ("checkpoints", "attempts") or "/checkpoints" in p for p in got)
    want = dict((k, v) for k, v in listing(src).items()
                if not (k.split("/")[0] in ("checkpoints", "attempts") or "/checkpoints" in k))
    assert got == want
    assert got["rank.env"][0] == "0o600" and got["launch.sh"][0] == "0o755"
    assert got["deep"] == ("0o755", None)
    assert os.stat(dest / "hostfile").st_mtime == 1000.0


def test_a_symbolic_link_or_a_special_file_leaves_the_run_to_rsync(tmp_path):
    src = a_run(tmp_path / "run")
    os.symlink("/etc/passwd", src / "logs" / "passwd")
    assert bundle.pack(str(src)) == (None, "logs/passwd is not a regular file", 0)
    os.unlink(src / "logs" / "passwd")
    os.symlink("/etc", src / "etc")
    assert bundle.pack(str(src)) == (None, "etc is a symbolic link", 0)
    os.unlink(src / "etc")
    os.mkfifo(src / "nodes" / "pipe")
    assert bundle.pack(str(src))[1] == "nodes/pipe is not a regular file"


def test_more_than_the_limit_leaves_the_run_to_rsync(tmp_path):
    src = a_run(tmp_path / "run")
    (src / "logs" / "big.log").write_bytes(b"z" * 5000)
    text, why, files = bundle.pack(str(src), max_bytes=4096)
    assert text is None and why == "the run directory holds more than 4096 bytes" and files == 0
    assert bundle.pack(str(src), max_bytes=1 << 20)[1] is None


def test_a_run_directory_that_is_gone_is_said(tmp_path):
    with pytest.raises(OSError):
        bundle.pack(str(tmp_path / "gone"))


def forged(entries):
    return base64.b64encode(zlib.compress(json.dumps(entries).encode())).decode()


@pytest.mark.parametrize("name", ["../escape", "/etc/passwd", "a/../../b", "a//b", "./a", "", None, "a/\x00"])
def test_unpack_refuses_a_name_that_leaves_its_destination(tmp_path, name):
    dest = tmp_path / "dest"
    with pytest.raises(bundle.BundleError, match="refusing the name"):
        bundle.unpack(forged([{"path": name, "mode": 0o644, "mtime": 1, "data": ""}]), str(dest))
    assert not (tmp_path / "escape").exists()


def test_unpack_never_writes_through_a_link_on_the_controller(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    dest = tmp_path / "dest"
    dest.mkdir()
    os.symlink(str(outside), dest / "logs")
    with pytest.raises(bundle.BundleError, match="symbolic link on the controller"):
        bundle.unpack(forged([{"path": "logs/rank0.log", "mode": 0o644, "mtime": 1, "data": "eA=="}]), str(dest))
    assert os.listdir(outside) == []
    # A link where a file goes is replaced by the file; its target is left as it was.
    target = outside / "secret"
    target.write_text("keep")
    os.symlink(str(target), dest / "hostfile")
    assert bundle.unpack(forged([{"path": "hostfile", "mode": 0o4755, "mtime": 1, "data": "eA=="}]), str(dest)) == 1
    assert target.read_text() == "keep" and not os.path.islink(dest / "hostfile")
    assert (dest / "hostfile").read_text() == "x" and oct(os.stat(dest / "hostfile").st_mode & 0o7777) == "0o755"


def test_unpack_refuses_what_is_not_a_bundle(tmp_path):
    for text in ("not base64!", base64.b64encode(b"not zlib").decode(), forged({"a": 1}), forged([1, 2])):
        with pytest.raises(bundle.BundleError, match="not a run bundle"):
            bundle.unpack(text, str(tmp_path / "d"))
    # One that would unpack to far more than its limit stops there.
    huge = base64.b64encode(zlib.compress(b"[" + b" " * (3 << 20) + b"]")).decode()
    with pytest.raises(bundle.BundleError, match="unpacks to more than"):
        bundle.unpack(huge, str(tmp_path / "d"), max_bytes=1 << 20)
