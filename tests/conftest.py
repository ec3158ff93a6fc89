"""Make the collection importable as ansible_collections.multinode.deepspeed in place."""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COLLECTIONS = ROOT / ".collections"
link = COLLECTIONS / "ansible_collections" / "multinode" / "deepspeed"
if not link.exists():
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to("../../..")
for p in (str(COLLECTIONS), str(ROOT)):
    if p not in sys.path:
        sys.path.insert(0, p)

# ansible-core 2.19 replaces sys.intern when its module_utils are imported, and
# torch._dynamo refuses to load after that.  The node package's tests import
# torch in the same process as the module tests import ansible: load torch's
# pieces first.
try:
    import torch._dynamo  # noqa: F401  # pylint: disable=unused-import
except ImportError:
    pass
