"""A node's health figures for preflight (role preflight, on every rank node at once; issue 47, point 3)::

    python -m multinode_ds.health --shared /srv/multinode-deepspeed [--seconds 1.0]

Prints one JSON line: ``compute_gflops`` (float32 matmuls of fixed size, with the BLAS threads of every core),
``memory_gbps`` (copies of a 64 MiB array: bytes read and written per second) and ``shared_write_mbps`` (4 MiB
written to the shared directory and synced, then removed).  Each is what the node keeps up over its share of
``--seconds``, stalls included (a CPU quota, a throttled clock, a neighbour's load); the compute figure is the best
of a few windows of it, so that a moment of load on a healthy node does not make it look slow while a quota or a
throttled clock, which slow every window, still do.  Every rank node measures at the same time, so a load they
share slows them alike.  The controller compares the figures across the job's nodes
and with each node's own past (plugins/module_utils/preflight/health.py).  Needs numpy (the stack's venv has it).

Where ``nvidia-smi`` is on the PATH, ``gpu`` carries what it says of each GPU (``query``: its CSV of GPU_FIELDS, with
``fields`` the ones this driver knows) and the kernel log's Xid lines (``xid``), read as they are: the controller
judges them (plugins/module_utils/preflight/gpu_health.py); then each GPU's float16 matmul GFLOP/s (``gpu.gflops``,
with torch) and the slowest of them (``gpu_gflops``), compared across the nodes as the CPU figure is.
"""
import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time

MATMUL = 1024
# The compute figure is the best of this many windows (best_window).
WINDOWS = 4
COPY_BYTES = 64 << 20
WRITE_BYTES = 4 << 20
# What nvidia-smi --query-gpu reports of each GPU's health.  A field this driver does not know is replaced by the
# next name of its tuple (drivers before 535 call the clock event reasons throttle reasons), or left out.
GPU_FIELDS = ("index", "pci.bus_id", "ecc.errors.uncorrected.volatile.total", "retired_pages.pending",
              "remapped_rows.pending", "remapped_rows.failure",
              ("clocks_event_reasons.active", "clocks_throttle_reasons.active"),
              "pcie.link.gen.current", "pcie.link.gen.max", "pcie.link.width.current", "pcie.link.width.max",
              "gpu_recovery_action")
GPU_SECONDS = 30
# Each GPU's compute figure: float16 matmuls of this size (2 x 8192^3 = 1.1 TFLOP: about 2 ms on an H100).
GPU_MATMUL = 8192
XID_LINES = 50
# The kernel log lines kept: Xid events, and the three lines of the driver's "fallen off the bus" (570 and later
# print it without an Xid; the first names the GPU).
KERNEL_KEPT = ("NVRM: Xid", "NVRM: The NVIDIA GPU ", "fallen off the bus")


def sustained(work, seconds, least=3):
    """Seconds per ``work()``, over repetitions for about ``seconds`` (at least ``least`` of them): what the node
    keeps up, stalls included."""
    count, t0 = 0, time.perf_counter()
    while count < least or time.perf_counter() - t0 < seconds:
        work()
        count += 1
    return (time.perf_counter() - t0) / count


def best_window(work, seconds, windows=WINDOWS):
    """Seconds per ``work()`` in the best of ``windows`` windows of ``seconds / windows`` each (at least one
    repetition each): what the node keeps up at its best.  A CPU quota or a throttled clock slows every window
    alike (a quota of a third of a core allows a third of every period); a moment of a neighbour's load on a
    healthy node slows one window, not the best."""
    return min(sustained(work, seconds / windows, least=1) for window in range(windows))


def compute_gflops(seconds):
    import numpy  # pylint: disable=import-outside-toplevel

    a = numpy.random.default_rng(0).random((MATMUL, MATMUL), dtype=numpy.float32)
    b = numpy.random.default_rng(1).random((MATMUL, MATMUL), dtype=numpy.float32)
    numpy.matmul(a, b)
    return 2.0 * MATMUL ** 3 / best_window(lambda: numpy.matmul(a, b), seconds) / 1e9


def memory_gbps(seconds):
    import numpy  # pylint: disable=import-outside-toplevel

    src = numpy.ones(COPY_BYTES // 8, dtype=numpy.float64)
    dst = numpy.empty_like(src)
    numpy.copyto(dst, src)
    return 2.0 * COPY_BYTES / sustained(lambda: numpy.copyto(dst, src), seconds) / 1e9


def shared_write_mbps(directory, seconds):
    """MB/s of a 4 MiB write and fsync to a file of this process's own in ``directory`` (removed after)."""
    path = os.path.join(directory, ".health-%s-%d" % (socket.gethostname(), os.getpid()))
    block = os.urandom(WRITE_BYTES)

    def write():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, block)
            os.fsync(fd)
        finally:
            os.close(fd)

    try:
        return WRITE_BYTES / sustained(write, seconds, least=2) / 1e6
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass


