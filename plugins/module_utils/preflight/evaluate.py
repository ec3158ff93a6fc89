# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Preflight: will a job on these nodes work, and how fast can they talk?

The playbook (playbooks/preflight.yml) gathers what the nodes report (versions, a probe of clock, names,
disks and memlock, an SSH matrix, the master port, an all-reduce test); ``gather`` takes it from the
nodes' variables and ``evaluate`` turns it into one verdict per check and node (verdicts.py), with the
tables and the fallback advice.  Each check is judged in the file named for it beside this one:
versions.py, ssh.py, port.py, names.py, clock.py, resources.py (disks, memlock, accelerators) and
bandwidth.py.  Here too: the preflight's settings (``DEFAULTS``, ``check_settings``) and whether a
passing preflight stands for a later launch (``reuse_key``, ``reuse_verdict``).

Pure functions, no Ansible import.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import hashlib
import json

from ansible_collections.multinode.deepspeed.plugins.module_utils.common.flags import flag
from ansible_collections.multinode.deepspeed.plugins.module_utils.preflight.bandwidth import (
    DEFAULT_FRACTIONS, bandwidth_test, bandwidth_verdict, fabric_advice, format_bandwidth_table, job_link_gbps, judge_bandwidth)
from ansible_collections.multinode.deepspeed.plugins.module_utils.preflight import health
from ansible_collections.multinode.deepspeed.plugins.module_utils.preflight.clock import clock_verdicts
from ansible_collections.multinode.deepspeed.plugins.module_utils.preflight.names import name_verdicts
from ansible_collections.multinode.deepspeed.plugins.module_utils.preflight.port import normalize_port, port_verdicts
from ansible_collections.multinode.deepspeed.plugins.module_utils.preflight.resources import accelerator_verdicts, disk_verdicts, memlock_verdicts, rank_memlock
from ansible_collections.multinode.deepspeed.plugins.module_utils.preflight.ssh import ssh_matrix_table, ssh_required_pairs, ssh_verdicts
from ansible_collections.multinode.deepspeed.plugins.module_utils.preflight.verdicts import FAIL, PASS, findings, format_verdicts, summarize, verdict
from ansible_collections.multinode.deepspeed.plugins.module_utils.preflight.versions import version_table, version_verdicts

DEFAULTS = {
    "max_clock_skew": 2.0,          # seconds, node vs controller
    "min_free_gib_shared": 5.0,     # the shared run directory
    "min_free_gib_local": 5.0,      # the node-local disk (venv, caches, /tmp)
    "min_memlock_kib": None,        # None: RDMA profiles need "unlimited"
    "bandwidth_fraction": DEFAULT_FRACTIONS,
    "link_gbps": None,              # override the link speed taken from the facts
    "health": True,                 # each rank node's health figures, against its peers and its past
    "health_fraction": health.FRACTION,
    "health_action": "fail",        # or warn
}


# --------------------------------------------------------------------------- settings

def _number(value):
    try:
        return float(str(value).strip())
    except (TypeError, ValueError):
        return None


