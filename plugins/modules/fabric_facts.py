#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: fabric_facts
short_description: Gather the node's RDMA ports, network interfaces and cluster interface as facts
version_added: "0.2.0"
description:
  - Reads the RDMA devices and ports (InfiniBand or RoCE) from sysfs, the interfaces and their addresses
    from C(ip -j addr) and their speeds from sysfs, and returns them as the C(multinode_fabric) fact.
  - For RoCE ports it finds the RoCE v2 GID index NCCL needs (C(NCCL_IB_GID_INDEX)) - the lowest index whose type is
    C(RoCE v2) and whose GID is set, preferring an IPv4-mapped GID (C(::ffff:a.b.c.d)) over any other (such as the
    C(fe80::) one); for every port it names the network interface behind it.
  - The cluster interface is the one that carries O(address), the node's inventory address; a name is
    resolved on the node first.
  - Without C(ip) (or when C(ip -j addr) fails or prints no JSON) the interfaces come from sysfs alone, without
    addresses, so the cluster interface is unknown, and the module warns, naming the fix (install iproute2).
  - The parsing lives in the collection's C(fabric) module_utils and is unit-tested against the sysfs trees in
    C(tests/fixtures/sysfs/) (each with its C(ip -j addr) output).
  - The C(nccl) role runs it on every node.
options:
  sysfs_root:
    description: Where sysfs is mounted.
    type: path
    default: /sys
  address:
    description:
      - The node's inventory address (an IP, or a name the node resolves), normally
        C(ansible_host) or the inventory name.
      - Without it, C(cluster_interface) is null.
    type: str
  ip_command:
    description: The C(ip) executable of iproute2, as a name looked up in E(PATH) or as an absolute path.
    type: str
    default: ip
author:
  - multinode.deepspeed developers (@multinode)
extends_documentation_fragment:
  - multinode.deepspeed.attributes
  - multinode.deepspeed.attributes.facts
attributes:
  facts:
    description: Returns the C(multinode_fabric) fact.
"""

EXAMPLES = r"""
- name: Gather the fabric of every node
  multinode.deepspeed.fabric_facts:
    address: "{{ ansible_host | default(inventory_hostname) }}"

- name: NCCL settings from the facts
  ansible.builtin.set_fact:
    nccl_socket_ifname: "{{ multinode_fabric.cluster_interface }}"
    nccl_ib_hca: "{{ multinode_fabric.rdma_active_ports | join(',') }}"
