"""Have the DeepSpeed ops a run needs built on this node before its ranks start, with no stale build lock in the way.

    python -m multinode_ds.ops_ready --extensions-dir DIR [--op NAME=Builder ...] [--wait S] [--grace S] [--json]

Torch builds an op in ``DIR/<op>/`` while it holds ``DIR/<op>/lock`` (``torch.utils.file_baton.FileBaton``: the file
is created with O_EXCL, the building process keeps it open until the build ends, then removes it; every other
process that loads the op waits, polling, until the file is gone).  A build killed half-way (a run stopped as
stalled while its ranks compiled) leaves the file behind, and every later load of that op waits forever.  A lock is

- *held* when a process has the lock file open, or has its working directory in the op's directory (ninja and the
  compilers run there);
- *young* when the lock, or a file of the op's directory, changed less than ``--grace`` seconds ago (the moment
  between taking the lock and starting ninja, or between ninja's end and the release);
- *stale* otherwise: nobody will ever remove it.  It is removed, and named.

Only the processes of this account (every process, as root) can be looked into: the ops directory belongs to the
account the ranks run as (role stack: ``stack_ops_user``), and no other account can build there.  It must be
node-local (a process on another node is not seen).

Then each ``--op NAME=Builder``: *ready* when ``DIR/<op>/<op>*.so`` is there with this module's stamp for the venv's
DeepSpeed and torch and the build variables of this environment (the ranks': ``CUDA_HOME``, ``TORCH_CUDA_ARCH_LIST``,
``CC``, ``CXX``, ``CFLAGS``, ``LDFLAGS``; nothing is imported); otherwise loaded through DeepSpeed's own builder
(``get_accelerator().create_op_builder``), which builds it, or finds it current, and then stamped.  A lock another
process holds is waited for (``--wait`` seconds at most).

Progress lines go to stderr; ``--json`` prints one object on stdout: ``{"removed": [...], "held": [...], "ready":
[ops], "built": [{"op", "builder", "seconds"}], "problems": [{"op", "builder", "message"}]}``.  Exit 0 when every
op is ready, 1 otherwise, 2 on a usage error.
"""
from __future__ import annotations

# DeepSpeed is imported only when an op must be loaded.
# pylint: disable=import-outside-toplevel

import argparse
import contextlib
import glob
import hashlib
import json
import os
import sys
import time

LOCK = "lock"
STAMP = ".ops_ready-"
GRACE = 30.0
# The environment that goes into an op's build command (a different value makes ninja build again).
BUILD_VARS = ("DS_ACCELERATOR", "CUDA_HOME", "TORCH_CUDA_ARCH_LIST", "CC", "CXX", "CFLAGS", "CXXFLAGS", "LDFLAGS")


def say(text: str) -> None:
    print("ops_ready: " + text, file=sys.stderr, flush=True)


def _inside(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory + os.sep)


def _uses(pid: str, directory: str) -> bool:
    """Whether process ``pid`` has its working directory, or an open file, in ``directory`` (False when it cannot
    be looked into: gone, or another account's)."""
    base = os.path.join("/proc", pid)
    try:
        if _inside(os.readlink(base + "/cwd"), directory):
            return True
        fds = os.listdir(base + "/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if _inside(os.readlink("%s/fd/%s" % (base, fd)), directory):
                return True
        except OSError:
            continue
    return False


def holders(directory: str) -> list[int]:
    """The processes (but this one) that have their working directory or an open file in ``directory``."""
    directory = os.path.realpath(directory)
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()]
    except OSError:
        return []
    return sorted(int(p) for p in pids if _uses(p, directory))


def _newest_change(directory: str) -> float:
    """The newest change to the op's directory or its files (0 when it cannot be read)."""
    times = []
    for path in [directory] + glob.glob(os.path.join(directory, "*")) + glob.glob(os.path.join(directory, ".*")):
        try:
            times.append(os.lstat(path).st_mtime)
        except OSError:
            continue
    return max(times or [0.0])


