# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Preflight's verdicts: one per check and node, and what a whole preflight of them says.

Every check of a preflight (versions.py, ssh.py, port.py, names.py, clock.py, resources.py,
bandwidth.py; evaluate.py runs them all) gives verdicts of one shape, ``verdict(...)``, with a status:

* ``pass``  - fine;
* ``warn``  - works, but worth knowing (never stops a launch);
* ``fail``  - a job would fail or crawl: preflight fails, naming the host and the fix;
* ``skip``  - not needed for this job (an SSH direction the backend does not use...).

Pure functions, no Ansible import.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

PASS, WARN, FAIL, SKIP = "pass", "warn", "fail", "skip"
# The NCCL profiles that use RDMA (they pin memory, and may fall back to tcp).
RDMA_PROFILES = ("ib", "roce")


class PreflightError(Exception):
    """The input to a preflight decision is malformed."""


def verdict(check, host, status, detail, fix=None):
    return {"check": check, "host": host, "status": status, "detail": detail, "fix": fix}


def summarize(verdicts):
    """``{"status", "failed": [...], "warnings": [...]}``: fail when any verdict fails."""
    failed = [v for v in verdicts if v["status"] == FAIL]
    warnings = [v for v in verdicts if v["status"] == WARN]
    return {"status": FAIL if failed else PASS, "failed": failed, "warnings": warnings}


def format_verdicts(verdicts):
    lines = ["%-14s %-16s %-5s %s" % ("check", "host", "", "detail")]
    for v in verdicts:
        lines.append("%-14s %-16s %-5s %s" % (v["check"], v["host"], v["status"].upper(), v["detail"]))
    return "\n".join(lines)


def findings(verdicts):
    """One line per failure: host, what, fix."""
    return ["%s on %s: %s.%s" % (v["check"], v["host"], v["detail"].rstrip("."),
                                 (" Fix: %s." % v["fix"].rstrip(".")) if v.get("fix") else "")
            for v in verdicts if v["status"] == FAIL]
