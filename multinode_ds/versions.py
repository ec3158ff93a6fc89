"""``python -m multinode_ds.versions``: one JSON line of the versions this venv really runs - Python, torch,
DeepSpeed, transformers, CUDA and NCCL as torch was built with them, and the collection's trainer (role stack's
``versions.yml``: site.yml's and preflight's version tables)."""
import json
import platform
import sys


def versions():
    import deepspeed  # pylint: disable=import-outside-toplevel
    import torch  # pylint: disable=import-outside-toplevel
    import transformers  # pylint: disable=import-outside-toplevel

    import multinode_ds  # pylint: disable=import-outside-toplevel

    try:
        nccl = ".".join(map(str, torch.cuda.nccl.version())) if torch.version.cuda else "none"
    except Exception:  # pylint: disable=broad-except  # a torch built without NCCL
        nccl = "none"
    return {"python": platform.python_version(), "torch": torch.__version__, "deepspeed": deepspeed.__version__,
            "transformers": transformers.__version__, "cuda": torch.version.cuda or "none", "nccl": nccl,
            "trainer": multinode_ds.__version__}


def main():
    print(json.dumps(versions()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
