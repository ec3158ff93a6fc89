# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Preflight: will a job on these nodes work, and how fast can they talk?

Pure functions, no Ansible import.  The playbook (playbooks/preflight.yml) gathers what the
nodes report (versions, a probe of clock, names, disks and memlock, an SSH matrix, the master
port, an all-reduce test) and ``evaluate`` turns it into one verdict per check and node:

* ``pass``  - fine;
* ``warn``  - works, but worth knowing (never stops a launch);
* ``fail``  - a job would fail or crawl: preflight fails, naming the host and the fix;
* ``skip``  - not needed for this job (an SSH direction the backend does not use...).

The bandwidth arithmetic follows nccl-tests' all_reduce_perf: algorithm bandwidth is
bytes / time, bus bandwidth is algbw x 2(n-1)/n for an all-reduce over n ranks (the
traffic each link carries in a ring), comparable with the link speed.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import hashlib
import ipaddress
import json
import statistics

from ansible_collections.multinode.deepspeed.plugins.module_utils.launch import backends
from ansible_collections.multinode.deepspeed.plugins.module_utils.plan.job import flag

PASS, WARN, FAIL, SKIP = "pass", "warn", "fail", "skip"
RDMA_PROFILES = ("ib", "roce")

# The share of the link speed the large-message bus bandwidth must reach, per NCCL profile
# (gloo: the CPU backend, which is bounded by memory copies and a single TCP stream).
DEFAULT_FRACTIONS = {"ib": 0.5, "roce": 0.4, "tcp": 0.3, "gloo": 0.05}

DEFAULTS = {
    "max_clock_skew": 2.0,          # seconds, node vs controller
    "min_free_gib_shared": 5.0,     # the shared run directory
    "min_free_gib_local": 5.0,      # the node-local disk (venv, caches, /tmp)
    "min_memlock_kib": None,        # None: RDMA profiles need "unlimited"
    "bandwidth_fraction": DEFAULT_FRACTIONS,
    "link_gbps": None,              # override the link speed taken from the facts
}

# Stack keys every node shares (the coordinator runs the launcher), and the exact builds the
# rank nodes share (same as site.yml's check).
COMMON_KEYS = ("python", "deepspeed", "transformers", "trainer")
RANK_KEYS = ("python", "torch", "cuda", "nccl", "deepspeed", "transformers", "trainer")

UNLIMITED = -1


class PreflightError(Exception):
    """The input to a preflight decision is malformed."""


def verdict(check, host, status, detail, fix=None):
    return {"check": check, "host": host, "status": status, "detail": detail, "fix": fix}


# --------------------------------------------------------------------------- bandwidth

def bus_factor(ranks):
    """All-reduce bus bandwidth factor 2(n-1)/n (0 for a single rank: nothing crosses a link)."""
    ranks = int(ranks)
    if ranks < 1:
        raise PreflightError("an all-reduce needs at least one rank, got %r" % ranks)
    return 2.0 * (ranks - 1) / ranks


