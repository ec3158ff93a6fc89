"""The local cluster and its first site.yml, started in the background as soon as a session with end-to-end tests
is collected (tests/conftest.py): they overlap the unit tests and the quality checks instead of following them.
The fixtures ``cluster`` and ``provisioned`` (tests/e2e/conftest.py) wait for them here; without an early start
they run them themselves, as before.  site.yml builds the controller's wheelhouse: the molecule scenarios that
install from it start once it is done."""
import atexit
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import background
from e2e_nodes import INVENTORY, start_registry

ROOT = Path(__file__).resolve().parents[2]
OUTPUT = ROOT / "tests" / "output"
BIN = Path(sys.executable).parent

_lock = threading.Lock()
_done = threading.Event()
_state = {}


class Result:
    def __init__(self, rc, out, log):
        self.rc, self.out, self.log = rc, out, log

    def recap(self):
        """{host: {ok: n, changed: n, ...}} from the PLAY RECAP."""
        import re  # pylint: disable=import-outside-toplevel
        out = {}
        for m in re.finditer(r"^(\S+)\s+:\s+((?:\w+=\d+\s*)+)$", self.out, re.M):
            out[m.group(1)] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(2))}
        return out

    def tail(self, n=60):
        return "\n".join(self.out.splitlines()[-n:])


def run_playbook(playbook, *extra, inventory=None, name=None, timeout=1800, env_extra=None, cwd=ROOT, cgroup=None):
    """ansible-playbook from the repo root with the repo's ansible.cfg; its output goes to tests/output/<name>-<t>.log
    (``cgroup``: a cpu cgroup of tests/background.py it runs in)."""
    OUTPUT.mkdir(parents=True, exist_ok=True)
    cmd = [str(BIN / "ansible-playbook"), playbook, *extra]
    if inventory:
        cmd += ["-i", str(inventory)]
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_INVENTORY=str(INVENTORY), ANSIBLE_FORCE_COLOR="0",
               PATH=f"{BIN}:{os.environ.get('PATH', '')}", PWD=str(cwd))
    env.update(env_extra or {})
    log = OUTPUT / f"{name or Path(playbook).stem}-{int(time.time())}.log"
    t0 = time.time()
    # stdin: a /dev/null of its own (tests/background.py's run says why).
    proc = subprocess.run(cmd, cwd=cwd, env=env, check=False, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          stdin=subprocess.DEVNULL, text=True, timeout=timeout,
                          preexec_fn=background.joiner(cgroup) if cgroup else None)  # pylint: disable=W1509
    log.write_text(proc.stdout)
    # From a background thread, past pytest's capsys (which takes sys.stdout for the test running meanwhile: a unit
    # test reading a module's JSON from it once read this line instead).
    out = sys.stdout if threading.current_thread() is threading.main_thread() else sys.__stdout__
    print(f"{' '.join(cmd[1:])}: rc={proc.returncode} in {time.time() - t0:.0f}s (log {log})", file=out, flush=True)
    return Result(proc.returncode, proc.stdout, log)


def cluster_up():
    """scripts/localcluster.py up: (rc, output, seconds)."""
    t0 = time.time()
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "localcluster.py"), "up"], cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
    return res.returncode, res.stdout, time.time() - t0


def first_site():
    """The session's first site.yml, with Slurm (the idempotence tests run it again)."""
    return run_playbook("site.yml", "-e", "slurm=true", name="site-first")


def start():
    """Start the cluster and its first site.yml in a thread (once per session)."""
    with _lock:
        if _state.get("started"):
            return
        _state["started"] = True
    threading.Thread(target=_work, name="e2e-early", daemon=True).start()


def _work():
    scenarios = sys.modules.get("scenarios")
    try:
        if scenarios is not None:
            scenarios.wait_for_image()  # the cluster's nodes run the scenarios' image: built once, not twice
        _state["cluster"] = cluster_up()
        if _state["cluster"][0] == 0:
            t0 = time.time()
            _state["site"] = first_site()
            _state["site_seconds"] = time.time() - t0
    except Exception as exc:  # pylint: disable=broad-except
        _state["error"] = "%s: %s" % (type(exc).__name__, exc)
    finally:
        _done.set()
        if scenarios is not None:
            scenarios.wheelhouse_ready.set()


def done_event():
    """Set once the early start ended (the cluster up and its first site.yml run, or failed)."""
    return _done


def started():
    return bool(_state.get("started"))


def timings():
    """The early start's own seconds (the cluster's ``up``, the first ``site.yml``), for the suite's phase record."""
    out = {}
    if _state.get("cluster"):
        out["local cluster up (early)"] = _state["cluster"][2]
    if _state.get("site_seconds") is not None:
        out["first site.yml (early)"] = _state["site_seconds"]
    if _image.get("seconds") is not None:
        out["image.yml (early)"] = _image["seconds"]
    if _image.get("waited") is not None:
        out["image.yml (early) waiting for molecule image"] = _image["waited"]
    return out


# ---------------------------------------------------------------- the stack's image (test_kubernetes_pods)

_image = {}
IMAGE_GROUP = "mnds-image"