def check_settings(settings):
    """One sentence per preflight setting that is out of range (empty: all good), each with the fix."""
    problems = []
    for key in ("max_clock_skew", "min_free_gib_shared", "min_free_gib_local"):
        value = _number(settings.get(key, DEFAULTS[key]))
        if value is None or value < 0:
            problems.append("preflight_%s=%s must be a number >= 0" % (key, settings.get(key)))
    link = settings.get("link_gbps")
    if link not in (None, "") and (_number(link) or 0) <= 0:
        problems.append("preflight_link_gbps=%s must be Gb/s > 0 (or empty: from the fabric facts)" % link)
    fractions = settings.get("bandwidth_fraction") or {}
    if not isinstance(fractions, dict):
        problems.append("preflight_bandwidth_fraction=%s must be a mapping of ib, roce, tcp, gloo to (0, 1]" % (fractions,))
    else:
        for key, value in sorted(fractions.items()):
            number = _number(value)
            if key not in DEFAULT_FRACTIONS or number is None or not 0 < number <= 1:
                problems.append("preflight_bandwidth_fraction: %s=%s (keys ib, roce, tcp, gloo; values in (0, 1])"
                                % (key, value))
    top = settings.get("max_bytes")
    if top not in (None, "") and not (str(top).strip().isdigit() and int(str(top).strip()) >= 65536):
        problems.append("preflight_max_bytes=%s must be whole bytes >= 65536 (or empty)" % top)
    timeout = settings.get("bandwidth_timeout", 120)
    if not (str(timeout).strip().isdigit() and int(str(timeout).strip()) >= 10):
        problems.append("preflight_bandwidth_timeout=%s must be whole seconds >= 10" % timeout)
    fraction = _number(settings.get("health_fraction", DEFAULTS["health_fraction"]))
    if fraction is None or not 0 < fraction <= 1:
        problems.append("preflight_health_fraction=%s must be a number in (0, 1]" % settings.get("health_fraction"))
    if str(settings.get("health_action") or "fail") not in ("fail", "warn"):
        problems.append("preflight_health_action=%s must be fail or warn" % settings.get("health_action"))
    return problems


def effective_settings(settings):
    """``(cfg, fractions)``: what a preflight is judged with.  ``cfg``: ``DEFAULTS`` overridden by every setting
    given (None or empty: the default), each bound a number; ``fractions``: ``DEFAULT_FRACTIONS`` overridden
    key by key by ``bandwidth_fraction``."""
    cfg = dict(DEFAULTS)
    cfg.update(dict((k, v) for k, v in (settings or {}).items() if v not in (None, "")))
    # -e gives strings: every bound is a number from here on.
    for key in ("max_clock_skew", "min_free_gib_shared", "min_free_gib_local", "link_gbps", "min_memlock_kib",
                "health_fraction"):
        if cfg.get(key) is not None:
            cfg[key] = float(cfg[key])
    fractions = dict(DEFAULT_FRACTIONS)
    fractions.update(dict((k, float(v)) for k, v in (cfg.get("bandwidth_fraction") or {}).items()))
    return cfg, fractions


# --------------------------------------------------------------------------- reuse of a passing preflight

# Variables of the ranks' environment that name one run, not the job's layout.
RUN_ONLY_ENV = ("MULTINODE_DS_RUN_ID", "MULTINODE_DS_RUN_DIR", "HF_TOKEN_PATH", "DS_ENV_FILE")


def reuse_key(job, nodevars, settings=None):
    """What a preflight checked, as one hash: a passing preflight stands while it is the same.

    The job's layout (rank nodes and slots, master, port, backend and its options (a Slurm partition),
    accelerator, the ranks' environment but for the run's own id and directory), every node's inventory address and
    addresses, every node's stack fingerprint (module node_facts: any changed package changes it),
    and the preflight's own settings.  A new run id, model or step count keeps it."""
    nodes = list(job["coordinators"]) + [h for h in job["rank_hosts"] if h not in job["coordinators"]]
    per_node = {}
    for host in nodes:
        hv = nodevars.get(host) or {}
        node = hv.get("multinode_node") or {}
        per_node[host] = {"ansible_host": hv.get("ansible_host") or host, "ipv4": sorted(node.get("ipv4") or []),
                          "stack": node.get("stack_fingerprint"), "gpus": (hv.get("multinode_accelerators") or {})
                          .get("count"), "hosts_file": flag(hv.get("cluster_hosts_file", True))}
    doc = {"slots": job["slots"], "master": job["master"], "master_addr": job["master_addr"],
           "master_port": job["master_port"], "backend": job["backend"],
           "backend_options": job.get("backend_options") or {}, "accelerator": job["accelerator"],
           "env": dict((k, v) for k, v in job["env"].items() if k not in RUN_ONLY_ENV),
           "shared_dir": job["shared_dir"], "home": job["home"], "nodes": per_node,
           "settings": dict((k, v) for k, v in (settings or {}).items() if v not in (None, ""))}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode("utf-8")).hexdigest()[:24]


