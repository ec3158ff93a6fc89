# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Preflight: can the nodes log in to each other where the launch backend needs it?

The (source, target) pairs are the plan's (its ``launch``, which the job's backend described: pdsh: the
coordinator reaches every node of the job and every node itself; ssh-free: none); each failed ``ssh -o BatchMode=yes`` is named with its
likely cause and fix from OpenSSH's own message.  Also the from/to matrix of the report.
Pure functions, no Ansible import.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.multinode.deepspeed.plugins.module_utils.preflight.verdicts import FAIL, PASS, SKIP, verdict


def ssh_required_pairs(launch):
    """The (source, target) SSH connections the job's launch needs: the plan's ``launch["ssh_pairs"]``, what its
    backend answered (for pdsh the coordinator reaches every node of the job and every node itself; ssh-free needs
    none)."""
    return [tuple(p) for p in launch["ssh_pairs"]]


def ssh_fix(src, dst, stderr, rc):
    """The likely cause and the fix of a failed ``ssh -o BatchMode=yes`` from src to dst (one sentence)."""
    text = (stderr or "").strip()
    low = text.lower()
    if "connection refused" in low:
        return "sshd is not running (or not listening on port 22) on %s; start it on %s (systemctl start ssh) " \
               "and check the port" % (dst, dst)
    if "could not resolve hostname" in low or "name or service not known" in low \
            or "temporary failure in name resolution" in low:
        return "%s cannot resolve the name %s; add %s to DNS or to /etc/hosts on %s" % (src, dst, dst, src)
    if "host key verification failed" in low or "no matching host key" in low or "remote host identification" in low:
        return "%s does not know %s's host key (or it changed); run site.yml (role ssh_mesh refreshes " \
               "known_hosts), never turn StrictHostKeyChecking off" % (src, dst)
    if "permission denied" in low:
        return "%s's cluster key is not accepted on %s (authorized_keys, or its from= list lacks %s's address); " \
               "run site.yml (role ssh_mesh) and check ssh_mesh_user" % (src, dst, src)
    if "timed out" in low or "no route to host" in low or rc == 124:
        return "%s cannot reach %s on port 22 (firewall, routing, or the node is down); open port 22 between " \
               "the nodes and check that %s is up" % (src, dst, dst)
    return "ssh from %s to %s failed (exit %s); run ssh %s true on %s as the launching user to see why" \
        % (src, dst, rc, dst, src)


def ssh_verdicts(results, required, backend):
    """One verdict per required pair (check ``ssh``, host = source).

    ``results``: source -> target -> ``{"rc", "stdout", "stderr"}``.
    """
    if not required:
        return [verdict("ssh", "*", SKIP, "backend %s uses no SSH between nodes"
                        % backend)]
    out = []
    for src, dst in required:
        res = (results.get(src) or {}).get(dst)
        if res is None:
            out.append(verdict("ssh", src, FAIL, "%s -> %s: not tested (%s gave no answer)" % (src, dst, src),
                               "check that Ansible reaches %s" % src))
        elif int(res.get("rc", 1)) == 0:
            out.append(verdict("ssh", src, PASS, "%s -> %s" % (src, dst)))
        else:
            err = (res.get("stderr") or "").strip().splitlines()
            out.append(verdict("ssh", src, FAIL, "%s -> %s: %s" % (src, dst, err[-1] if err else "exit %s" % res.get("rc")),
                               ssh_fix(src, dst, res.get("stderr"), res.get("rc"))))
    return out


def ssh_matrix_table(nodes, results, required):
    """Rows: from; columns: to; ok / FAIL for the tested pairs, - where the backend needs none."""
    width = max([len(n) for n in nodes] + [8]) + 2
    lines = ["%-*s" % (width, "from\\to") + "".join("%-*s" % (width, n) for n in nodes)]
    req = set(tuple(p) for p in required)
    for src in nodes:
        cells = []
        for dst in nodes:
            if (src, dst) not in req:
                cells.append("-")
                continue
            res = (results.get(src) or {}).get(dst)
            cells.append("ok" if res is not None and int(res.get("rc", 1)) == 0 else "FAIL")
        lines.append("%-*s" % (width, src) + "".join("%-*s" % (width, c) for c in cells))
    return "\n".join(lines)
