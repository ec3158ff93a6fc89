"""Preflight's clock check (module_utils/preflight/clock.py): the skew bracketed by the controller's clock,
judged between the nodes."""
import pytest

from ansible_collections.multinode.deepspeed.plugins.module_utils.preflight.clock import clock_skew, clock_verdicts
from ansible_collections.multinode.deepspeed.plugins.module_utils.preflight.verdicts import PreflightError

from tests.unit.plugins.module_utils.preflight.preflight_data import by_host


def probe_at(node, before, after):
    return {"time": node, "controller_before": before, "controller_after": after}


def test_clock_skew_arithmetic():
    est, half, certain = clock_skew(probe_at(1010.25, 1000.0, 1000.5))
    assert est == pytest.approx(10.0) and half == pytest.approx(0.25) and certain == pytest.approx(9.75)
    est, half, certain = clock_skew(probe_at(996.0, 1000.0, 1002.0))     # behind
    assert est == pytest.approx(-5.0) and half == pytest.approx(1.0) and certain == pytest.approx(4.0)
    assert clock_skew(probe_at("1000.1", "1000", "1000.2"))[2] == 0.0       # strings as Ansible may pass


def test_clock_within_bracket_passes():
    res = clock_verdicts({"w1": probe_at(1000.1, 1000.0, 1000.2)}, 2.0)
    assert res[0]["status"] == "pass" and res[0]["check"] == "clock" and res[0]["fix"] is None
    assert res[0]["detail"] == "+0.000 s from the nodes' median (+/- 0.200 s); +0.000 s vs the controller"


def test_clock_ten_seconds_ahead_fails():
    res = clock_verdicts({"w2": probe_at(1010.25, 1000.0, 1000.5), "w1": probe_at(1000.1, 1000.0, 1000.2)},
                         2.0)
    assert [v["host"] for v in res] == ["w1", "w2"]
    assert res[1]["status"] == "fail" and "+10.000 s" in res[1]["detail"] and "bound of 2 s" in res[1]["detail"]
    assert "chrony" in res[1]["fix"] and "w2" in res[1]["fix"]


def test_clock_uncertain_over_the_bound_warns():
    # Read 1.5 s after the bracket's middle with a 4 s bracket: maybe skewed, maybe latency.
    res = clock_verdicts({"w1": probe_at(1003.5, 1000.0, 1004.0)}, 2.0)
    assert res[0]["status"] == "warn" and "cannot confirm it is within 2 s" in res[0]["detail"]


def test_clock_bracket_backwards_raises():
    with pytest.raises(PreflightError, match="controller_after < controller_before"):
        clock_skew(probe_at(1000.0, 1000.5, 1000.0))


def test_clock_skew_is_judged_between_the_nodes_not_against_the_controller():
    # Every node 30 s ahead of the controller, in step with each other: the job is fine.
    probes = dict((h, probe_at(1030.1, 1000.0, 1000.2)) for h in ("w1", "w2", "w3"))
    res = clock_verdicts(probes, 2.0)
    assert [v["status"] for v in res] == ["warn"] * 3 and "controller's clock is off" in res[0]["detail"]
    # One node 5 s off the other two: only it fails.
    probes["w2"] = probe_at(1035.1, 1000.0, 1000.2)
    res = by_host(clock_verdicts(probes, 2.0))
    assert res["w2"]["status"] == "fail" and res["w1"]["status"] != "fail" and res["w3"]["status"] != "fail"