def reuse_verdict(record, key, now, max_age):
    """``(reuse, why)``: whether a recorded preflight stands for a job with ``key`` at ``now`` (epoch s)."""
    if not record:
        return False, "no passing preflight recorded for this job layout, stack and addresses"
    if record.get("key") != key or record.get("status") != PASS:
        return False, "the recorded preflight is for another job layout, stack or addresses"
    age = now - float(record.get("time") or 0)
    if age < 0 or age > float(max_age):
        return False, "the last passing preflight is %.0f s old (preflight_max_age=%s)" % (age, max_age)
    return True, "a passing preflight of %.0f s ago (%s) checked this job layout, stack and addresses" % (
        age, record.get("run_id") or "?")


# --------------------------------------------------------------------------- the whole preflight

def _answered(result):
    """A registered task result that ran (not skipped, not failed), else None."""
    if not isinstance(result, dict) or result.get("skipped") or result.get("failed") or result.get("unreachable"):
        return None
    return result


def job_layout(data):
    """Who is who in the job, as the checks read it: backend and its launch (the plan's ``launch``: the SSH logins
    it needs, whether ranks start over SSH), accelerator, the NCCL profile judged and the collective
    (CPU ranks talk gloo over TCP whatever RDMA the nodes have: judged as tcp, with no memlock need), coordinators,
    rank nodes (``slots``: host -> ranks), every node (coordinators first), and the probes and the SSH results that
    answered (SSH as node_probe registered it, host -> result with "ssh", or host -> target -> result)."""
    job = data["job"]
    backend, accel = job["backend"], job.get("accelerator") or "cpu"
    coords = list(job.get("coordinators") or [])
    slots = dict(job["rank_hosts"])
    ranks = list(slots)
    return {"job": job, "backend": backend, "launch": job["launch"], "accelerator": accel,
            "profile": (job.get("profile") or "tcp") if accel == "cuda" else "tcp",
            "collective": "nccl" if accel == "cuda" else "gloo",
            "coordinators": coords, "slots": slots, "ranks": ranks, "nodes": coords + [h for h in ranks if h not in coords],
            "probes": dict((h, p) for h, p in (data.get("probes") or {}).items() if _answered(p)),
            "ssh": dict((h, (r.get("ssh") if "ssh" in r else r)) for h, r in (data.get("ssh") or {}).items()
                        if _answered(r))}


def node_verdicts(data, layout, cfg):
    """What each node that answered the probe has and sees on its own: names, clock, disks, memlock, accelerators."""
    job, nodes, probes = layout["job"], layout["nodes"], layout["probes"]
    resolved = dict((h, (probes.get(h) or {}).get("resolved") or {}) for h in nodes if h in probes)
    out = name_verdicts(resolved, data.get("expected_addresses") or {}, data.get("own_addresses") or {},
                        [h for h, on in (data.get("hosts_file") or {}).items() if not flag(on)])
    clocked = dict((h, probes[h]) for h in nodes if h in probes and "controller_before" in probes[h])
    out += clock_verdicts(clocked, float(cfg["max_clock_skew"]))
    paths = {"shared": job["shared_dir"], "local": job["local_dir"]}
    out += disk_verdicts(dict((h, probes[h]) for h in nodes if h in probes), paths,
                         {"shared": cfg["min_free_gib_shared"], "local": cfg["min_free_gib_local"]})
    out += memlock_verdicts(rank_memlock(layout["launch"]["ranks_over_ssh"], layout["coordinators"], layout["ranks"],
                                         probes, layout["ssh"]),
                            layout["profile"], cfg.get("min_memlock_kib"))
    out += accelerator_verdicts(layout["slots"], data.get("gpus") or {}, layout["accelerator"])
    return out


def probe_verdicts(layout):
    """A failure for each node that did not answer the probe (its names, clock and disks are not judged)."""
    return [verdict("probe", host, FAIL, "the node did not answer the probe", "check that Ansible reaches %s" % host)
            for host in layout["nodes"] if host not in layout["probes"]]


