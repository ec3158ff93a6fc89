"""All-reduce bandwidth across the job's nodes, in the style of nccl-tests' all_reduce_perf.

Started by preflight.yml on every rank node at once (no SSH between nodes needed)::

    python -m multinode_ds.allreduce_perf --master-addr 10.0.0.1 --master-port 29500 \
        --world-size 8 --first-rank 4 --nproc 4 --backend nccl --out /shared/runs/x/preflight/ib.json

Each node starts ``--nproc`` local ranks (global ranks ``first-rank`` .. ``first-rank+nproc-1``);
they join one process group over ``tcp://master-addr:master-port`` (the job's master port), check
that an all-reduce returns the right sum, then time all-reduces from ``--min-bytes`` to
``--max-bytes`` (doubling, float32).  Global rank 0 writes the raw timings as JSON (the slowest
rank's mean time per size); the bandwidth arithmetic and the verdict are done on the controller
(plugins/module_utils/preflight/bandwidth.py).  Exit status 0 only when every local rank finished.
"""

import argparse
import datetime
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time

from multinode_ds import exit_after_work

# Bytes moved per size at most (iterations = this / size, within [MIN_ITERS, MAX_ITERS]).
BYTES_PER_SIZE = 64 << 20  # bytes timed per message size (3 iterations at least)
MIN_ITERS = 3
MAX_ITERS = 50
WARMUP = 2
RESULT_PREFIX = "ALLREDUCE_RESULT "