def bandwidth_rows(raw):
    """Rows of the bandwidth table from the test's raw JSON: size, time, algbw and busbw (GB/s).

    ``raw``: ``{"world_size": n, "results": [{"bytes", "seconds", "iters", ...}]}`` as
    ``multinode_ds.allreduce_perf`` writes it.  GB is 1e9 bytes, as in nccl-tests.
    """
    n = int(raw["world_size"])
    factor = bus_factor(n)
    rows = []
    for res in raw.get("results") or []:
        nbytes, secs = int(res["bytes"]), float(res["seconds"])
        if secs <= 0:
            raise PreflightError("non-positive time %r for %d bytes" % (secs, nbytes))
        algbw = nbytes / secs / 1e9
        rows.append({"bytes": nbytes, "count": int(res.get("count", nbytes // 4)), "iters": res.get("iters"),
                     "time_us": round(secs * 1e6, 1), "algbw_gbps": round(algbw, 4),
                     "busbw_gbps": round(algbw * factor, 4)})
    return rows


def large_message_busbw(rows):
    """The best bus bandwidth among the large messages (at least a quarter of the largest size).

    Taking the best of the last few sizes keeps one noisy sample from deciding the verdict.
    """
    if not rows:
        return None
    top = max(r["bytes"] for r in rows)
    return max(r["busbw_gbps"] for r in rows if r["bytes"] * 4 >= top)


def human_bytes(n):
    for unit, size in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= size and n % size == 0:
            return "%d%s" % (n // size, unit)
    return "%dB" % n


def format_bandwidth_table(rows, title=None):
    lines = [title] if title else []
    lines.append("%10s %12s %6s %12s %12s %12s" % ("size", "count", "iters", "time(us)", "algbw(GB/s)",
                                                   "busbw(GB/s)"))
    for r in rows:
        lines.append("%10s %12d %6s %12.1f %12.3f %12.3f" % (human_bytes(r["bytes"]), r["count"], r["iters"],
                                                             r["time_us"], r["algbw_gbps"], r["busbw_gbps"]))
    return "\n".join(lines)


def parse_rate_gbps(value):
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def node_link_gbps(fabric, node):
    """The link speed (Gb/s) a node's NCCL profile uses, from its facts; None when unknown.

    ``fabric``: the node's ``multinode_fabric``; ``node``: the node's ``nccl_node`` (role nccl).
    RDMA profiles: the sum of the rates of the ports NCCL uses (NCCL_IB_HCA).  tcp: the speed
    of NCCL's socket interface (the cluster interface).
    """
    profile = node.get("profile")
    if profile in RDMA_PROFILES:
        wanted = set(node.get("rdma_ports") or [])
        total = 0.0
        for dev in fabric.get("rdma") or []:
            for port in dev.get("ports") or []:
                if "%s:%s" % (dev.get("device"), port.get("port")) in wanted:
                    rate = parse_rate_gbps(port.get("rate_gbps"))
                    if rate is None:
                        return None
                    total += rate
        return total or None
    ifname = (node.get("env") or {}).get("NCCL_SOCKET_IFNAME", "") or fabric.get("cluster_interface") or ""
    if ifname.startswith("^") or "," in ifname:
        # An exclusion (^docker0) or a list: NCCL picks among several interfaces; take the cluster's.
        ifname = fabric.get("cluster_interface") or ""
    ifname = ifname.lstrip("=")
    for iface in fabric.get("interfaces") or []:
        if iface.get("name") == ifname:
            speed = iface.get("speed_mbps")
            return speed / 1000.0 if speed else None
    if ifname and ifname == fabric.get("cluster_interface") and fabric.get("cluster_speed_mbps"):
        return fabric["cluster_speed_mbps"] / 1000.0
    return None


def job_link_gbps(per_node):
    """The slowest rank node's link speed (Gb/s), or None when any node's speed is unknown."""
    speeds = list(per_node.values())
    if not speeds or any(s is None for s in speeds):
        return None
    return min(speeds)


def judge_bandwidth(test, nodes, profile, collective, link_gbps, fractions=None):
    """Turn one all-reduce test into a verdict.

    ``test``: ``{"label", "ok": bool, "error": str, "raw": <the test's JSON or None>}``.
    ``nodes``: the number of rank nodes; ``profile``: the NCCL profile (ib, roce, tcp);
    ``collective``: the collective backend, nccl or gloo; ``link_gbps``: the slowest node's link in Gb/s (None: unknown).
    Returns ``{status, reason, rows, busbw_gbps, threshold_gbps, link_gbps, fraction, key}``.
    """
    fractions = dict(DEFAULT_FRACTIONS, **(fractions or {}))
    key = "gloo" if collective == "gloo" else profile
    fraction = fractions.get(key)
    fraction = float(fraction) if fraction not in (None, "") else None
    link_gbps = float(link_gbps) if link_gbps not in (None, "") else None
    out = {"label": test.get("label") or profile, "profile": profile, "backend": collective, "key": key,
           "fraction": fraction, "link_gbps": link_gbps, "threshold_gbps": None, "busbw_gbps": None,
           "rows": []}
    if not test.get("ok") or not test.get("raw"):
        out.update(status=FAIL, reason="the all-reduce test did not finish: %s"
                   % (test.get("error") or "no result").strip())
        return out
    rows = bandwidth_rows(test["raw"])
    out["rows"] = rows
    busbw = large_message_busbw(rows)
    out["busbw_gbps"] = busbw
    if busbw is None:
        out.update(status=FAIL, reason="the all-reduce test wrote no results (preflight_max_bytes below 4 KiB?)")
        return out
    if nodes < 2:
        out.update(status=PASS, reason="one rank node: the test does not cross the network; no threshold")
        return out
    if link_gbps is None:
        out.update(status=WARN, reason="the link speed is unknown (no speed in sysfs): no threshold applied. "
                   "Set preflight_link_gbps to judge the bandwidth")
        return out
    if fraction is None:
        out.update(status=WARN, reason="no threshold for %s (preflight_bandwidth_fraction has no key %s)"
                   % (key, key))
        return out
    threshold = round(link_gbps / 8.0 * float(fraction), 4)
    out["threshold_gbps"] = threshold
    if busbw >= threshold:
        out.update(status=PASS, reason="bus bandwidth %.3f GB/s >= %.3f GB/s (%g of %g Gb/s, %s)"
                   % (busbw, threshold, fraction, link_gbps, key))
    else:
        out.update(status=FAIL, reason="bus bandwidth %.3f GB/s < %.3f GB/s (%g of the %g Gb/s link, %s)"
                   % (busbw, threshold, fraction, link_gbps, key))
    return out


def needs_fallback_test(profile, collective, judged):
    """Whether to run the test again with the tcp profile: an RDMA profile on NCCL that failed."""
    return collective == "nccl" and profile in RDMA_PROFILES and judged["status"] == FAIL


def fallback_advice(profile, primary, tcp, hosts):
    """Advice when the RDMA profile fails or crawls and TCP works: the variable to pin.

    ``primary`` / ``tcp``: ``judge_bandwidth`` results (``tcp`` None when not run).
    Returns None, or ``{"variable", "value", "message"}``.
    """
    if profile not in RDMA_PROFILES or primary is None or primary["status"] != FAIL:
        return None
    if tcp is None:
        return None
    where = ", ".join(hosts)
    if tcp["status"] == FAIL:
        return {"variable": None, "value": None,
                "message": "the %s profile failed (%s) and TCP failed too (%s): the network between %s is "
                           "broken, not only RDMA; fix the network first"
                           % (profile, primary["reason"], tcp["reason"], where)}
    slow = primary.get("busbw_gbps") is not None
    if slow and tcp.get("busbw_gbps") is not None and tcp["busbw_gbps"] <= primary["busbw_gbps"]:
        # RDMA ran, below its threshold, but still faster than TCP: pinning tcp would not help.
        return {"variable": None, "value": None,
                "message": "the %s profile is below its threshold (%s) but TCP is slower still (%.3f GB/s): "
                           "keep %s and check the RDMA ports' rate and the switch (ibstat, perfquery)"
                           % (profile, primary["reason"], tcp["busbw_gbps"], profile)}
    what = ("runs at %.3f GB/s, far below its threshold" % primary["busbw_gbps"]) if slow \
        else "fails to initialise (%s)" % primary["reason"]
    return {"variable": "nccl_profile", "value": "tcp",
            "message": "NCCL's %s profile %s on %s, while TCP works (%s): pin nccl_profile: tcp for "
                       "the workers (group_vars/workers.yml) and run site.yml, or repair RDMA (ibstat, "
                       "ibv_devinfo; the 'Call to ibv_modify_qp failed' case)" % (profile, what, where,
                                                                                  tcp["reason"])}


# --------------------------------------------------------------------------- versions

def _majority(values, order):
    """The value most hosts have (ties: the one the earliest host in ``order`` has)."""
    counts = {}
    for host in order:
        if host in values:
            counts[values[host]] = counts.get(values[host], 0) + 1
    best = max(counts.values())
    for host in order:
        if host in values and counts[values[host]] == best:
            return values[host], [h for h in order if values.get(h) == values[host]]
    return None, []


def version_verdicts(versions, workers, coordinators):
    """The rank nodes share one exact stack; the coordinator shares its common keys.

    The reference is, per key, the value most rank nodes have (ties: the first rank node's), so the
    odd node out is the one blamed, whichever it is. ``versions``: host -> dict (python, torch, cuda,
    nccl, deepspeed, transformers, trainer), or a dict with ``error`` / a string: why they could not be read.
    """
    out = []
    readable = [w for w in workers if isinstance(versions.get(w), dict) and not versions[w].get("error")]
    ref = {}
    for key in RANK_KEYS:
        if readable:
            ref[key] = _majority(dict((w, versions[w].get(key)) for w in readable), readable)
    for host in list(workers) + [c for c in coordinators if c not in workers]:
        mine = versions.get(host)
        if not isinstance(mine, dict) or mine.get("error"):
            why = mine.get("error") if isinstance(mine, dict) else mine
            out.append(verdict("versions", host, FAIL, "cannot read the stack's versions: %s" % (why or "no answer"),
                               "run site.yml so that %s gets the venv and the trainer" % host))
            continue
        keys = RANK_KEYS if host in workers else COMMON_KEYS
        text = " ".join("%s %s" % (k, mine.get(k)) for k in keys)
        diff = []
        for k in keys:
            if k in ref and mine.get(k) != ref[k][0]:
                others = [h for h in ref[k][1] if h != host]
                names = ", ".join(others[:3]) + (" ..." if len(others) > 3 else "")
                verb = "has" if len(others) == 1 else "have"
                diff.append("%s %s (%s %s %s)" % (k, mine.get(k), names, verb, ref[k][0]))
        if diff:
            out.append(verdict("versions", host, FAIL, "differs: %s" % "; ".join(diff),
                               "run site.yml (without --limit) so that %s gets the chosen stack again" % host))
        else:
            out.append(verdict("versions", host, PASS, text))
    return out


# --------------------------------------------------------------------------- ssh

def ssh_required_pairs(backend, coordinators, rank_hosts):
    """The (source, target) SSH connections a launch backend needs (its ``ssh_pairs``: for pdsh the
    coordinator reaches every node of the job and every node itself; ssh-free needs none)."""
    return [tuple(p) for p in backends.get(backend).ssh_pairs(
        {"coordinators": list(coordinators), "rank_hosts": list(rank_hosts)})]


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


# --------------------------------------------------------------------------- names

def _is_loopback(addr):
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return False


def _names_fix(src, wanted, hosts_file_off):
    """One fix for every name ``src`` gets wrong; ``wanted``: [(name, address)]."""
    entries = ", ".join("%s %s" % (want, name) for name, want in wanted)
    names = ", ".join(pair[0] for pair in wanted)
    if src in hosts_file_off:
        return ("cluster_hosts_file is false for %s, so the site's DNS must resolve %s: add them to DNS (%s), or "
                "set cluster_hosts_file: true (the default) and run site.yml, which writes every inventory name "
                "into /etc/hosts on every node (role multinode.deepspeed.cluster_hosts)" % (src, names, entries))
    return ("run site.yml: with cluster_hosts_file: true (the default) its cluster_hosts role writes every "
            "inventory name into /etc/hosts on %s (%s); or add %s to the site's DNS and set cluster_hosts_file: "
            "false" % (src, entries, names))


def name_verdicts(resolved, expected, own_addresses, hosts_file_off=()):
    """Every node resolves every job node's name to the address the cluster uses.

    ``resolved``: source -> name -> ``{"addresses": [...]} or {"error": "..."}`` (getaddrinfo,
    in its order); ``expected``: name -> the address the cluster uses for it (the inventory
    address); ``own_addresses``: name -> every address of that node; ``hosts_file_off``: the
    nodes whose inventory says ``cluster_hosts_file: false`` (the site's DNS names them).
    """
    hosts_file_off = set(hosts_file_off or ())
    out = []
    for src in sorted(resolved):
        problems, notes, wrong = [], [], []
        for name in sorted(expected):
            res = resolved[src].get(name)
            want = expected[name]
            if want is None:
                notes.append("%s: the address the cluster uses for it is unknown, not compared" % name)
                continue
            if res is None:
                problems.append(("%s: not looked up" % name, None))
                continue
            addrs = res.get("addresses") or []
            if not addrs:
                problems.append(("%s does not resolve (%s)" % (name, res.get("error") or "no address"), None))
                wrong.append((name, want))
                continue
            first = addrs[0]
            mine = set(own_addresses.get(name) or [])
            if first == want:
                continue
            if name == src and _is_loopback(first):
                notes.append("its own name resolves to %s (loopback; NCCL and gloo use the interface set for "
                             "them, not this name)" % first)
            elif first in mine:
                notes.append("%s resolves to %s, another address of %s (the cluster uses %s)"
                             % (name, first, name, want))
            else:
                problems.append(("%s resolves to %s, not %s (the address the cluster uses)" % (name, first, want),
                                 "fix the entry for %s in /etc/hosts or DNS on %s (it should be %s)"
                                 % (name, src, want)))
                wrong.append((name, want))
        if wrong:
            problems.append(("", _names_fix(src, wrong, hosts_file_off)))
        if problems:
            out.append(verdict("names", src, FAIL, "; ".join(pr[0] for pr in problems if pr[0]),
                               "; ".join(pr[1] for pr in problems if pr[1]) or None))
        elif notes:
            out.append(verdict("names", src, WARN, "; ".join(notes)))
        else:
            out.append(verdict("names", src, PASS, "resolves %s" % ", ".join(sorted(expected))))
    return out


# --------------------------------------------------------------------------- clock

def clock_skew(probe):
    """(estimate, half-width, certain) in seconds from a probe bracketed by the controller's clock.

    The node read its clock somewhere between the controller's ``controller_before`` and
    ``controller_after``; the skew is at least ``certain`` whatever the latency was.
    """
    node = float(probe["time"])
    before, after = float(probe["controller_before"]), float(probe["controller_after"])
    if after < before:
        raise PreflightError("controller_after < controller_before")
    mid, half = (before + after) / 2.0, (after - before) / 2.0
    est = node - mid
    certain = max(0.0, node - after, before - node)
    return est, half, certain


def clock_verdicts(probes, bound):
    """Clock skew between the nodes: each node against the median of the nodes' clocks.

    Every node's offset from the controller is known within +/- half its probe's round trip; a
    node fails when it is certainly more than ``bound`` seconds from the median node, whatever
    the latencies were. A controller whose own clock is off only warns (the job does not use it).
    """
    if not probes:
        return []
    est = dict((h, clock_skew(probes[h])) for h in probes)
    offsets = [e[0] for e in est.values()]
    # An even count has no middle node: the controller's clock (offset 0) breaks the tie.
    ref = median(offsets + ([0.0] if len(offsets) % 2 == 0 else []))
    ref_half = max(e[1] for e in est.values())
    out = []
    for host in sorted(est):
        off, half, certain_ctl = est[host]
        dev = off - ref
        certain = max(0.0, abs(dev) - half - ref_half)
        detail = "%+.3f s from the nodes' median (+/- %.3f s); %+.3f s vs the controller" % (dev, half + ref_half, off)
        fix = "synchronise the clock of %s with the other nodes (chrony or systemd-timesyncd on every node)" % host
        if certain > bound:
            out.append(verdict("clock", host, FAIL, detail + ", over the bound of %g s" % bound, fix))
        elif abs(dev) + half + ref_half > bound:
            out.append(verdict("clock", host, WARN, detail + ": cannot confirm it is within %g s" % bound))
        elif certain_ctl > bound:
            out.append(verdict("clock", host, WARN, detail + ": the controller's clock is off (reports and leases "
                               "use the nodes' clocks)"))
        else:
            out.append(verdict("clock", host, PASS, detail))
    return out


def median(values):
    """The median of the numbers (the mean of the middle two for an even count); None for none."""
    values = [float(v) for v in values]
    return statistics.median(values) if values else None


# --------------------------------------------------------------------------- disks, memlock, accelerators

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


# --------------------------------------------------------------------------- the whole report

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


def rank_memlock(backend, coordinators, rank_hosts, probes, ssh):
    """The memlock limit (KiB) each rank node's ranks get: through an SSH login where the backend starts
    ranks over SSH (pdsh; read by ``ulimit -l`` over the coordinator's connection), else through
    Ansible's session (ssh-free)."""
    out = {}
    for host in rank_hosts:
        kib = None
        if backends.get(backend).ranks_over_ssh and coordinators:
            res = (ssh.get(coordinators[0]) or {}).get(host) or {}
            if int(res.get("rc", 1)) == 0:
                kib = _ulimit_kib(res.get("stdout"))
        if kib is None:
            kib = ((probes.get(host) or {}).get("memlock") or {}).get("soft")
        out[host] = kib
    return out


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


VERSION_COLUMNS = ("python", "torch", "cuda", "nccl", "deepspeed", "transformers", "trainer")
RESULT_PREFIX = "ALLREDUCE_RESULT "


def version_table(nodes, versions, gpus, workers):
    """The version table (as site.yml prints it): host, role, GPUs, then one column per version."""
    lines = ["%-14s%-8s%-26s" % ("host", "role", "gpus") + "".join("%-16s" % c for c in VERSION_COLUMNS)]
    for host in nodes:
        acc = gpus.get(host) or {}
        count = int(acc.get("count") or 0)
        gpu_text = "%d x %s" % (count, "/".join(acc.get("names") or [])) if count else "-"
        row = versions.get(host) or {}
        lines.append("%-14s%-8s%-26s" % (host, "worker" if host in workers else "coord", gpu_text)
                     + "".join("%-16s" % row.get(c, "?") for c in VERSION_COLUMNS))
    return "\n".join(lines)


def bandwidth_test(label, results, master):
    """One all-reduce test from every rank node's async result: ``{label, ok, error, raw}``.

    ``results``: host -> what ``async_status`` returned for ``multinode_ds.allreduce_perf`` on that node;
    global rank 0 (on ``master``) prints the result as its last ``ALLREDUCE_RESULT {json}`` line."""
    errors, raw = [], None
    for host in sorted(results):
        res = results[host] or {}
        if int(res.get("rc", 1) if res.get("rc") is not None else 1) != 0:
            text = (res.get("stderr") or res.get("msg") or "").strip()
            errors.append("%s: %s" % (host, " | ".join(text.splitlines()[-3:]) or "exit %s" % res.get("rc", "?")))
    for line in reversed(((results.get(master) or {}).get("stdout") or "").splitlines()):
        if line.startswith(RESULT_PREFIX):
            try:
                raw = json.loads(line[len(RESULT_PREFIX):])
            except ValueError:
                raw = None
            break
    return {"label": label, "ok": not errors, "error": "; ".join(errors), "raw": raw}


def gather(job, nodevars, workers=None):
    """The report's data from what the preflight role left in each node's variables.

    ``job``: the plan (module_utils/plan/job.py) with ``profile`` added; ``nodevars``: host -> its hostvars
    (``multinode_node``, ``multinode_accelerators``, ``multinode_fabric``, ``cluster_hosts_file``,
    ``preflight_probe``, ``preflight_node_link_gbps``, ``preflight_node_tcp_link_gbps``, ``preflight_bw``)."""
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
    data["version_table"] = version_table(nodes, data["versions"], dict(
        (h, hv[h].get("multinode_accelerators") or {}) for h in nodes), workers if workers is not None else ranks)
    return data


def retest_needed(job, nodevars, link_gbps=None, fractions=None):
    """Whether the job's RDMA profile failed its all-reduce test, so that a tcp test should say whether
    the fabric is to blame (``nodevars`` as for ``gather``; ``link_gbps``: preflight_link_gbps)."""
    backend = "nccl" if job.get("accelerator") == "cuda" else "gloo"
    profile = job.get("profile") or "tcp"
    if backend != "nccl" or profile not in RDMA_PROFILES:
        return False
    ranks = list(job["rank_hosts"])
    results = dict((h, ((nodevars.get(h) or {}).get("preflight_bw") or {}).get(profile)) for h in ranks)
    if any(r is None for r in results.values()):
        return False
    test = bandwidth_test(profile, results, job["master"])
    if link_gbps in (None, ""):
        link_gbps = job_link_gbps(dict((h, (nodevars.get(h) or {}).get("preflight_node_link_gbps")) for h in ranks))
    ratios = dict(DEFAULT_FRACTIONS)
    ratios.update(dict((k, float(v)) for k, v in (fractions or {}).items()))
    judged = judge_bandwidth(test, len(ranks), profile, backend, None if link_gbps is None else float(link_gbps),
                             ratios)
    return needs_fallback_test(profile, backend, judged)


# --------------------------------------------------------------------------- reuse of a passing preflight

# Variables of the ranks' environment that name one run, not the job's layout.
RUN_ONLY_ENV = ("MULTINODE_DS_RUN_ID", "MULTINODE_DS_RUN_DIR", "HF_TOKEN_PATH")


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
    return problems


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


def _answered(result):
    """A registered task result that ran (not skipped, not failed), else None."""
    if not isinstance(result, dict) or result.get("skipped") or result.get("failed") or result.get("unreachable"):
        return None
    return result


def evaluate(data, settings=None):
    """Every verdict of one preflight, the tables, the bandwidth judgement and the fallback advice."""
    cfg = dict(DEFAULTS)
    cfg.update(dict((k, v) for k, v in (settings or {}).items() if v not in (None, "")))
    # -e gives strings: every bound is a number from here on.
    for key in ("max_clock_skew", "min_free_gib_shared", "min_free_gib_local", "link_gbps", "min_memlock_kib"):
        if cfg.get(key) is not None:
            cfg[key] = float(cfg[key])
    fractions = dict(DEFAULT_FRACTIONS)
    fractions.update(dict((k, float(v)) for k, v in (cfg.get("bandwidth_fraction") or {}).items()))
    job = data["job"]
    backend, accel = job["backend"], job.get("accelerator") or "cpu"
    # CPU ranks talk gloo over TCP whatever RDMA the nodes have: judge them as tcp, with no memlock need.
    profile = (job.get("profile") or "tcp") if accel == "cuda" else "tcp"
    coords = list(job.get("coordinators") or [])
    slots = dict(job["rank_hosts"])
    ranks = list(slots)
    nodes = coords + [h for h in ranks if h not in coords]
    probes = dict((h, p) for h, p in (data.get("probes") or {}).items() if _answered(p))
    # The SSH results as node_probe registered them (host -> result with "ssh"), or host -> target -> result.
    ssh = dict((h, (r.get("ssh") if "ssh" in r else r)) for h, r in (data.get("ssh") or {}).items() if _answered(r))

    verdicts = []
    verdicts += version_verdicts(data.get("versions") or {}, ranks, coords)
    required = ssh_required_pairs(backend, coords, ranks)
    verdicts += ssh_verdicts(ssh, required, backend)
    port = normalize_port(data["port"]) if data.get("port") else {}
    if port:
        verdicts += port_verdicts(job["master"], job["master_port"], port["listener"], port["probes"])
    resolved = dict((h, (probes.get(h) or {}).get("resolved") or {}) for h in nodes if h in probes)
    verdicts += name_verdicts(resolved, data.get("expected_addresses") or {}, data.get("own_addresses") or {},
                              [h for h, on in (data.get("hosts_file") or {}).items() if not flag(on)])
    clocked = dict((h, probes[h]) for h in nodes if h in probes and "controller_before" in probes[h])
    verdicts += clock_verdicts(clocked, float(cfg["max_clock_skew"]))
    paths = {"shared": job["shared_dir"], "local": job["local_dir"]}
    verdicts += disk_verdicts(dict((h, probes[h]) for h in nodes if h in probes), paths,
                              {"shared": cfg["min_free_gib_shared"], "local": cfg["min_free_gib_local"]})
    verdicts += memlock_verdicts(rank_memlock(backend, coords, ranks, probes, ssh), profile, cfg.get("min_memlock_kib"))
    verdicts += accelerator_verdicts(slots, data.get("gpus") or {}, accel)
    verdicts += [verdict(v["check"], v["host"], v["status"], v["detail"], v.get("fix"))
                 for v in data.get("backend_verdicts") or []]
    missing = [h for h in nodes if h not in probes]
    for host in missing:
        verdicts.append(verdict("probe", host, FAIL, "the node did not answer the probe",
                                "check that Ansible reaches %s" % host))

    link = cfg.get("link_gbps")
    if link is None:
        speeds = data.get("link_gbps") if accel == "cuda" else data.get("tcp_link_gbps", data.get("link_gbps"))
        link = job_link_gbps(dict((h, (speeds or {}).get(h)) for h in ranks))
    bw = data.get("bandwidth") or {}
    bw_backend = "nccl" if accel == "cuda" else "gloo"
    nnodes = len(ranks)
    primary = fallback = advice = None
    if bw.get("primary"):
        primary = judge_bandwidth(bw["primary"], nnodes, profile, bw_backend, link, fractions)
        verdicts.append(verdict("bandwidth", ",".join(ranks), primary["status"],
                                "%s: %s" % (primary["label"], primary["reason"]),
                                None if primary["status"] != FAIL else
                                "see the bandwidth table; check the links between %s" % ", ".join(ranks)))
    elif port and port["listener"]["rc"] != 0:
        verdicts.append(verdict("bandwidth", ",".join(ranks), SKIP, "not run: the master port is not free"))
    elif not flag(cfg.get("bandwidth", True)):
        verdicts.append(verdict("bandwidth", ",".join(ranks), SKIP, "not run (preflight_bandwidth=false)"))
    else:
        verdicts.append(verdict("bandwidth", ",".join(ranks), FAIL, "the all-reduce test gave no result",
                                "see the play's output above for the node that failed"))
    if bw.get("fallback"):
        # The tcp retest is judged against the Ethernet side's speed (preflight_link_gbps is the job profile's link).
        tcp_link = job_link_gbps(dict((h, (data.get("tcp_link_gbps") or {}).get(h)) for h in ranks))
        fallback = judge_bandwidth(bw["fallback"], nnodes, "tcp", bw_backend, tcp_link, fractions)
        others = [v for v in verdicts if v["status"] == FAIL and v["check"] != "bandwidth"]
        # Other failures (versions, GPUs, ports...) break both tests alike: no fabric advice then.
        advice = None if others else fallback_advice(profile, primary, fallback, ranks)
        if advice:
            for v in verdicts:
                if v["check"] == "bandwidth" and v["status"] == FAIL:
                    v["fix"] = advice["message"]

    tables = {"ssh": ssh_matrix_table(nodes, ssh, required) if required else
              "SSH: not needed by backend %s" % backend,
              "verdicts": format_verdicts(verdicts)}
    if primary is not None:
        tables["bandwidth"] = format_bandwidth_table(
            primary["rows"], "all_reduce %s (%s, %d ranks on %d nodes): %s"
            % (primary["label"], bw_backend, int((bw["primary"].get("raw") or {}).get("world_size") or 0),
               nnodes, primary["status"].upper()))
    if fallback is not None:
        tables["bandwidth_tcp"] = format_bandwidth_table(fallback["rows"], "all_reduce tcp (fallback test): %s"
                                                         % fallback["status"].upper())
    summary = summarize(verdicts)
    return {"status": summary["status"], "verdicts": verdicts, "findings": findings(verdicts),
            "warnings": ["%s on %s: %s" % (v["check"], v["host"], v["detail"]) for v in summary["warnings"]],
            "bandwidth": {"primary": primary, "fallback": fallback, "link_gbps": link, "fractions": fractions},
            "advice": advice, "tables": tables, "settings": cfg}
