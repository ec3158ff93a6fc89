"""Preflight's stack check (module_utils/preflight/versions.py): the rank nodes share one build, the
coordinator its common keys, and the odd node out is blamed."""
import pytest

from ansible_collections.multinode.deepspeed.plugins.module_utils.preflight.versions import version_verdicts

from tests.unit.plugins.module_utils.preflight.preflight_data import STACK, CPU_COORD, by_host


def test_versions_cpu_coordinator_with_gpu_workers_pass():
    res = version_verdicts({"coord": CPU_COORD, "w1": STACK, "w2": dict(STACK)}, ["w1", "w2"], ["coord"])
    assert [v["host"] for v in res] == ["w1", "w2", "coord"]
    assert all(v["status"] == "pass" and v["check"] == "versions" for v in res)
    assert "torch" not in by_host(res)["coord"]["detail"] and "deepspeed 0.19.8" in by_host(res)["coord"]["detail"]
    assert "torch 2.13.0+cu128" in by_host(res)["w2"]["detail"]


def test_versions_worker_with_another_deepspeed_fails():
    res = by_host(version_verdicts({"coord": CPU_COORD, "w1": STACK, "w2": dict(STACK, deepspeed="0.19.7")},
                                   ["w1", "w2"], ["coord"]))
    assert res["w1"]["status"] == "pass" and res["coord"]["status"] == "pass"
    assert res["w2"]["status"] == "fail"
    assert res["w2"]["detail"] == "differs: deepspeed 0.19.7 (w1 has 0.19.8)"
    assert "site.yml" in res["w2"]["fix"] and "w2" in res["w2"]["fix"]


def test_versions_worker_with_a_cpu_torch_fails_on_rank_keys():
    res = by_host(version_verdicts({"w1": STACK, "w2": CPU_COORD}, ["w1", "w2"], []))
    assert res["w2"]["status"] == "fail"
    for key in ("torch 2.13.0+cpu", "cuda None", "nccl None"):
        assert key in res["w2"]["detail"]


def test_versions_coordinator_differing_on_a_common_key_fails():
    res = by_host(version_verdicts({"coord": dict(CPU_COORD, transformers="4.56.0"), "w1": STACK},
                                   ["w1"], ["coord"]))
    assert res["coord"]["status"] == "fail" and "transformers 4.56.0 (w1 has 4.57.1)" in res["coord"]["detail"]


@pytest.mark.parametrize("value, why", [({"error": "no venv at /opt/multinode-deepspeed/venv"},
                                         "no venv at /opt/multinode-deepspeed/venv"),
                                        ("python not found", "python not found"),
                                        (None, "no answer")])
def test_versions_unreadable_fail(value, why):
    versions = {"w1": STACK, "w2": value}
    if value is None:
        del versions["w2"]
    res = by_host(version_verdicts(versions, ["w1", "w2"], []))
    assert res["w2"]["status"] == "fail"
    assert res["w2"]["detail"] == "cannot read the stack's versions: %s" % why
    assert "site.yml" in res["w2"]["fix"] and "w2" in res["w2"]["fix"]


def test_versions_coordinator_that_is_also_a_worker_is_judged_once():
    res = version_verdicts({"w1": STACK, "w2": STACK}, ["w1", "w2"], ["w1"])
    assert [v["host"] for v in res] == ["w1", "w2"]


def test_versions_compare_with_the_first_readable_worker():
    good = {"python": "3.11.2", "torch": "2.13.0", "cuda": "none", "nccl": "none", "deepspeed": "0.19.8",
            "transformers": "5.23.0", "trainer": "0.1.0"}
    out = version_verdicts({"w1": {"error": "no venv"}, "w2": good, "w3": dict(good, deepspeed="0.1")},
                           ["w1", "w2", "w3"], [])
    assert [(v["host"], v["status"]) for v in out] == [("w1", "fail"), ("w2", "pass"), ("w3", "fail")]
    assert "w2 has 0.19.8" in out[2]["detail"]


def test_versions_blame_the_odd_node_out_even_when_it_is_the_first():
    odd = dict(STACK, deepspeed="0.19.7")
    res = by_host(version_verdicts({"w1": odd, "w2": STACK, "w3": STACK}, ["w1", "w2", "w3"], []))
    assert [res[h]["status"] for h in ("w1", "w2", "w3")] == ["fail", "pass", "pass"]
    assert res["w1"]["detail"] == "differs: deepspeed 0.19.7 (w2, w3 have 0.19.8)"
