# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Preflight: is the master port free on the master, and does every rank node reach it?

From the short-lived listener the playbook starts on the master and one connection from each rank
node, as Ansible registered them.  Pure functions, no Ansible import.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.multinode.deepspeed.plugins.module_utils.preflight.verdicts import FAIL, PASS, verdict


def normalize_port(port):
    """The port test as Ansible registered it -> ``{"listener": {rc, msg}, "probes": {host: {rc, msg}}}``.

    ``listener``: the async_status result of the listener on the master (``rc`` 0: it was free);
    ``probes``: the loop results of the connections (each with ``item`` = the host), or a dict.
    """
    listener = port.get("listener") or {}
    rc = listener.get("rc")
    if rc is None:
        rc = 0 if listener.get("finished") and not listener.get("failed") else 1
    msg = (listener.get("stderr") or listener.get("msg") or "").strip()
    probes = port.get("probes") or {}
    if isinstance(probes, list):
        probes = dict((r.get("item"), {"rc": r.get("rc", 1), "msg": (r.get("stderr") or r.get("msg") or "").strip()})
                      for r in probes)
    return {"listener": {"rc": int(rc), "msg": msg}, "probes": probes}


def port_verdicts(master, port, listener, probes):
    """``listener``: ``{"rc", "msg"}`` of the short-lived listener on the master;
    ``probes``: host -> ``{"rc", "msg"}`` of a connection from each rank node."""
    out = []
    if int(listener.get("rc", 1)) != 0:
        out.append(verdict("master_port", master, FAIL, "port %s is not free on the master: %s"
                           % (port, (listener.get("msg") or "").strip()),
                           "-e master_port=<a free port>, or stop what holds it (ss -ltnp on %s)" % master))
        return out
    out.append(verdict("master_port", master, PASS, "port %s free on the master" % port))
    for host in sorted(probes):
        res = probes[host]
        if int(res.get("rc", 1)) == 0:
            out.append(verdict("master_port", host, PASS, "reaches %s:%s" % (master, port)))
        else:
            why = (res.get("msg") or "").strip()
            out.append(verdict("master_port", host, FAIL, "cannot reach %s:%s: %s" % (master, port, why),
                               "open port %s between %s and %s (firewall), or -e master_port=<a free port>" % (port, host, master)))
    return out
