"""Build DeepSpeed's ops for this node's accelerator into TORCH_EXTENSIONS_DIR (role stack, the stack's image).

    python -m multinode_ds.build_ops ShareMemCommBuilder [CPUAdamBuilder ...]

First removes the stale build locks there (``multinode_ds.ops_ready.clear_stale``: a build killed half-way leaves
torch's lock, and every later load of that op waits for it forever).  Then loads every named builder the accelerator
has (load() JIT-builds an op once; later loads find it current) and prints ``BUILT`` when an .so changed, else
``CURRENT``, then the .so files.  With STACK_OPS_STAMP set, the stamps
of earlier builds in TORCH_EXTENSIONS_DIR are replaced by that one (the next site.yml finds it and imports
nothing).
"""
import glob
import os
import sys

from multinode_ds.ops_ready import clear_stale


def main(argv=None):
    names = list(sys.argv[1:] if argv is None else argv)
    from deepspeed.accelerator import get_accelerator  # pylint: disable=import-outside-toplevel

    root = os.environ["TORCH_EXTENSIONS_DIR"]
    clear_stale(root)
    before = {p: os.path.getmtime(p) for p in glob.glob(root + "/*/*.so")}
    for name in names:
        builder = get_accelerator().create_op_builder(name)
        # The CPU accelerator answers an op it lacks with its NotImplementedBuilder, whose load() raises.
        if builder is None or type(builder).__name__ == "NotImplementedBuilder":
            print("skipped %s: the %s accelerator has no such op" % (name, get_accelerator().device_name()),
                  file=sys.stderr)
        elif builder.is_compatible(verbose=False):
            builder.load(verbose=False)
    after = {p: os.path.getmtime(p) for p in glob.glob(root + "/*/*.so")}
    stamp = os.environ.get("STACK_OPS_STAMP")
    if stamp:
        for old in glob.glob(root + "/.current-*"):
            os.unlink(old)
        with open(stamp, "w"):
            pass
    print("BUILT" if after != before else "CURRENT", *sorted(after))
    return 0


if __name__ == "__main__":
    sys.exit(main())
