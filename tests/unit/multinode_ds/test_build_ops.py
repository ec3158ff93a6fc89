"""multinode_ds.build_ops: DeepSpeed's ops built into TORCH_EXTENSIONS_DIR by DeepSpeed's own op builders (role stack
and the stack's image run it): BUILT when an .so changed, CURRENT when not, the stamp replaced."""
import os
import subprocess
import time
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def build_ops(tmp_path, *names, stamp=None):
    env = dict(os.environ, DS_ACCELERATOR="cpu", TORCH_EXTENSIONS_DIR=str(tmp_path / "ext"),
               PYTHONPATH=str(ROOT))
    if stamp:
        env["STACK_OPS_STAMP"] = str(stamp)
    return subprocess.run([sys.executable, "-m", "multinode_ds.build_ops", *names], env=env, capture_output=True,
                          text=True, check=False, timeout=600)


def test_no_op_to_build_is_current_and_leaves_the_stamp(tmp_path):
    (tmp_path / "ext").mkdir()
    (tmp_path / "ext" / ".current-old").write_text("")
    res = build_ops(tmp_path, stamp=tmp_path / "ext" / ".current-new")
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split()[:1] == ["CURRENT"]
    assert sorted(p.name for p in (tmp_path / "ext").iterdir()) == [".current-new"]


def test_a_builder_the_accelerator_lacks_is_skipped(tmp_path):
    (tmp_path / "ext").mkdir()
    res = build_ops(tmp_path, "NoSuchBuilder")
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.startswith("CURRENT") and "skipped NoSuchBuilder: the cpu accelerator has no such op" in res.stderr


def test_a_stale_build_lock_is_removed_before_building(tmp_path):
    """A build killed half-way (site.yml interrupted) left torch's lock: every later load would wait for it."""
    lock = tmp_path / "ext" / "deepspeed_shm_comm" / "lock"
    lock.parent.mkdir(parents=True)
    lock.write_text("")
    old = time.time() - 600
    for path in (lock, lock.parent):
        os.utime(path, (old, old))
    res = build_ops(tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    assert not lock.exists() and "removed the stale build lock %s" % lock in res.stderr