def lock_state(lock: str, now: float | None = None, grace: float = GRACE) -> dict | None:
    """``{"op", "path", "age", "pids", "state"}`` of one build lock (``state``: held, young or stale), or None when
    it is gone."""
    now = time.time() if now is None else now
    op_dir = os.path.dirname(os.path.abspath(lock))
    try:
        age = now - os.lstat(lock).st_mtime
    except FileNotFoundError:
        return None
    pids = holders(op_dir)
    quiet = now - _newest_change(op_dir)
    state = "held" if pids else ("young" if min(age, quiet) < grace else "stale")
    return {"op": os.path.basename(op_dir), "path": lock, "age": round(max(age, 0.0)), "pids": pids, "state": state,
            "quiet": round(max(quiet, 0.0))}


def building(root: str, grace: float = GRACE) -> list[dict]:
    """The ops being built under ``root`` now (a held or young lock): ``[{"op", "age", "pids"}]``, for a status that
    shows a rank compiling as compiling; removes nothing."""
    out = []
    for lock in sorted(glob.glob(os.path.join(root, "*", LOCK))):
        state = lock_state(lock, grace=grace)
        if state and state["state"] != "stale":
            out.append({"op": state["op"], "age": state["age"], "pids": state["pids"]})
    return out


def clear_stale(root: str, grace: float = GRACE, now: float | None = None) -> tuple[list, list]:
    """Remove the stale build locks under ``root``: ``(removed, held)``, each a list of lock states (a removed one
    with ``why``)."""
    removed, held = [], []
    for lock in sorted(glob.glob(os.path.join(root, "*", LOCK))):
        state = lock_state(lock, now, grace)
        if state is None:
            continue
        if state["state"] != "stale":
            held.append(state)
            continue
        try:
            os.unlink(lock)
        except FileNotFoundError:
            continue
        state["why"] = ("left by a build that did not end: no process has it or %s open, and nothing there changed "
                        "for %d s" % (os.path.dirname(lock), min(state["age"], state["quiet"])))
        say("removed the stale build lock %s (%s)" % (lock, state["why"]))
        removed.append(state)
    return removed, held


def stamp_id(env=None, prefix: str | None = None) -> str:
    """What the op's build depends on, as a short hash: the venv's DeepSpeed and torch (their dist-info names) and
    the build variables of ``env``."""
    env = os.environ if env is None else env
    site = glob.glob(os.path.join(prefix or sys.prefix, "lib", "python*", "site-packages"))
    names = sorted(os.path.basename(p) for s in site for pattern in ("deepspeed-*.dist-info", "torch-*.dist-info")
                   for p in glob.glob(os.path.join(s, pattern)))
    text = json.dumps([sys.version_info[:2], names, [(k, env.get(k)) for k in BUILD_VARS]])
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def is_ready(root: str, op: str, stamp: str) -> bool:
    op_dir = os.path.join(root, op)
    return bool(glob.glob(os.path.join(op_dir, op + "*.so"))) and os.path.exists(os.path.join(op_dir, STAMP + stamp)) \
        and not os.path.lexists(os.path.join(op_dir, LOCK))


def write_stamp(root: str, op: str, stamp: str) -> None:
    op_dir = os.path.join(root, op)
    for old in glob.glob(os.path.join(op_dir, STAMP + "*")):
        os.unlink(old)
    with open(os.path.join(op_dir, STAMP + stamp), "w", encoding="utf-8"):
        pass


def wait_free(root: str, op: str, wait: float, grace: float = GRACE, removed: list | None = None) -> dict | None:
    """Wait until no other process holds ``op``'s build lock (a young one turns stale, and is removed: added to
    ``removed``): None, or the lock's state when it is still held after ``wait`` seconds."""
    lock = os.path.join(root, op, LOCK)
    deadline, told = time.time() + wait, 0.0
    while True:
        state = lock_state(lock, grace=grace)
        if state is None:
            return None
        if state["state"] == "stale":
            (removed if removed is not None else []).extend(clear_stale(root, grace)[0])
            continue
        if time.time() >= deadline:
            return state
        if time.time() - told >= 30:
            say("waiting for the build of %s that process(es) %s run (its lock is %d s old)" % (
                op, ", ".join(map(str, state["pids"])) or "?", state["age"]))
            told = time.time()
        time.sleep(1.0)