def _output(argv):
    """(exit code, stdout, stderr) of ``argv``, or (None, "", why) when it could not run or did not end in time."""
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=GPU_SECONDS, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return None, "", "%s: %s" % (type(exc).__name__, exc)
    return res.returncode, res.stdout, res.stderr


def gpu_query(smi):
    """``{"fields", "query"}``: nvidia-smi's CSV of the GPU_FIELDS this driver knows, or ``{"error"}``."""
    choices = [list(f) if isinstance(f, tuple) else [f] for f in GPU_FIELDS]
    while True:
        fields = [c[0] for c in choices if c]
        rc, out, err = _output([smi, "--query-gpu=" + ",".join(fields), "--format=csv,noheader"])
        unknown = re.search(r'Field "([^"]+)" is not a valid field', out + err)
        if rc is None or not rc or not unknown or unknown.group(1) not in fields[2:]:
            break
        choices[[c[0] if c else None for c in choices].index(unknown.group(1))].pop(0)
    if rc is None:
        return {"error": "nvidia-smi did not answer within %d s (%s)" % (GPU_SECONDS, err)}
    if rc:
        return {"error": ((out + err).strip() or "exit code %d" % rc)[-300:], "rc": rc}
    return {"fields": fields, "query": out}


def kernel_xids():
    """``{"xid": [the kernel log's last NVRM Xid lines]}``, or ``{"xid_error"}`` when the log cannot be read (dmesg
    is restricted to root and the run account is not in the systemd-journal group)."""
    why = []
    for argv in (["dmesg"], ["journalctl", "-k", "-b", "-q", "--no-pager", "-o", "short-monotonic"]):
        if not shutil.which(argv[0]):
            continue
        rc, out, err = _output(argv)
        if rc == 0 and out.strip():
            return {"xid": [ln.strip() for ln in out.splitlines() if any(k in ln for k in KERNEL_KEPT)][-XID_LINES:]}
        why.append("%s: %s" % (argv[0], (err.strip() or ("no kernel messages" if rc == 0 else "exit code %s" % rc))[-120:]))
    return {"xid_error": "; ".join(why) or "neither dmesg nor journalctl is installed"}


def gpu_readings():
    """What nvidia-smi and the kernel log say of this node's GPUs; None where nvidia-smi is not installed."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    out = gpu_query(smi)
    out.update(kernel_xids())
    return out


def gpu_gflops(seconds, torch=None):
    """Each GPU's float16 matmul GFLOP/s (the best window of its share of ``seconds``), in device order; None where
    torch sees no CUDA device.  Run only where nvidia-smi listed GPUs: importing torch and starting CUDA take
    seconds."""
    if torch is None:
        import torch  # pylint: disable=import-outside-toplevel,redefined-outer-name
    if not torch.cuda.is_available():
        return None
    count = torch.cuda.device_count()
    out = []
    for index in range(count):
        with torch.cuda.device(index):
            a = torch.randn((GPU_MATMUL, GPU_MATMUL), device="cuda", dtype=torch.float16)
            b = torch.randn((GPU_MATMUL, GPU_MATMUL), device="cuda", dtype=torch.float16)

            def work(a=a, b=b):
                torch.matmul(a, b)
                torch.cuda.synchronize()

            work()
            out.append(round(2.0 * GPU_MATMUL ** 3 / best_window(work, seconds / count) / 1e9, 1))
            del a, b
    return out


def measure(shared, seconds):
    """The node's figures."""
    out = {"host": socket.gethostname()}
    for key, fn in (("compute_gflops", lambda: compute_gflops(seconds * 0.5)),
                    ("memory_gbps", lambda: memory_gbps(seconds * 0.25)),
                    ("shared_write_mbps", lambda: shared_write_mbps(shared, seconds * 0.25))):
        try:
            out[key] = round(fn(), 3)
        except (OSError, ImportError, ValueError, MemoryError) as exc:
            out[key] = None
            out.setdefault("errors", {})[key] = "%s: %s" % (type(exc).__name__, exc)
    gpu = gpu_readings()
    if gpu is not None:
        out["gpu"] = gpu
        if gpu.get("query", "").strip():
            try:
                gpu["gflops"] = gpu_gflops(seconds)
            except (ImportError, RuntimeError, AttributeError) as exc:
                gpu["gflops_error"] = ("%s: %s" % (type(exc).__name__, exc))[:300]
            if gpu.get("gflops"):
                out["gpu_gflops"] = min(gpu["gflops"])
    return out


def main(argv=None):
    p = argparse.ArgumentParser(prog="multinode_ds.health", description=__doc__.splitlines()[0])
    p.add_argument("--shared", required=True, help="the shared directory (its write speed is measured)")
    p.add_argument("--seconds", type=float, default=1.0, help="about how long the measurements take together")
    args = p.parse_args(argv)
    print(json.dumps(measure(args.shared, max(0.1, args.seconds))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