def bandwidth_judgement(data, layout, cfg, fractions):
    """``(link, primary, fallback)``: the job's all-reduce test judged against the slowest rank node's link
    (preflight_link_gbps overrides it; CPU ranks: the tcp side's), the tcp retest against the Ethernet side's
    speed (preflight_link_gbps is the job profile's link); None for a test that did not run."""
    ranks = layout["ranks"]
    link = cfg.get("link_gbps")
    if link is None:
        speeds = data.get("link_gbps") if layout["accelerator"] == "cuda" else data.get("tcp_link_gbps", data.get("link_gbps"))
        link = job_link_gbps(dict((h, (speeds or {}).get(h)) for h in ranks))
    bw = data.get("bandwidth") or {}
    primary = fallback = None
    if bw.get("primary"):
        primary = judge_bandwidth(bw["primary"], len(ranks), layout["profile"], layout["collective"], link, fractions)
    if bw.get("fallback"):
        tcp_link = job_link_gbps(dict((h, (data.get("tcp_link_gbps") or {}).get(h)) for h in ranks))
        fallback = judge_bandwidth(bw["fallback"], len(ranks), "tcp", layout["collective"], tcp_link, fractions)
    return link, primary, fallback


def report_tables(data, layout, required, verdicts, primary, fallback):
    """The report's tables: the SSH matrix, the verdicts, and the rows of each all-reduce test judged."""
    tables = {"ssh": ssh_matrix_table(layout["nodes"], layout["ssh"], required) if required else
              "SSH: not needed by backend %s" % layout["backend"],
              "verdicts": format_verdicts(verdicts)}
    if primary is not None:
        raw = data["bandwidth"]["primary"].get("raw") or {}
        tables["bandwidth"] = format_bandwidth_table(
            primary["rows"], "all_reduce %s (%s, %d ranks on %d nodes): %s"
            % (primary["label"], layout["collective"], int(raw.get("world_size") or 0), len(layout["ranks"]),
               primary["status"].upper()))
    if fallback is not None:
        tables["bandwidth_tcp"] = format_bandwidth_table(fallback["rows"], "all_reduce tcp (fallback test): %s"
                                                         % fallback["status"].upper())
    return tables


def evaluate(data, settings=None):
    """Every verdict of one preflight, the tables, the bandwidth judgement and the fallback advice."""
    cfg, fractions = effective_settings(settings)
    layout = job_layout(data)
    job, coords, ranks = layout["job"], layout["coordinators"], layout["ranks"]
    verdicts = version_verdicts(data.get("versions") or {}, ranks, coords)
    required = ssh_required_pairs(layout["launch"])
    verdicts += ssh_verdicts(layout["ssh"], required, layout["backend"])
    port = normalize_port(data["port"]) if data.get("port") else {}
    if port:
        verdicts += port_verdicts(job["master"], job["master_port"], port["listener"], port["probes"])
    verdicts += node_verdicts(data, layout, cfg)
    verdicts += [verdict(v["check"], v["host"], v["status"], v["detail"], v.get("fix"))
                 for v in data.get("backend_verdicts") or []]
    verdicts += probe_verdicts(layout)
    if flag(cfg.get("health", True)):
        verdicts += health.health_verdicts(data.get("health") or {}, data.get("health_history") or {},
                                           cfg["health_fraction"], cfg.get("health_action") or "fail")
    link, primary, fallback = bandwidth_judgement(data, layout, cfg, fractions)
    verdicts.append(bandwidth_verdict(primary, ranks, port, flag(cfg.get("bandwidth", True))))
    advice = fabric_advice(verdicts, layout["profile"], primary, fallback, ranks)
    if advice:
        for v in verdicts:
            if v["check"] == "bandwidth" and v["status"] == FAIL:
                v["fix"] = advice["message"]
    tables = report_tables(data, layout, required, verdicts, primary, fallback)
    summary = summarize(verdicts)
    return {"status": summary["status"], "verdicts": verdicts, "findings": findings(verdicts),
            "warnings": ["%s on %s: %s" % (v["check"], v["host"], v["detail"]) for v in summary["warnings"]],
            "bandwidth": {"primary": primary, "fallback": fallback, "link_gbps": link, "fractions": fractions},
            "advice": advice, "tables": tables, "settings": cfg}