"""

RETURN = r"""
ansible_facts:
  description: The facts.
  returned: always
  type: complex
  contains:
    multinode_fabric:
      description: The node's network fabric. The sample is the RoCE fixture (C(tests/fixtures/sysfs/roce), address 10.20.0.21).
      returned: always
      type: complex
      sample:
        rdma:
          - device: mlx5_0
            ports:
              - {port: 1, state: ACTIVE, state_code: 4, phys_state: LinkUp, rate: 200 Gb/sec (4X HDR), rate_gbps: 200.0,
                 link_layer: Ethernet, netdev: ens1f0np0, roce_v2_gid_index: 3}
          - device: mlx5_1
            ports:
              - {port: 1, state: ACTIVE, state_code: 4, phys_state: LinkUp, rate: 200 Gb/sec (4X HDR), rate_gbps: 200.0,
                 link_layer: Ethernet, netdev: ens1f1np1, roce_v2_gid_index: 3}
        rdma_active_ports: ["mlx5_0:1", "mlx5_1:1"]
        interfaces:
          - {name: eno1, operstate: UP, mtu: 1500, mac: "ac:1f:6b:52:0e:94", link_type: ether,
             ipv4: [172.16.5.21/24], ipv6: ["fe80::ae1f:6bff:fe52:e94/64"], speed_mbps: 1000}
          - {name: ens1f0np0, operstate: UP, mtu: 9000, mac: "b8:3f:d2:4a:10:e0", link_type: ether,
             ipv4: [10.20.0.21/24], ipv6: ["fe80::ba3f:d2ff:fe4a:10e0/64"], speed_mbps: 200000}
          - {name: ens1f1np1, operstate: UP, mtu: 9000, mac: "b8:3f:d2:4a:10:e1", link_type: ether,
             ipv4: [10.20.1.21/24], ipv6: ["fe80::ba3f:d2ff:fe4a:10e1/64"], speed_mbps: 200000}
        cluster_interface: ens1f0np0
        cluster_address: 10.20.0.21
        cluster_speed_mbps: 200000
      contains:
        rdma:
          description:
            - The RDMA devices, sorted by name, each a dict with C(device) and C(ports).
            - Each port has C(port) (int), C(state) (such as V(ACTIVE) or V(DOWN)), C(state_code) (int),
              C(phys_state) (such as V(LinkUp)), C(rate) (the sysfs text, for example 400 Gb/sec (4X NDR)),
              C(rate_gbps) (float), C(link_layer) (V(InfiniBand) or V(Ethernet)), C(netdev) (the interface
              behind the port) and C(roce_v2_gid_index) (int, RoCE ports only, else null).
            - Empty on a node without RDMA devices.
          type: list
          elements: dict
          returned: always
        rdma_active_ports:
          description: The ACTIVE ports as C(device:port), the form C(NCCL_IB_HCA) takes.
          type: list
          elements: str
          returned: always
          sample: ["mlx5_0:1", "mlx5_1:1"]
        interfaces:
          description:
            - The network interfaces except loopback, each with C(name), C(operstate), C(mtu), C(mac),
              C(link_type), C(ipv4) and C(ipv6) (lists of address/prefix) and C(speed_mbps) (null when
              sysfs has none, as for virtual or down links).
          type: list
          elements: dict
          returned: always
        cluster_interface:
          description: The interface carrying the cluster address, or null.
          type: str
          returned: always
          sample: eno1
        cluster_address:
          description: The node's address as an IP (resolved from O(address)), or O(address) as given when it does not resolve.
          type: str
          returned: always
          sample: 10.10.0.11
        cluster_speed_mbps:
          description: The speed of the cluster interface in Mb/s, or null.
          type: int
          returned: always
          sample: 10000
"""

import os
import socket

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.common.file import is_executable
from ansible_collections.multinode.deepspeed.plugins.module_utils.provision.fabric import (
    cluster_interface, fabric_facts, interfaces_from_net, is_ip, parse_ip_addr_json, read_net, read_rdma)


def find_binary(module, name):
    if os.path.sep in name:
        return name if os.path.isfile(name) and is_executable(name) else None
    return module.get_bin_path(name, required=False)


def candidates(address):
    """The IPs ``address`` stands for: itself when an IP, else what the node resolves it to."""
    if not address:
        return []
    if is_ip(address):
        return [address]
    try:
        infos = socket.getaddrinfo(address, None)
    except (socket.gaierror, UnicodeError):
        return []
    out = []
    for info in infos:
        ip = info[4][0]
        if ip not in out:
            out.append(ip)
    return out


def main():
    module = AnsibleModule(
        argument_spec=dict(
            sysfs_root=dict(type="path", default="/sys"),
            address=dict(type="str"),
            ip_command=dict(type="str", default="ip"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    root = p["sysfs_root"]
    interfaces = None
    ip = find_binary(module, p["ip_command"])
    if ip is None:
        module.warn("%s not found (iproute2 missing): interfaces come from sysfs without addresses, "
                    "so the cluster interface is unknown. Fix: install iproute2." % p["ip_command"])
    else:
        rc, out, err = module.run_command([ip, "-j", "addr"])
        if rc == 0:
            try:
                interfaces = parse_ip_addr_json(out)
            except ValueError as exc:
                module.warn("%s -j addr printed no JSON (%s): interfaces come from sysfs without addresses."
                            % (ip, exc))
        else:
            module.warn("%s -j addr failed (rc %d: %s): interfaces come from sysfs without addresses. "
                        "Fix: install an iproute2 that supports -j." % (ip, rc, (err or out).strip()))
    if interfaces is None:
        net = read_net(root)
        interfaces = interfaces_from_net(net)
    else:
        net = read_net(root, [i["name"] for i in interfaces])
    ips = candidates(p["address"])
    address = next((a for a in ips if cluster_interface(interfaces, a)), ips[0] if ips else p["address"])
    facts = fabric_facts(read_rdma(root), interfaces, net, address)
    module.exit_json(changed=False, ansible_facts={"multinode_fabric": facts})


if __name__ == "__main__":
    main()