def build(op: str, builder_name: str) -> dict:
    """Load ``op`` through DeepSpeed's builder for this node's accelerator (it builds it, or finds it current):
    ``{"op", "builder", "seconds"}``, or ``{"op", "builder", "message"}`` when it cannot be had here."""
    from deepspeed.accelerator import get_accelerator
    accelerator = get_accelerator()
    builder = accelerator.create_op_builder(builder_name)
    where = "the %s accelerator" % accelerator.device_name()
    if builder is None or type(builder).__name__ == "NotImplementedBuilder":
        return {"op": op, "builder": builder_name,
                "message": "DeepSpeed's %s (%s) does not exist for %s" % (op, builder_name, where)}
    if not builder.is_compatible(verbose=True):  # verbose: its reason goes to error_log (and stderr)
        why = str(getattr(builder, "error_log", None) or "") or "is_compatible() is false"
        message = "DeepSpeed's %s (%s) cannot be built on this node for %s: %s" % (op, builder_name, where, why)
        return {"op": op, "builder": builder_name, "message": message}
    start = time.time()
    say("building %s (%s) for %s: a CPU node takes minutes, once" % (op, builder_name, where))
    try:
        builder.load(verbose=False)
    except Exception as exc:  # pylint: disable=broad-except  # a compiler's error, told with its last lines
        lines = [x for x in str(exc).splitlines() if x.strip()]
        return {"op": op, "builder": builder_name,
                "message": "DeepSpeed's build of %s failed: %s" % (op, " | ".join(lines[-3:]) or type(exc).__name__)}
    seconds = time.time() - start
    say("%s is built (%.0f s)" % (op, seconds))
    return {"op": op, "builder": builder_name, "seconds": round(seconds, 1)}


def prepare(root: str, ops: list, wait: float, grace: float = GRACE) -> dict:
    """The report on ``root`` and ``ops`` (``[(op, builder)]``): stale locks removed, then each op ready, built,
    or a problem."""
    removed, held = clear_stale(root, grace)
    report = {"removed": removed, "held": held, "ready": [], "built": [], "problems": []}
    stamp = stamp_id()
    for op, builder_name in ops:
        busy = wait_free(root, op, wait, grace, report["removed"])
        if busy:
            report["problems"].append({"op": op, "builder": builder_name, "message": (
                "the build of %s by process(es) %s did not end within %d s (its lock %s)" % (
                    op, ", ".join(map(str, busy["pids"])), wait, busy["path"]))})
            continue
        if is_ready(root, op, stamp):
            report["ready"].append(op)
            continue
        with contextlib.redirect_stdout(sys.stderr):  # DeepSpeed logs to stdout: keep it for the report
            result = build(op, builder_name)
        if "message" in result:
            report["problems"].append(result)
            continue
        write_stamp(root, op, stamp)
        report["built"].append(result)
    return report


def parse_op(text: str) -> tuple[str, str]:
    op, eq, builder = text.partition("=")
    if not eq or not op or not builder or "/" in op or op.startswith("."):
        raise argparse.ArgumentTypeError("%r is not NAME=Builder (cpu_adam=CPUAdamBuilder)" % text)
    return op, builder


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="python -m multinode_ds.ops_ready",
                                     description=__doc__.split("\n", maxsplit=1)[0])
    parser.add_argument("--extensions-dir", default=os.environ.get("TORCH_EXTENSIONS_DIR"),
                        help="torch's extensions directory (default: TORCH_EXTENSIONS_DIR)")
    parser.add_argument("--op", action="append", type=parse_op, default=[], metavar="NAME=Builder",
                        help="an op to have built, e.g. cpu_adam=CPUAdamBuilder (repeatable)")
    parser.add_argument("--wait", type=float, default=1800.0, help="seconds to wait for a build another process runs")
    parser.add_argument("--grace", type=float, default=GRACE, help="a lock this recent is never stale")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = parser.parse_args(argv)
    if not args.extensions_dir:
        parser.error("--extensions-dir (or TORCH_EXTENSIONS_DIR) is needed")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    root = args.extensions_dir
    if not os.path.isdir(root) and args.op:
        os.makedirs(root, exist_ok=True)
    report = prepare(root, args.op, args.wait, args.grace)
    if args.json:
        print(json.dumps(report, indent=1, sort_keys=True))
    for problem in report["problems"]:
        say(problem["message"])
    return 1 if report["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
