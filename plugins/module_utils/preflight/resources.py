# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Preflight: has every node what the ranks need there?

Free space on the shared run directory and the node-local disk, the memlock limit the ranks get
(RDMA profiles pin memory for the NICs; read as the backend starts the ranks), and on cuda nodes
as many GPUs as the hostfile promises ranks.  Pure functions, no Ansible import.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.multinode.deepspeed.plugins.module_utils.preflight.verdicts import FAIL, PASS, RDMA_PROFILES, SKIP, verdict

# A memlock limit of "unlimited", in the KiB the probe and ``ulimit -l`` give.
UNLIMITED = -1


def disk_verdicts(probes, paths, minimums):
    """``paths``: kind (shared, local) -> path; ``minimums``: kind -> GiB; probes' ``disk``: path -> stat."""
    out = []
    for host in sorted(probes):
        disks = probes[host].get("disk") or {}
        for kind in sorted(paths):
            path = paths[kind]
            st = disks.get(path) or {}
            need = float(minimums.get(kind) or 0)
            if st.get("error"):
                out.append(verdict("disk", host, FAIL, "%s %s: %s" % (kind, path, st["error"]),
                                   "create %s on %s (run site.yml), or set the path" % (path, host)))
                continue
            free = float(st.get("free_bytes", 0)) / (1 << 30)
            detail = "%s %s: %.1f GiB free" % (kind, path, free)
            if free < need:
                out.append(verdict("disk", host, FAIL, detail + ", needs %g GiB" % need,
                                   "free space on %s of %s (or lower preflight_min_free_gib_%s)"
                                   % (path, host, kind)))
            else:
                out.append(verdict("disk", host, PASS, detail))
    return out


def memlock_text(kib):
    if kib is None:
        return "unknown"
    return "unlimited" if int(kib) == UNLIMITED else "%d KiB" % int(kib)


def memlock_verdicts(limits, profile, minimum_kib=None):
    """``limits``: host -> memlock soft limit in KiB as the ranks get it (-1: unlimited).

    RDMA profiles pin memory for the NICs: too low a limit makes NCCL fail to register buffers.
    """
    out = []
    for host in sorted(limits):
        kib = limits[host]
        if profile not in RDMA_PROFILES:
            out.append(verdict("memlock", host, SKIP, "%s (the %s profile pins no memory)" % (memlock_text(kib), profile)))
            continue
        ok = kib is not None and (int(kib) == UNLIMITED or (minimum_kib is not None and int(kib) >= minimum_kib))
        if ok:
            out.append(verdict("memlock", host, PASS, memlock_text(kib)))
        else:
            out.append(verdict("memlock", host, FAIL, "%s, the %s profile needs unlimited" % (memlock_text(kib), profile),
                               "run site.yml (role nccl sets memlock unlimited for RDMA), then restart sshd "
                               "on %s so new sessions get it" % host))
    return out


def _ulimit_kib(text):
    text = (text or "").strip().splitlines()
    if not text:
        return None
    last = text[-1].strip()
    if last == "unlimited":
        return UNLIMITED
    try:
        return int(last)
    except ValueError:
        return None


def rank_memlock(over_ssh, coordinators, rank_hosts, probes, ssh):
    """The memlock limit (KiB) each rank node's ranks get: through an SSH login where the job's backend starts
    ranks over SSH (``over_ssh``: the plan's ``launch["ranks_over_ssh"]``; pdsh: read by ``ulimit -l`` over the
    coordinator's connection), else through Ansible's session (ssh-free)."""
    out = {}
    for host in rank_hosts:
        kib = None
        if over_ssh and coordinators:
            res = (ssh.get(coordinators[0]) or {}).get(host) or {}
            if int(res.get("rc", 1)) == 0:
                kib = _ulimit_kib(res.get("stdout"))
        if kib is None:
            kib = ((probes.get(host) or {}).get("memlock") or {}).get("soft")
        out[host] = kib
    return out


def accelerator_verdicts(slots, gpus, accelerator):
    """The accelerators the hostfile promises are there: slots <= GPUs found on cuda nodes.

    ``slots``: rank host -> slots; ``gpus``: host -> GPU count (None: nvidia-smi absent/failed)
    plus optionally ``"<host>:status"`` keys with accelerator_facts' status text.
    """
    out = []
    for host in sorted(slots):
        n = int(slots[host])
        found = gpus.get(host)
        if accelerator != "cuda":
            out.append(verdict("accelerators", host, PASS, "%d rank(s) on the %s accelerator" % (n, accelerator)))
            continue
        if not found:
            out.append(verdict("accelerators", host, FAIL,
                               "the hostfile promises %d GPU rank(s) but nvidia-smi finds no GPU (%s)"
                               % (n, gpus.get(host + ":status") or "none"),
                               "check the driver on %s (nvidia-smi), or set deepspeed_accelerator: cpu" % host))
        elif n > int(found):
            out.append(verdict("accelerators", host, FAIL, "the hostfile promises %d GPU rank(s); nvidia-smi lists %d"
                               % (n, int(found)),
                               "set deepspeed_slots for %s to %d or less (or leave it unset: one per GPU)"
                               % (host, int(found))))
        else:
            out.append(verdict("accelerators", host, PASS, "%d rank(s), %d GPU(s)" % (n, int(found))))
    return out
