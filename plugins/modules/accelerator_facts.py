#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: accelerator_facts
short_description: Gather the node's NVIDIA GPUs, driver and CUDA version as facts
version_added: "0.2.0"
description:
  - Runs C(nvidia-smi --query-gpu=index,uuid,name,memory.total,compute_cap,driver_version,pci.bus_id
    --format=csv,noheader,nounits) and plain C(nvidia-smi), and returns the GPUs, the driver version and
    the highest CUDA version the driver supports as the C(multinode_accelerators) fact.
  - Never fails because of the node's GPUs. A node without C(nvidia-smi) (a CPU node) gets status C(absent),
    a driver that sees no GPU gets C(no_devices), and C(nvidia-smi) failing (for example rc 9 when it
    cannot talk to the driver) gets C(driver_error) with the tool's own first line and a fix.
  - The parsing lives in the collection's C(accelerator) module_utils and is unit-tested against
    captured C(nvidia-smi) output (C(tests/fixtures/nvidia-smi/)).
  - C(site.yml) runs it on every node before the stack is chosen. C(train.yml) and C(preflight.yml) get the same fact
    from M(multinode.deepspeed.node_facts), which reads the GPUs the same way.
extends_documentation_fragment:
  - multinode.deepspeed.nvidia_smi
  - multinode.deepspeed.attributes
  - multinode.deepspeed.attributes.facts
author:
  - multinode.deepspeed developers (@multinode)
attributes:
  facts:
    description: Returns the C(multinode_accelerators) fact.
"""

EXAMPLES = r"""
- name: Gather the GPUs of every node
  multinode.deepspeed.accelerator_facts:

- name: Ranks per node from the GPU count (CPU nodes get none)
  ansible.builtin.set_fact:
    deepspeed_gpu_count: "{{ multinode_accelerators.count }}"

- name: Stop on a broken driver, naming the fix
  ansible.builtin.assert:
    that: multinode_accelerators.status != 'driver_error'
    fail_msg: "{{ multinode_accelerators.message }}"

- name: With nvidia-smi outside PATH
  multinode.deepspeed.accelerator_facts:
    nvidia_smi: /usr/local/nvidia/bin/nvidia-smi
"""

RETURN = r"""
ansible_facts:
  description: The facts.
  returned: always
  type: complex
  contains:
    multinode_accelerators:
      description: The node's NVIDIA accelerators; every key is always present.
      returned: always
      type: complex
      sample:
        status: ok
        message: "2 GPU(s): NVIDIA A30; 24576 MiB min, compute capability 8.0 min; driver 535.183.01, CUDA 12.2."
        count: 2
        driver_version: "535.183.01"
        cuda_driver_version: "12.2"
        gpus:
          - {index: 0, uuid: GPU-5f3b2c1e-7a94-3d0e-b8c2-91e4d6a0f217, name: NVIDIA A30, memory_mib: 24576,
             compute_capability: "8.0", driver_version: "535.183.01", pci_bus_id: "00000000:17:00.0"}
          - {index: 1, uuid: GPU-c08d4e72-1b65-9f3a-4e27-d3a95b18c6e0, name: NVIDIA A30, memory_mib: 24576,
             compute_capability: "8.0", driver_version: "535.183.01", pci_bus_id: "00000000:CA:00.0"}
        names: [NVIDIA A30]
        memory_mib_min: 24576
        compute_capability_min: "8.0"
      contains:
        status:
          description:
            - V(ok) (the query listed GPUs), V(absent) (no nvidia-smi, a CPU node), V(no_devices) (the driver sees no
              GPU - rc 6, C(No devices were found), or empty output) or V(driver_error) (nvidia-smi failed otherwise).
          type: str
          returned: always
          sample: ok
        message:
          description:
            - 'One line for humans, for example
              V(1 GPU(s\): NVIDIA H100 80GB HBM3; 81559 MiB min, compute capability 9.0 min; driver 580.159.04, CUDA 13.0.)'
            - For V(no_devices), what to check (the GPUs passed through to the node, not bound to another driver such
              as vfio-pci).
            - 'For V(driver_error), V(nvidia-smi failed (rc <rc\): <its first line> Fix: ...), the fix depending on the
              text - a driver/library version mismatch (reboot, or reload the modules), C(is not a valid field) (a
              driver older than 510), otherwise a check that the kernel driver is loaded.'
          type: str
          returned: always
        count:
          description: Number of GPUs (0 unless V(ok)).
          type: int
          returned: always
          sample: 8
        driver_version:
          description: The NVIDIA driver version (from the query, else the banner), or null.
          type: str
          returned: always
          sample: "550.90.07"
        cuda_driver_version:
          description:
            - The highest CUDA version the driver supports (the banner's C(CUDA Version), not an installed toolkit), or
              null.
          type: str
          returned: always
          sample: "12.4"
        gpus:
          description:
            - One dict per GPU with C(index) (int), C(uuid), C(name), C(memory_mib) (int),
              C(compute_capability) (such as V(9.0)), C(driver_version) and C(pci_bus_id); fields that
              nvidia-smi reports as C([N/A]) are null.
          type: list
          elements: dict
          returned: always
        names:
          description: The distinct GPU names, sorted.
          type: list
          elements: str
          returned: always
          sample: ["NVIDIA H100 80GB HBM3"]
        memory_mib_min:
          description: The smallest GPU memory in MiB, or null without GPUs.
          type: int
          returned: always
          sample: 81559
        compute_capability_min:
          description: The lowest compute capability, or null without GPUs.
          type: str
          returned: always
          sample: "9.0"
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.multinode.deepspeed.plugins.module_utils.provision.accelerator import read_accelerators


def main():
    module = AnsibleModule(
        argument_spec=dict(
            nvidia_smi=dict(type="str", default="nvidia-smi"),
        ),
        supports_check_mode=True,
    )
    facts = read_accelerators(module.params["nvidia_smi"], module.get_bin_path, module.run_command)
    module.exit_json(changed=False, ansible_facts={"multinode_accelerators": facts})


if __name__ == "__main__":
    main()
