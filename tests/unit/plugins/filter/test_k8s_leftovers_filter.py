"""The k8s_leftovers filter over k8s_info's registered results (what the backend role's start step passes it)."""
import time

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.multinode.deepspeed.plugins.filter.k8s_leftovers import FilterModule
from ansible_collections.multinode.deepspeed.plugins.module_utils.launch.backends.kubernetes import objects as k8s

leftovers = FilterModule().filters()["k8s_leftovers"]


def stamp(seconds_ago):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - seconds_ago))


def test_the_registered_results_give_the_dead_runs_and_keep_this_one():
    services = {"resources": [
        {"metadata": {"name": n, "creationTimestamp": stamp(600), "annotations": {k8s.DEADLINE_ANNOTATION: "61"}}}
        for n in ("mnds-dead", "mnds-me")]}
    found = leftovers(services, {"resources": []}, ["mnds-me"])
    assert [f["name"] for f in found] == ["mnds-dead"] and "deadline" in found[0]["reason"]
    # A read that failed (failed_when: false) names nothing.
    assert leftovers({"failed": True, "msg": "forbidden"}, {}) == []


def test_a_result_of_the_wrong_shape_is_a_filter_error():
    with pytest.raises(AnsibleFilterError, match="k8s_leftovers"):
        leftovers({"resources": ["not a dict"]}, {"resources": []})
