"""multinode_fabric facts of the sysfs fixtures (real sysfs trees and ip -j addr output), for the unit tests."""
from pathlib import Path

from ansible_collections.multinode.deepspeed.plugins.module_utils.provision import fabric

SYSFS = Path(__file__).resolve().parents[3] / "fixtures" / "sysfs"
# The address each fixture node is known by in its inventory.
ADDRESSES = {"ib-mlx5-4port": "10.10.0.11", "roce": "10.20.0.21", "ethernet-only": "129.254.202.252",
             "ib-down": None}


def facts(name, address=None):
    """The fixture node's multinode_fabric, as the fabric_facts module builds it."""
    root = SYSFS / name
    interfaces = fabric.parse_ip_addr_json((root / "ip-addr.json").read_text())
    net = fabric.read_net(str(root), [i["name"] for i in interfaces])
    if address is None:
        address = ADDRESSES[name]
    if address is None:
        # ib-down: the first IPv4 address of its Ethernet interface.
        address = next(i["ipv4"][0].split("/")[0] for i in interfaces if i["ipv4"] and i["name"] != "lo")
    return fabric.fabric_facts(fabric.read_rdma(str(root)), interfaces, net, address)