def gather(job, nodevars, workers=None):
    """The report's data from what the preflight role left in each node's variables.

    ``job``: the plan (module_utils/plan/job.py) with ``profile`` added; ``nodevars``: host -> its hostvars
    (``multinode_node``, ``multinode_accelerators``, ``multinode_fabric``, ``cluster_hosts_file``,
    ``preflight_probe``, ``preflight_node_link_gbps``, ``preflight_node_tcp_link_gbps``, ``preflight_bw``,
    ``preflight_health_figures``)."""
    ranks = list(job["rank_hosts"])
    nodes = list(job["coordinators"]) + [h for h in ranks if h not in job["coordinators"]]
    hv = dict((h, nodevars.get(h) or {}) for h in nodes)
    node = dict((h, hv[h].get("multinode_node") or {}) for h in nodes)
    probes = dict((h, hv[h].get("preflight_probe")) for h in nodes if hv[h].get("preflight_probe") is not None)
    report_job = dict(job)
    report_job["rank_hosts"] = dict(job["slots"])
    report_job["local_dir"] = job.get("home")
    data = {
        "job": report_job,
        "versions": dict((h, node[h].get("versions") or {"error": "the node did not answer"}) for h in nodes),
        "probes": probes,
        "ssh": probes,
        "gpus": dict((h, (hv[h].get("multinode_accelerators") or {}).get("count")) for h in ranks),
        "expected_addresses": dict((h, (hv[h].get("multinode_fabric") or {}).get("cluster_address")) for h in nodes),
        "hosts_file": dict((h, hv[h].get("cluster_hosts_file", True)) for h in nodes),
        "own_addresses": dict((h, list(node[h].get("ipv4") or []) + list(node[h].get("ipv6") or [])) for h in nodes),
        "link_gbps": dict((h, hv[h].get("preflight_node_link_gbps")) for h in ranks),
        "tcp_link_gbps": dict((h, hv[h].get("preflight_node_tcp_link_gbps")) for h in ranks),
        # The launch backend's own checks (its tasks file sets them once, for the play).
        "backend_verdicts": next((list(hv[h]["backend_verdicts"]) for h in nodes
                                  if hv[h].get("backend_verdicts") is not None), []),
    }
    for h in ranks:
        data["gpus"][h + ":status"] = (hv[h].get("multinode_accelerators") or {}).get("status")
    master = job["master"]
    listener = ((probes.get(master) or {}).get("listen"))
    if listener is not None:
        data["port"] = {"listener": {"rc": listener.get("rc", 1), "msg": listener.get("msg", "")},
                        "probes": dict((h, (probes.get(h) or {}).get("connect") or {"rc": 1, "msg": "no answer"})
                                       for h in ranks)}
    tests = {}
    for h in ranks:
        for label, res in (hv[h].get("preflight_bw") or {}).items():
            tests.setdefault(label, {})[h] = res
    primary = (job.get("profile") or "tcp") if job.get("accelerator") == "cuda" else "tcp"
    bandwidth = {"primary": None, "fallback": None}
    if primary in tests:
        bandwidth["primary"] = bandwidth_test(primary, tests[primary], master)
    if primary != "tcp" and "tcp" in tests:
        bandwidth["fallback"] = bandwidth_test("tcp", tests["tcp"], master)
    data["bandwidth"] = bandwidth
    # Each rank node's health figures (multinode_ds.health), where the role measured them.
    data["health"] = dict((h, health.parse(hv[h].get("preflight_health_figures"))) for h in ranks
                          if health.parse(hv[h].get("preflight_health_figures")) is not None)
    data["version_table"] = version_table(nodes, data["versions"], dict(
        (h, hv[h].get("multinode_accelerators") or {}) for h in nodes), workers if workers is not None else ranks)
    return data
