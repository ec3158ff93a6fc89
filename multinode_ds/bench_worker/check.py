"""``python -m multinode_ds.bench_worker.check MODEL MODEL_PATH PROMPTS_FILE``: the benchmark's settings that the
coordinator can check before anything changes on the nodes (role benchmark): without MODEL_PATH, MODEL must be a
registry model that runs with random weights; a PROMPTS_FILE given must be a readable file here.  Exits 0, or
with the reason and the fix on stderr."""
import os
import sys

from .engines import registry_spec
from .protocol import BenchError


def check(model, model_path, prompts):
    """Raise BenchError naming what is wrong with the settings."""
    if not model_path:
        registry_spec(model)
    if prompts and not (os.path.isfile(prompts) and os.access(prompts, os.R_OK)):
        raise BenchError("prompts_file=%s is not a readable file on this coordinator" % prompts)


def main(argv=None):
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 3:
        sys.stderr.write("usage: python -m multinode_ds.bench_worker.check MODEL MODEL_PATH PROMPTS_FILE\n")
        return 2
    try:
        check(*args)
    except BenchError as exc:
        sys.stderr.write("%s\n" % exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
