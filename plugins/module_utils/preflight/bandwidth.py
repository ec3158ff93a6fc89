# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Preflight: how fast can the rank nodes talk, and is it fast enough for their links?

An all-reduce test (``multinode_ds.allreduce_perf`` on every rank node) is judged against the slowest
rank node's link speed, from its fabric facts: the large-message bus bandwidth must reach a share of
it per NCCL profile (``DEFAULT_FRACTIONS``).  When an RDMA profile fails, a tcp retest says whether
the fabric is to blame, and which variable to pin.

The bandwidth arithmetic follows nccl-tests' all_reduce_perf: algorithm bandwidth is
bytes / time, bus bandwidth is algbw x 2(n-1)/n for an all-reduce over n ranks (the
traffic each link carries in a ring), comparable with the link speed.
Pure functions, no Ansible import.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json

from ansible_collections.multinode.deepspeed.plugins.module_utils.preflight.verdicts import FAIL, PASS, RDMA_PROFILES, SKIP, WARN, PreflightError, verdict

# The share of the link speed the large-message bus bandwidth must reach, per NCCL profile
# (gloo: the CPU backend, which is bounded by memory copies and a single TCP stream).
DEFAULT_FRACTIONS = {"ib": 0.5, "roce": 0.4, "tcp": 0.3, "gloo": 0.05}

# What starts the line on which global rank 0 prints the test's result (``bandwidth_test`` reads it).
RESULT_PREFIX = "ALLREDUCE_RESULT "


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


def bandwidth_verdict(primary, ranks, port, enabled):
    """The bandwidth check's one verdict: the judged test's (``primary``: a ``judge_bandwidth`` result, None:
    no test ran), else why no test ran: the master port was not free (``port``: ``normalize_port``'s result,
    or empty), ``enabled`` (preflight_bandwidth) is false; else a failure, never a silent pass."""
    hosts = ",".join(ranks)
    if primary is not None:
        return verdict("bandwidth", hosts, primary["status"], "%s: %s" % (primary["label"], primary["reason"]),
                       None if primary["status"] != FAIL else
                       "see the bandwidth table; check the links between %s" % ", ".join(ranks))
    if port and port["listener"]["rc"] != 0:
        return verdict("bandwidth", hosts, SKIP, "not run: the master port is not free")
    if not enabled:
        return verdict("bandwidth", hosts, SKIP, "not run (preflight_bandwidth=false)")
    return verdict("bandwidth", hosts, FAIL, "the all-reduce test gave no result",
                   "see the play's output above for the node that failed")


def fabric_advice(verdicts, profile, primary, fallback, hosts):
    """``fallback_advice`` for the tcp retest (``fallback``: None when none ran), but only when nothing but the
    bandwidth failed: other failures (versions, GPUs, ports...) break both tests alike."""
    if fallback is None or [v for v in verdicts if v["status"] == FAIL and v["check"] != "bandwidth"]:
        return None
    return fallback_advice(profile, primary, fallback, hosts)
