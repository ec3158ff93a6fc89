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
  - Tests the master port in the same call - listening on the master (O(listen_port)) while the rank nodes
    connect to it (O(connect_host), O(connect_port)) - so one task on every node proves the port free and reachable.
  - Reads the node's clock first and says how long it ran after that (C(elapsed)). The action plugin of the same
    name records the controller's clock just before and after the call, so that the clock skew has a bound that
    does not depend on the latency or on the waits.
  - Used by the C(preflight) role (C(docs/preflight.md)), which runs it once on every node of the job, all nodes at
    once; reads only, changes nothing.
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
  listen_port:
    description:
      - A TCP port to listen on while the other nodes connect to it (the master port, on the master), run in the
        same task as O(connect_port) on the other nodes. C(listen.rc) is 1 when the port is not free.
      - It binds with C(SO_REUSEADDR), as a rendezvous does. On the master, the listener is bound (or refused) before
        the node's own connection tries it.
      - The listener lets each client close first, so no TIME_WAIT is left on the port.
    type: int
  listen_expect:
    description: Stop listening once this many connections came.
    type: int
    default: 1
  listen_seconds:
    description: Listen at most this long.
    type: int
    default: 20
  connect_host:
    description: Connect to O(connect_port) on this host (retried until it answers or O(connect_seconds) pass).
    type: str
  connect_port:
    description: The port to connect to on O(connect_host); required with it.
    type: int
  connect_seconds:
    description: Try to connect for at most this long.
    type: int
    default: 15
author:
  - multinode.deepspeed developers (@multinode)
extends_documentation_fragment:
  - multinode.deepspeed.attributes
  - multinode.deepspeed.attributes.read_only
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

- name: The master port, free on the master and reachable from every rank node
  multinode.deepspeed.node_probe:
    listen_port: "{{ train_job.master_port if inventory_hostname == train_job.master else omit }}"
    listen_expect: "{{ train_job.rank_hosts | length }}"
    connect_host: "{{ train_job.master_addr if inventory_hostname in train_job.rank_hosts else omit }}"
    connect_port: "{{ train_job.master_port if inventory_hostname in train_job.rank_hosts else omit }}"
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
  description: The node's clock (seconds since the epoch), read at the start of the probe.
  returned: always
  type: float
elapsed:
  description: Seconds the probe ran after it read the clock (the action plugin takes them off C(controller_after)).
  returned: always
  type: float
listen:
  description: With O(listen_port) - C(rc) (0 - the port was free), C(msg), C(accepted) (connections that came).
  returned: when O(listen_port) is set
  type: dict
connect:
  description: With O(connect_host) - C(rc) (0 - connected), C(msg) (why not), C(seconds) (until it connected).
  returned: when O(connect_host) is set
  type: dict
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


def listen(port, expect, seconds, out):
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("", port))
    except OSError as exc:
        sock.close()
        out.update(rc=1, msg="port %d is not free: %s" % (port, exc.strerror or exc), accepted=0)
        return
    sock.listen(64)
    sock.settimeout(0.5)
    out.update(rc=0, msg="", accepted=0)
    end = time.time() + seconds
    try:
        while time.time() < end and out["accepted"] < expect:
            try:
                conn = sock.accept()[0]
            except socket.timeout:
                continue
            # The client closes first: no TIME_WAIT stays on the master's port for the rendezvous' bind.
            conn.settimeout(5)
            try:
                conn.recv(1)
            except OSError:
                pass
            conn.close()
            out["accepted"] += 1
    finally:
        sock.close()


def connect(host, port, seconds, out):
    start = time.time()
    why = "no attempt"
    while True:
        try:
            sock = socket.create_connection((host, port), timeout=2)
            sock.close()
            out.update(rc=0, msg="", seconds=round(time.time() - start, 3))
            return
        except OSError as exc:
            why = exc.strerror or str(exc)
        if time.time() - start >= seconds:
            break
        time.sleep(0.2)
    out.update(rc=1, msg="%s (for %d s)" % (why, seconds), seconds=round(time.time() - start, 3))


def main():
    module = AnsibleModule(
        argument_spec=dict(
            names=dict(type="list", elements="str", default=[]),
            paths=dict(type="list", elements="path", default=[]),
            ssh_targets=dict(type="list", elements="str", default=[]),
            ssh_timeout=dict(type="int", default=5),
            listen_port=dict(type="int"),
            listen_expect=dict(type="int", default=1),
            listen_seconds=dict(type="int", default=20),
            connect_host=dict(type="str"),
            connect_port=dict(type="int"),
            connect_seconds=dict(type="int", default=15),
        ),
        required_together=[("connect_host", "connect_port")],
        supports_check_mode=True,
    )
    p = module.params
    # The clock is read first; the action plugin narrows the controller's bracket by the time spent after it.
    clock, started = time.time(), time.monotonic()
    ssh, listened, connected = {}, {}, {}
    threads = []
    if p["listen_port"] is not None:
        listener = threading.Thread(target=listen, args=(p["listen_port"], p["listen_expect"], p["listen_seconds"],
                                                         listened))
        listener.start()
        # Bound (or refused) before this node's own connection below tries it.
        deadline = time.time() + 2
        while not listened and time.time() < deadline:
            time.sleep(0.01)
        threads.append(listener)
    if p["connect_host"]:
        threads.append(threading.Thread(target=connect, args=(p["connect_host"], p["connect_port"],
                                                              p["connect_seconds"], connected)))
    threads += [threading.Thread(target=ssh_one, args=(t, p["ssh_timeout"], ssh)) for t in p["ssh_targets"]]
    for t in threads:
        if not t.is_alive() and t.ident is None:
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
    if p["listen_port"] is not None:
        result["listen"] = listened
    if p["connect_host"]:
        result["connect"] = connected
    result["time"] = clock
    result["elapsed"] = time.monotonic() - started
    module.exit_json(**result)


if __name__ == "__main__":
    main()
