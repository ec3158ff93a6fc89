"""One rank of the Slurm backend, under srun: DeepSpeed's variables from srun's, then the run's program.

``python -m multinode_ds.slurm_rank --run-dir D --master-addr A --master-port P``
    The variables DeepSpeed's own launcher gives a rank (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_SIZE, CROSS_RANK,
    CROSS_SIZE, MASTER_ADDR, MASTER_PORT) from srun's (SLURM_PROCID, SLURM_LOCALID, ...), then it becomes the run's
    program as ``multinode_ds.rank`` does (``D/program.json``, ``D/rank.env``, the run's secrets):
    ``python -u [-m] SCRIPT --local_rank=N ARGS``.

It runs once per rank before the program's own imports, so it loads only ``multinode_ds.rank`` (json, os, sys).
"""
from __future__ import annotations

import os
import sys

from multinode_ds.rank import become, options

TASKS_FILE = "slurm/tasks"
OPTIONS = {"--run-dir": "run_dir", "--master-addr": "master_addr", "--master-port": "master_port"}


def local_size(tasks_per_node: str, node_id: int) -> int:
    """SLURM_TASKS_PER_NODE ('2(x3),1') -> the task count on node ``node_id`` of the step."""
    counts = []
    for part in tasks_per_node.split(","):
        if "(x" in part:
            n, times = part.rstrip(")").split("(x")
            counts += [int(n)] * int(times)
        elif part.strip():
            counts.append(int(part))
    return counts[node_id] if node_id < len(counts) else 1


def rank_env(slurm: dict, master_addr: str, master_port: str, tasks=None) -> dict:
    """What DeepSpeed's launcher gives a rank, from srun's variables.  With ``tasks`` (the run's tasks file: the
    node of each rank, in the plan's order), the node's position and rank count come from it: srun's
    SLURM_NODEID follows slurm.conf's order of the nodes, not the plan's."""
    rank = int(slurm["SLURM_PROCID"])
    node_id = int(slurm.get("SLURM_NODEID", "0"))
    local = str(local_size(slurm.get("SLURM_STEP_TASKS_PER_NODE") or slurm.get("SLURM_TASKS_PER_NODE") or "1",
                           node_id))
    cross, cross_size = str(node_id), slurm.get("SLURM_STEP_NUM_NODES") or slurm.get("SLURM_NNODES", "1")
    if tasks and rank < len(tasks):
        nodes = list(dict.fromkeys(tasks))
        cross, cross_size, local = str(nodes.index(tasks[rank])), str(len(nodes)), str(tasks.count(tasks[rank]))
    return {
        "RANK": slurm["SLURM_PROCID"], "WORLD_SIZE": slurm["SLURM_NTASKS"], "LOCAL_RANK": slurm["SLURM_LOCALID"],
        "LOCAL_SIZE": local, "CROSS_RANK": cross, "CROSS_SIZE": cross_size,
        "MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port),
    }


def parse_args(argv=None) -> dict:
    """The three options (``--opt value`` or ``--opt=value``), all required; anything else goes to argparse, for
    its usage and error message."""
    argv = list(sys.argv[1:] if argv is None else argv)
    out = options(argv, OPTIONS)
    if out is not None and len(out) == len(OPTIONS):
        return out
    # Usage and errors only: a good command line never loads argparse.
    import argparse  # pylint: disable=import-outside-toplevel
    p = argparse.ArgumentParser(prog="python -m multinode_ds.slurm_rank", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    for opt in OPTIONS:
        p.add_argument(opt, required=True)
    return vars(p.parse_args(argv))


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        with open(os.path.join(args["run_dir"], TASKS_FILE)) as fh:
            tasks = fh.read().split()
    except OSError:
        tasks = None
    become(args["run_dir"], os.environ["SLURM_LOCALID"],
           rank_env(os.environ, args["master_addr"], args["master_port"], tasks))
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main())