def iterations(nbytes):
    """Timed iterations for one message size: more for small messages, at least MIN_ITERS."""
    return max(MIN_ITERS, min(MAX_ITERS, BYTES_PER_SIZE // max(nbytes, 1)))


def sizes(min_bytes, max_bytes):
    """Message sizes in bytes: min_bytes doubling up to max_bytes (both multiples of 4)."""
    out, size = [], max(4, min_bytes - min_bytes % 4)
    while size <= max_bytes:
        out.append(size)
        size *= 2
    if out and out[-1] != max_bytes and max_bytes % 4 == 0:
        out.append(max_bytes)
    return out


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="multinode_ds.allreduce_perf", description=__doc__.splitlines()[0])
    p.add_argument("--master-addr", required=True)
    p.add_argument("--master-port", type=int, required=True)
    p.add_argument("--world-size", type=int, required=True, help="ranks in the job (all nodes)")
    p.add_argument("--first-rank", type=int, required=True, help="global rank of this node's first rank")
    p.add_argument("--nproc", type=int, default=1, help="ranks on this node")
    p.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    p.add_argument("--min-bytes", type=int, default=4096)
    p.add_argument("--max-bytes", type=int, default=64 << 20)
    p.add_argument("--timeout", type=float, default=120.0, help="seconds for the whole test on this node")
    p.add_argument("--node", default=socket.gethostname(),
                   help="this node's name as the user knows it (its inventory name; default the hostname)")
    p.add_argument("--init-timeout", type=float, default=30.0, help="seconds to wait for every rank to join")
    p.add_argument("--out", help="JSON file global rank 0 writes (its directory is created)")
    p.add_argument("--label", default="", help="a name for this test in the JSON (the NCCL profile)")
    p.add_argument("--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def rank_device(args):
    """This rank's global rank and its device: the local GPU under nccl, the CPU under gloo."""
    import torch

    rank = args.first_rank + args.local_rank
    device = torch.device("cpu")
    if args.backend == "nccl":
        torch.cuda.set_device(args.local_rank)
        device = torch.device("cuda", args.local_rank)
    return rank, device


def sync(device):
    """Wait for the device's queued work (a GPU's all-reduces run asynchronously); nothing to wait for on CPU."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def expected_sum(world):
    """What the probe's elements add up to when every rank contributes rank+1: 1 + 2 + ... + world."""
    return world * (world + 1) / 2.0


def check_sum(rank, world, device):
    """Correctness first: an all-reduce of every rank's rank+1 must give the same right sum everywhere."""
    import torch
    import torch.distributed as dist

    probe = torch.full((1024,), float(rank + 1), dtype=torch.float32, device=device)
    dist.all_reduce(probe)
    sync(device)
    expected = expected_sum(world)
    if not bool(torch.all(probe == expected)):
        raise SystemExit("rank %d: all_reduce returned %s, expected %s on every element"
                         % (rank, probe[:4].tolist(), expected))


def time_size(nbytes, device):
    """The row of one message size: its mean time per all-reduce on the slowest rank (the collective's time)."""
    import torch
    import torch.distributed as dist

    buf = torch.zeros(nbytes // 4, dtype=torch.float32, device=device)
    iters = iterations(nbytes)
    for warm in range(WARMUP):
        dist.all_reduce(buf)
    sync(device)
    dist.barrier()
    start = time.perf_counter()
    for timed in range(iters):
        dist.all_reduce(buf)
    sync(device)
    mean = (time.perf_counter() - start) / iters
    # The slowest rank's time is the collective's time.
    slowest = torch.tensor([mean], dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return {"bytes": nbytes, "count": nbytes // 4, "dtype": "float32", "iters": iters,
            "seconds": float(slowest.item())}


def result_doc(args, hosts, device, init_s, results):
    """The JSON global rank 0 writes: what ran where (every rank's host), the versions, the NCCL/GLOO settings, the timings."""
    import torch

    nccl = None
    if args.backend == "nccl":
        nccl = ".".join(map(str, torch.cuda.nccl.version()))
    return {
        "label": args.label, "backend": args.backend, "world_size": len(hosts),
        "nodes": len(set(hosts)), "rank_hosts": hosts, "device": str(device.type),
        "torch": torch.__version__, "nccl": nccl, "python": platform.python_version(),
        "init_seconds": round(init_s, 3), "op": "all_reduce", "reduce_op": "sum",
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(("NCCL_", "GLOO_"))},
        "results": results,
    }


def write_result(path, doc):
    """``--out``: the JSON, written whole or not at all (its directory is created)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(doc, fh, indent=2)
        fh.write("\n")
    os.replace(tmp, path)


def rank_main(args):
    """One rank: join the group, check the sum, time every size; global rank 0 reports the result."""
    import torch.distributed as dist

    rank, device = rank_device(args)
    t0 = time.time()
    dist.init_process_group(args.backend, init_method="tcp://%s:%d" % (args.master_addr, args.master_port),
                            rank=rank, world_size=args.world_size,
                            timeout=datetime.timedelta(seconds=args.init_timeout))
    world = dist.get_world_size()
    check_sum(rank, world, device)
    init_s = time.time() - t0

    results = []
    for nbytes in sizes(args.min_bytes, args.max_bytes):
        row = time_size(nbytes, device)
        results.append(row)
        if rank == 0:
            print("%12d bytes  %3d iters  %10.1f us" % (nbytes, row["iters"], row["seconds"] * 1e6), flush=True)

    # Every rank's host, so the JSON shows where the ranks really ran.
    hosts = [None] * world
    dist.all_gather_object(hosts, args.node)
    if rank == 0:
        doc = result_doc(args, hosts, device, init_s, results)
        if args.out:
            write_result(args.out, doc)
        # The last line of the master node's output: Ansible reads the result from it (no second round trip).
        print(RESULT_PREFIX + json.dumps(doc, sort_keys=True), flush=True)
    dist.destroy_process_group()


def node_main(args, argv):
    """Start this node's ranks and wait for them; stop them all when one fails or time runs out."""
    procs, errs = [], []
    for local in range(args.nproc):
        cmd = [sys.executable, "-m", "multinode_ds.allreduce_perf"] + list(argv) + ["--local-rank", str(local)]
        # stderr to a file, never a pipe nobody reads while the ranks run (NCCL_DEBUG=INFO would fill it).
        err = tempfile.TemporaryFile(mode="w+")
        errs.append(err)
        procs.append(subprocess.Popen(cmd, stdout=None if local == 0 else subprocess.DEVNULL, stderr=err, text=True))
    deadline = time.time() + args.timeout
    failed = None
    while time.time() < deadline:
        codes = [p.poll() for p in procs]
        bad = [i for i, c in enumerate(codes) if c not in (None, 0)]
        if bad:
            failed = bad[0]
            break
        if all(c == 0 for c in codes):
            break
        time.sleep(0.2)
    else:
        failed = "timeout"
    for p in procs:
        if p.poll() is None:
            p.kill()
    errors = []
    for i, p in enumerate(procs):
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        errs[i].seek(0)
        err = errs[i].read()
        errs[i].close()
        if p.returncode not in (0, None) and err:
            errors.append("local rank %d (global %d), exit %s:\n%s"
                          % (i, args.first_rank + i, p.returncode, "\n".join(err.strip().splitlines()[-15:])))
    if failed == "timeout":
        sys.stderr.write("allreduce_perf on %s: not finished after %.0f s (a rank did not join or hangs)\n"
                         % (args.node, args.timeout))
    for e in errors:
        sys.stderr.write(e + "\n")
    if failed is not None:
        return 1
    return 0


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.local_rank is not None:
        rank_main(args)
        return 0
    return node_main(args, argv)


if __name__ == "__main__":
    exit_after_work(main())
