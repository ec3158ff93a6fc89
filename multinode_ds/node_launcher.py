"""DeepSpeed's per-node launcher, forked from the node's warm process.

``python -u -m multinode_ds.node_launcher ARGS`` (the run's backend starts it in place of ``python -u -m
deepspeed.launcher.launch ARGS`` when the run's ranks start warm: ``-e warm_start``, pdsh and ssh-free)

A cold ``launch.py`` is a Python start that imports DeepSpeed and torch before it starts the node's ranks: about a
CPU-second per node here, several on a node whose disk is busy.  The node's warm process (multinode_ds.warm) has
imported them already; this module hands it ``python -u -m deepspeed.launcher.launch ARGS`` with this process's
environment, working directory and standard streams, and waits for it as ``multinode_ds.rank`` waits for a rank:
signals passed on, its exit status as its own.  The fork then starts the node's ranks (each ``multinode_ds.rank``,
forked from the same warm process in turn).  When there is no warm process for this environment, or it refuses,
this process becomes the cold launcher and says why on standard error.
"""
from __future__ import annotations

import os
import sys

LAUNCHER = "deepspeed.launcher.launch"


def launcher_argv(python: str, args) -> list:
    """The cold launcher's command line, as a backend without warm ranks starts it."""
    return [python, "-u", "-m", LAUNCHER] + list(args)


def main(argv=None) -> int:
    argv = launcher_argv(sys.executable, sys.argv[1:] if argv is None else argv)
    # Only the warm module's own imports before the hand-over: nothing heavy in this process.
    from multinode_ds import warm  # pylint: disable=import-outside-toplevel
    try:
        warm.end_like(warm.run(argv, dict(os.environ), os.getcwd()))
    except warm.Refused as exc:
        sys.stderr.write("multinode_ds.node_launcher: DeepSpeed's launcher starts cold: %s\n" % exc)
        sys.stderr.flush()
    os.execv(argv[0], argv)
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main())
