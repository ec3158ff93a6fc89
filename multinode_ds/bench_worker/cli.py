"""The command line: the node process, or with the hidden ``--slot`` one of its slots."""
from __future__ import annotations

import argparse
import socket
import sys

from .node import node_main
from .slot import slot_main
from .work import PHASES


def parse_args(argv=None):
    protocol = sys.modules[__package__].__doc__  # the package's docstring: what this is, then the protocol
    p = argparse.ArgumentParser(
        prog="python -m multinode_ds.bench_worker", description=protocol.splitlines()[0],
        epilog="The protocol (work file, ready/go files, progress, results, exit codes) is described in the "
               "module's docstring: python -m pydoc multinode_ds.bench_worker")
    p.add_argument("--work", required=True, help="the work file the driver wrote (JSON, on shared storage)")
    p.add_argument("--host", default=socket.gethostname(),
                   help="this node's name in the work file's phases (default: the hostname)")
    p.add_argument("--phase", required=True, choices=PHASES,
                   help="single: one slot runs every sample (the baseline); parallel: every slot runs its share")
    p.add_argument("--watch-stdin", action="store_true",
                   help="stop the slots and exit 143 when stdin reaches its end (the driver's ssh went away)")
    p.add_argument("--slot", type=int, default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.slot is not None:
        return slot_main(args)
    return node_main(args)
