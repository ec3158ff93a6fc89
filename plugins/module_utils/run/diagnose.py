# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Failure diagnosis: known patterns in a run's logs, mapped to their cause and remedy.

Pure Python, no Ansible import: unit-tested on the controller with real log lines.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re
import signal

from ansible_collections.multinode.deepspeed.plugins.module_utils.plan import dsconfig

# (id, regex, cause, remedy).  The findings come in this order: causes before their consequences
# (a killed rank before the collective timeouts it leaves behind).
RULES = [
    ("hostfile-fallback",
     r"Unable to find hostfile, will proceed with training with local resources only",
     "DeepSpeed did not find the hostfile and ran on the launching node alone.",
     "Pass the hostfile's absolute path with --hostfile (train.yml writes it into the run directory)."),
    ("killed",
     r"exits with return code = -(\d+)",
     "A rank was killed by a signal (SIGKILL is typical of the kernel's out-of-memory killer or a kill by hand).",
     "Check the node's memory (dmesg | grep -i oom) and whether something else killed the process."),
    ("ds-config",
     dsconfig.LOG_PATTERN,
     "DeepSpeed refused the job's config (ds_config).",
     "Correct the DeepSpeed config: python -m multinode_ds.ds_check --config FILE --world-size N checks it on a "
     "node before a launch."),
    ("rdma-init",
     r"ibv_modify_qp|NET/IB\s*:.*(?:failed|error)|ibv_create_qp failed|Call to ibv_\w+ failed",
     "NCCL tried InfiniBand/RoCE and could not bring up a queue pair: RDMA hardware is present but not usable "
     "between these nodes (for example Ethernet-only links, or a wrong RoCE GID index).",
     "Use the TCP profile: set NCCL_IB_DISABLE=1 and NCCL_SOCKET_IFNAME=<the cluster interface> in "
     "deepspeed_rank_env, or fix the fabric (port state ACTIVE, NCCL_IB_GID_INDEX of the RoCE v2 GID)."),
    ("collective-timeout",
     r"Watchdog caught collective operation timeout|ProcessGroupNCCL.*[Tt]imeout|"
     r"Timed out waiting \d+ms for recv operation|gloo.*(?:Timed out|Connection closed by peer|Connection reset by peer)|"
     r"DistStoreError|Socket Timeout",
     "A collective (all-reduce, barrier or rendezvous) timed out or lost its peer: another rank died or stalled, "
     "or the nodes cannot reach each other on the chosen interface.",
     "Look first at the rank that failed first; check that every node reaches the master address and port "
     "and that NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME name the cluster interface (deepspeed_rank_env)."),
    ("cuda-oom",
     r"CUDA out of memory|torch\.OutOfMemoryError|OutOfMemoryError: CUDA",
     "A GPU ran out of memory.",
     "Lower the micro batch (-e args='--micro-batch 1'), raise the ZeRO stage, enable optimizer offload or "
     "activation checkpointing (a --ds-config override), or use more GPUs."),
    ("invalid-device",
     r"invalid device ordinal|CUDA error: invalid device ordinal",
     "A rank asked for a GPU index the node does not have: the hostfile gives the node more slots than GPUs.",
     "Set deepspeed_slots for that host to its GPU count (nvidia-smi -L), or leave the host out."),
    ("ssh-hostkey",
     r"Host key verification failed|REMOTE HOST IDENTIFICATION HAS CHANGED",
     "SSH from the launching node refused a host key it does not know (or one that changed).",
     "Run ansible-playbook site.yml: the ssh_mesh role fills known_hosts with every node's real host key. "
     "Never turn host key checking off."),
    ("ssh-permission",
     r"Permission denied \(publickey",
     "SSH from the launching node was refused: the cluster key is not authorized there, or the login came "
     "from an address the key is not allowed from.",
     "Run ansible-playbook site.yml (ssh_mesh role), and check ssh_mesh_user matches the account that launches."),
    ("port-in-use",
     r"Address already in use|EADDRINUSE|server socket has failed to (?:listen|bind)",
     "The master port is already taken on the master node (another job, or a leftover process).",
     "Pick another port with -e master_port=<port>, or stop what holds it (ss -ltnp on the master)."),
    ("missing-module",
     r"ModuleNotFoundError: No module named '([^']+)'",
     "A rank could not import a Python module.",
     "Install it on every node through the stack role (stack_packages), so every node has the same version."),
    ("nccl-version",
     r"NCCL version mismatch|nccl.*version.*mismatch",
     "The nodes run different NCCL versions.",
     "Run ansible-playbook site.yml so every node gets the same pinned stack."),
]

_COMPILED = [(rid, re.compile(rx), cause, remedy) for rid, rx, cause, remedy in RULES]
_COMPILED_BY_ID = dict((rid, rx) for rid, rx, _cause, _remedy in _COMPILED)
_EXIT = re.compile(r"^(?:(?P<host>[\w.\-]+): )?.*?(?:--local_rank=(?P<local>\d+)).*exits with return code = (?P<rc>-?\d+)")
_EXIT_NO_RANK = re.compile(r"^(?:(?P<host>[\w.\-]+): )?.*exits with return code = (?P<rc>-?\d+)")


