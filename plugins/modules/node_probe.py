#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: node_probe
short_description: Read what a node needs to join a job - names, disks, memlock, clock, SSH
version_added: "0.3.0"
description:
  - Resolves the cluster's node names the way a program on the node does (getaddrinfo, in its order).
  - Reads the free space of directories (statvfs), and the memlock limit of the account the module runs as.
  - Tries C(ssh -o BatchMode=yes) to each of O(ssh_targets) at once, as the account the module runs as
    (become the launching user), with the node's own ssh configuration and known_hosts.
  - Reads the node's clock last. The action plugin of the same name records the controller's clock just
    before and after the call, so that the clock skew has a bound that does not depend on the latency.
  - Used by C(playbooks/preflight.yml); reads only, changes nothing.
options:
  names:
    description: Host names to resolve.
    type: list
    elements: str
    default: []
  paths:
    description: Directories whose free space to read.
    type: list
    elements: path
    default: []
  ssh_targets:
    description: Hosts to connect to with ssh (running C(ulimit -l) there, the memlock limit a login gets).
    type: list
    elements: str
    default: []
  ssh_timeout:
    description: Seconds each ssh connection may take to connect.
    type: int
    default: 5
author:
  - multinode.deepspeed developers (@multinode)
attributes:
  check_mode:
    support: full
    description: Reads only.
  diff_mode:
    support: none
    description: Shows no diff.
"""

EXAMPLES = r"""
- name: Probe the node
  multinode.deepspeed.node_probe:
    names: "{{ groups['workers'] }}"
    paths: [/srv/multinode-deepspeed, /tmp]
  register: probe

- name: Try SSH from the coordinator to every worker as the launching user
  multinode.deepspeed.node_probe:
    ssh_targets: "{{ groups['workers'] }}"
  become: true
  become_user: deepspeed
"""

RETURN = r"""
hostname:
  description: The node's host name.
  returned: always
  type: str
user:
  description: The account the probe ran as.
  returned: always
  type: str
time:
  description: The node's clock (seconds since the epoch), read at the end of the probe.
  returned: always
  type: float
controller_before:
  description: The controller's clock just before the call (added by the action plugin).
  returned: always
  type: float
controller_after:
  description: The controller's clock just after the call (added by the action plugin).
  returned: always
  type: float
resolved:
  description: Per name, C(addresses) in getaddrinfo's order, or C(error).
  returned: always
  type: dict
  sample: {"worker1": {"addresses": ["10.89.0.3"]}, "worker9": {"error": "Name or service not known"}}
disk:
  description: Per path, C(free_bytes) and C(total_bytes), or C(error).
  returned: always
  type: dict
memlock:
  description: The memlock limit of this process in KiB, C(soft) and C(hard) (-1 is unlimited).
  returned: always
  type: dict
ssh:
  description: Per target, C(rc), C(stdout) (the target's C(ulimit -l)), C(stderr) and C(seconds).
  returned: always
  type: dict
"""

import getpass
import os
import resource
import socket
import subprocess
import threading
import time

from ansible.module_utils.basic import AnsibleModule


def resolve(name):
    try:
        infos = socket.getaddrinfo(name, None, socket.AF_UNSPEC, socket.SOCK_STREAM)
    except socket.gaierror as exc:
        return {"error": exc.strerror or str(exc)}
    addrs = []
    for info in infos:
        addr = info[4][0]
        if addr not in addrs:
            addrs.append(addr)
    return {"addresses": addrs}


def disk(path):
    try:
        st = os.statvfs(path)
    except OSError as exc:
        return {"error": "%s: %s" % (path, exc.strerror)}
    return {"free_bytes": st.f_bavail * st.f_frsize, "total_bytes": st.f_blocks * st.f_frsize}


def kib(limit):
    return -1 if limit == resource.RLIM_INFINITY else int(limit) // 1024


def ssh_one(target, timeout, out):
    cmd = ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=%d" % timeout, "-o", "LogLevel=ERROR",
           target, "ulimit -l"]
    start = time.time()
    try:
        proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout + 10,
                              check=False)
        out[target] = {"rc": proc.returncode, "stdout": proc.stdout.strip(), "stderr": proc.stderr.strip()}
    except subprocess.TimeoutExpired:
        out[target] = {"rc": 124, "stdout": "", "stderr": "ssh %s: timed out after %d s" % (target, timeout + 10)}
    except OSError as exc:
        out[target] = {"rc": 127, "stdout": "", "stderr": "cannot run ssh: %s" % exc}
    out[target]["seconds"] = round(time.time() - start, 3)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            names=dict(type="list", elements="str", default=[]),
            paths=dict(type="list", elements="path", default=[]),
            ssh_targets=dict(type="list", elements="str", default=[]),
            ssh_timeout=dict(type="int", default=5),
        ),
        supports_check_mode=True,
    )
    p = module.params
    ssh = {}
    threads = [threading.Thread(target=ssh_one, args=(t, p["ssh_timeout"], ssh)) for t in p["ssh_targets"]]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    result = dict(
        changed=False,
        hostname=socket.gethostname(),
        user=getpass.getuser(),
        resolved=dict((n, resolve(n)) for n in p["names"]),
        disk=dict((d, disk(d)) for d in p["paths"]),
        memlock={"soft": kib(soft), "hard": kib(hard)},
        ssh=ssh,
    )
    result["time"] = time.time()
    module.exit_json(**result)


if __name__ == "__main__":
    main()