def image_start():
    """Once the first site.yml has ended well (the workers' stack chosen, the controller's wheelhouse built): a
    registry on loopback (e2e_nodes.start_registry) and image.yml building the stack's image and pushing it there,
    in the background at the background jobs' CPU weight (tests/background.py), so that test_kubernetes_pods
    finds it built instead of building it in its setup (about two minutes of both cores).  Once per session."""
    with _lock:
        if "done" in _image:
            return
        _image["done"] = threading.Event()
    threading.Thread(target=_image_work, name="e2e-image", daemon=True).start()


def _image_work():
    try:
        _done.wait()
        site = _state.get("site")
        if site is None or site.rc != 0:
            return  # test_kubernetes_pods's fixture builds it (and `provisioned` fails with site.yml's output)
        scenarios = sys.modules.get("scenarios")
        if scenarios is not None:
            # The molecule scenario `image` builds the same image from the same wheelhouse and base: while it runs,
            # this waits, then builds from podman's layer cache (the layers are the scenario's) and pushes.
            t0 = time.time()
            _image["waited"] = time.time() - t0 if scenarios.wait_for_scenario("image") else None
        root = Path(tempfile.mkdtemp(prefix="mnds-registry-"))
        address, proc = start_registry(root)
        atexit.register(_stop_registry, proc)
        _image.update(root=root, address=address, proc=proc, cgroup=background.cgroup(IMAGE_GROUP, background.WEIGHT))
        t0 = time.time()
        _image["result"] = run_playbook("image.yml", "-e", f"image_registry={address}", "-e",
                                        "image_registry_insecure=true", name="image-first", cgroup=_image["cgroup"])
        _image["seconds"] = time.time() - t0
    except Exception as exc:  # pylint: disable=broad-except
        _image["error"] = "%s: %s" % (type(exc).__name__, exc)
    finally:
        _image["done"].set()


def _stop_registry(proc):
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)


def image(timeout=3600):
    """The early image.yml once it ended: {"root", "address", "proc" (the registry), "result" (a Result),
    "seconds"}; None when it was not started or did not run (site.yml failed).  While it still runs, the test that
    waits for it raises it to the normal weight."""
    if "done" not in _image:
        return None
    if not _image["done"].is_set() and _image.get("cgroup") is not None:
        background.weight(_image["cgroup"], 1024)
    _image["done"].wait(timeout)
    if "error" in _image:
        raise RuntimeError("the early image.yml failed to run: %s" % _image["error"])
    return dict(_image) if "result" in _image else None


# ---------------------------------------------------------------- the local Kubernetes build

_k8s = {}
# The build runs in a cpu cgroup of the least weight (tests/background.py): it gets the CPU only when nothing else
# wants it.
IDLE = "mnds-idle"


def k8s_build_start():
    """``scripts/k8s-local build`` in the background, from the start of a session with Kubernetes tests (once per
    session), with the least CPU and I/O priority this machine allows: in a cpu cgroup of weight 2 (the
    containers' cgroup has 1024), at nice 19 and ionice idle.  Its first build compiles the control plane (about
    4 minutes of both cores): so it runs in the time the end-to-end tests leave the cores idle (a third of it and
    more: they wait on runs, faults and timeouts), instead of in test_kubernetes's setup, and takes next to
    nothing from a test that is running or from the first phase, which keeps both cores busy (at nice 19 alone it
    took a third of the CPU there, and the session was no shorter).  With the binaries cached it ends at once."""
    with _lock:
        if "proc" in _k8s:
            return
        OUTPUT.mkdir(parents=True, exist_ok=True)
        log = OUTPUT / f"k8s-build-{int(time.time())}.log"
        out = open(log, "w")  # pylint: disable=consider-using-with
        cgroup = background.cgroup(IDLE, 2)

        argv = ["nice", "-n", "19", "ionice", "-c", "3", str(ROOT / "scripts" / "k8s-local"), "build"]
        _k8s.update(log=log, out=out, t0=time.time(), cgroup=cgroup,
                    proc=subprocess.Popen(  # pylint: disable=R1732,W1509
                        argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                        start_new_session=True, preexec_fn=background.joiner(cgroup)))


def k8s_build(timeout=3600):
    """The early build's result (a CompletedProcess, stdout = its log) once it ended; None when it was not started.
    A test waits on it now: what still runs is raised back to the normal priority first."""
    proc = _k8s.get("proc")
    if proc is None:
        return None
    if proc.poll() is None:
        if _k8s["cgroup"] is not None:
            background.weight(_k8s["cgroup"], 1024)
        try:
            os.setpriority(os.PRIO_PGRP, proc.pid, 0)  # make, go and the compilers that run now
            subprocess.run(["ionice", "-c", "2", "-n", "4", "-P", str(proc.pid)], check=False,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        except OSError:
            pass  # not allowed to raise a priority: it finishes at nice 19
    rc = proc.wait(timeout)
    _k8s["out"].close()
    if _k8s["cgroup"] is not None:
        background.weight(_k8s["cgroup"], 2)
    out = _k8s["log"].read_text()
    return subprocess.CompletedProcess(proc.args, rc, out + "\n(started early, %.0fs before it was needed)\n"
                                       % (time.time() - _k8s["t0"]), "")


def result(what, timeout=3600):
    """The early start's ``cluster`` or ``site`` result once it is there; None when it was not started."""
    if not started():
        return None
    _done.wait(timeout)
    if "error" in _state:
        raise RuntimeError("the early start of the local cluster failed: %s" % _state["error"])
    return _state.get(what)
