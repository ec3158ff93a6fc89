"""Node-side code of multinode.deepspeed: what runs on the nodes as ranks.

This package never imports Ansible; the collection's Ansible code never imports
torch.  It is copied to every node by the ``multinode.deepspeed.stack`` role
and run as ``python -m multinode_ds.train``.
"""

__version__ = "0.1.0"
