from pathlib import Path

import pytest

from ansible_collections.multinode.deepspeed.plugins.module_utils.run.diagnose import (
    diagnose, first_failure, version_mismatch)

FIXTURES = Path(__file__).resolve().parents[4] / "fixtures" / "logs"
LAYOUT = [{"name": "worker1", "slots": 1, "first_rank": 0}, {"name": "worker2", "slots": 1, "first_rank": 1}]


def ids(findings):
    return [f["id"] for f in findings]


def test_sigkilled_rank_is_found_first_with_its_global_rank():
    text = (FIXTURES / "pdsh_sigkill.log").read_text()
    failure = first_failure({"coord": text}, LAYOUT)
    assert failure["host"] == "worker2" and failure["rank"] == 1
    assert failure["exit_code"] == -9 and failure["signal"] == "SIGKILL"
    found = diagnose({"launcher.log": text})
    killed = [f for f in found if f["id"] == "killed"][0]
    assert killed["signal"] == "SIGKILL" and "out-of-memory killer" in killed["cause"]


def test_local_rank_maps_to_global_rank_on_multi_slot_hosts():
    layout = [{"name": "a", "slots": 4, "first_rank": 0}, {"name": "b", "slots": 4, "first_rank": 4}]
    line = "b: [ERROR] [launch.py:259:sigkill_handler] ['python', '-u', 'x.py', '--local_rank=2'] exits with return code = 1"
    assert first_failure({"coord": line}, layout)["rank"] == 6
    # A node's own launcher log (ssh-free backend) carries no host prefix: the key names the host.
    line = "[ERROR] [launch.py:259:sigkill_handler] ['python', '-u', 'x.py', '--local_rank=3'] exits with return code = 2"
    assert first_failure({"a": line}, layout)["rank"] == 3


def test_clean_exit_is_no_failure():
    assert first_failure({"coord": "w1: ... exits with return code = 0"}, LAYOUT) is None


def test_ibv_modify_qp_from_the_field_notes():
    found = diagnose({"logs/rank0.log": (FIXTURES / "ibv_modify_qp.log").read_text()})
    assert ids(found)[0] == "rdma-init"
    assert "NCCL_IB_DISABLE=1" in found[0]["remedy"] and "NCCL_SOCKET_IFNAME" in found[0]["remedy"]
    assert "ibv_modify_qp" in found[0]["line"]


@pytest.mark.parametrize("rule", ["cuda-oom", "invalid-device", "port-in-use", "ssh-permission", "ssh-hostkey",
                                  "missing-module", "hostfile-fallback", "collective-timeout"])
def test_each_known_pattern_is_recognised(rule):
    found = diagnose({"misc.log": (FIXTURES / "misc_failures.log").read_text()})
    assert rule in ids(found)


def test_missing_module_names_the_module():
    found = diagnose({"x": "ModuleNotFoundError: No module named 'flash_attn'"})
    assert found[0]["module"] == "flash_attn"


def test_healthy_log_has_no_findings():
    assert diagnose({"ok.log": "multinode_ds: step 30/30 loss 2.9\nrank 0 finished"}) == []


def test_version_mismatch_between_nodes():
    versions = {"w1": {"deepspeed": "0.19.8", "torch": "2.13.0"}, "w2": {"deepspeed": "0.19.7", "torch": "2.13.0"}}
    assert version_mismatch(versions) == ["deepspeed: 0.19.7 on w2, 0.19.8 on w1"]
    assert "version-mismatch" in ids(diagnose({}, versions))


def test_a_deepspeed_config_assertion_in_a_rank_log_is_worded_with_the_key_and_the_fix():
    """A config built in the user's own code fails inside deepspeed.initialize: the rank's traceback (a real one,
    tests/fixtures/ds_config/) gets the same message and fix as the check before launch."""
    text = (FIXTURES.parent / "ds_config" / "rank0_batch_assertion.log").read_text()
    found = [f for f in diagnose({"logs/rank0.log": text}) if f["id"] == "ds-config"]
    assert len(found) == 1
    assert found[0]["key"] == "train_batch_size"
    assert found[0]["cause"].startswith("ds_config: train_batch_size 32 \u2260 micro batch 4 \u00d7 accumulation 2")
    assert "set train_batch_size to" in found[0]["remedy"]


def test_deepspeeds_pydantic_refusal_in_a_rank_log_names_the_section_key_and_the_fix():
    """ZeRO stage 7 in a script's own config: pydantic's three lines in the rank's traceback (a real one)."""
    text = (FIXTURES.parent / "ds_config" / "rank0_zero_stage.log").read_text()
    for log in (text, "\n".join("worker1: " + line for line in text.splitlines())):  # a rank's log, pdsh's
        found = [f for f in diagnose({"logs/rank0.log": log}) if f["id"] == "ds-config"]
        assert len(found) == 1 and found[0]["key"] == "zero_optimization.stage"
        assert found[0]["cause"].startswith("ds_config: zero_optimization.stage 7: Input should be 0, 1, 2, 3")
        assert found[0]["remedy"] == "set zero_optimization.stage to one of 0, 1, 2, 3"


def test_a_batch_size_given_as_text_in_a_rank_log_is_the_configs():
    text = (FIXTURES.parent / "ds_config" / "rank0_batch_text.log").read_text()
    found = [f for f in diagnose({"logs/rank0.log": text}) if f["id"] == "ds-config"]
    assert len(found) == 1 and found[0]["key"] == "train_batch_size"
    assert "sixteen" in found[0]["remedy"]
    # The same TypeError from the script's own code is not the config's.
    own = ('  File "/shared/w/train.py", line 9, in main\n    steps = args.steps // 2\n'
           "TypeError: unsupported operand type(s) for //: 'str' and 'int'\n")
    assert "ds-config" not in ids(diagnose({"logs/rank0.log": own}))
