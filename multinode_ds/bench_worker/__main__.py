"""``python -m multinode_ds.bench_worker``: the node process, or one of its slots (see ``cli``)."""
import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