def diagnose(files, versions=None):
    """Findings for ``files`` ({name: text}); ``versions``: {host: {package: version}}.

    Every finding names the rule, cause and remedy, and the first file and line that matched.
    """
    findings = []
    for rid, rx, cause, remedy in _COMPILED:
        for name in sorted(files):
            hit, after = _first_hit(rid, rx, files[name].splitlines())
            if hit:
                finding = {"id": rid, "cause": cause, "remedy": remedy, "file": name, "line": hit[-400:]}
                m = rx.search(hit)
                if rid == "missing-module":
                    finding["module"] = m.group(1)
                if rid == "killed":
                    finding["signal"] = _signal_name(int(m.group(1)))
                if rid == "ds-config":
                    _word_ds_config(finding, "\n".join([hit] + after))
                findings.append(finding)
                break
    mismatch = version_mismatch(versions or {})
    if mismatch:
        findings.append({"id": "version-mismatch",
                         "cause": "Nodes of this job run different versions: %s." % "; ".join(mismatch),
                         "remedy": "Run ansible-playbook site.yml so every node gets the same pinned stack.",
                         "file": "nodes/*.json", "line": ""})
    return findings


# What a log adds before a rank's own line: pdsh's "host: ", torch's "[rank0]: ".
_PREFIX = re.compile(r"^((?:[\w.\-]+: )?(?:\[rank\d+\]: )?)")


def _first_hit(rid, rx, lines):
    """``(line, the lines after it that belong to it)`` of the first line of ``lines`` that ``rx`` matches, or
    ``(None, [])``.  For ``ds-config``: pydantic's refusal takes the next lines (the field and why: LOG_FOLLOW), and a
    type error counts only right after a frame of DeepSpeed's config code (a script's own TypeError is not the
    config's).  A pdsh log's ``host: `` prefix is taken off the lines after."""
    for i, line in enumerate(lines):
        if not rx.search(line):
            continue
        if rid != "ds-config":
            return line.strip(), []
        if "TypeError" in line and not any(dsconfig.LOG_CONTEXT.search(x) for x in lines[max(0, i - 4):i]):
            continue
        prefix = _PREFIX.match(line).group(1)
        after = [x[len(prefix):] if x.startswith(prefix) else x for x in lines[i + 1:i + 1 + dsconfig.LOG_FOLLOW]]
        return line.strip(), after
    return None, []


def _word_ds_config(finding, hit):
    """The config error in DeepSpeed's words, turned into the key, the values and a fix (plan/dsconfig.py)."""
    worded = dsconfig.translate(hit)
    if worded:
        finding["key"], finding["cause"], finding["remedy"] = worded


def version_mismatch(versions):
    out = []
    packages = sorted({p for v in versions.values() for p in v})
    for pkg in packages:
        seen = {}
        for host, v in sorted(versions.items()):
            seen.setdefault(v.get(pkg), []).append(host)
        if len(seen) > 1:
            out.append("%s: %s" % (pkg, ", ".join("%s on %s" % (ver, "/".join(h)) for ver, h in sorted(
                seen.items(), key=lambda kv: str(kv[0])))))
    return out


def _signal_name(num):
    try:
        return signal.Signals(num).name
    except ValueError:
        return "signal %d" % num


def first_failure(lines_by_host, layout_hosts, rank_texts=None):
    """The rank exit with a non-zero code that caused the others: {host, rank, local_rank, exit_code, signal, line}.

    ``lines_by_host``: {host or None: text} -- a pdsh log whose lines start with ``host: ``
    (key None), or a node's own launcher log (key: the host).  ``layout_hosts``: the hostfile
    layout (name, slots, first_rank) to turn a local rank into a global one.  ``rank_texts``:
    {global rank: its log}; a rank that exited with an error after its collective lost its peer
    ("Connection closed by peer") failed because of another: the first exit that is not such a
    consequence is the cause, whatever order the nodes' launchers noticed them in.
    """
    exits = list(_rank_exits(lines_by_host, layout_hosts))
    consequence = _COMPILED_BY_ID["collective-timeout"]
    for failure in exits:
        text = (rank_texts or {}).get(failure["rank"]) or ""
        if failure["exit_code"] < 0 or not consequence.search(text):
            return failure
    return exits[0] if exits else None


def _rank_exits(lines_by_host, layout_hosts):
    first_rank = dict((h["name"], h["first_rank"]) for h in layout_hosts)
    for key, text in lines_by_host.items():
        for line in text.splitlines():
            m = _EXIT.search(line) or _EXIT_NO_RANK.search(line)
            if not m or int(m.group("rc")) == 0:
                continue
            host = m.group("host") if m.group("host") in first_rank else key
            local = int(m.groupdict().get("local") or 0)
            rc = int(m.group("rc"))
            yield {
                "host": host,
                "local_rank": local,
                "rank": first_rank[host] + local if host in first_rank else None,
                "exit_code": rc,
                "signal": _signal_name(-rc) if rc < 0 else None,
                "line": line.strip()[-400:],
            }


def abort_host_first(launcher_logs, abort):
    """The launchers' logs (``{host: text}``) in the order first_failure reads them: the node that raised the
    abort (``abort``: the ABORT record, or None) first, the others in their order."""
    return dict(sorted(launcher_logs.items(), key=lambda kv: kv[0] != (abort or {}).get("host")))
