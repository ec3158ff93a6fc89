"""The DeepSpeed ops a config makes the engine load (plan/dsops.py), checked against DeepSpeed's engine itself; the
node step's argv, its report worded, and the bounded call every node step goes through."""
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ansible_collections.multinode.deepspeed.plugins.module_utils.plan import dsops
from multinode_ds import ds_config as trainer_config

ROOT = Path(__file__).resolve().parents[5]
FIXTURES = ROOT / "tests" / "fixtures" / "ds_config"
CASES = dict((k, v) for k, v in json.loads((FIXTURES / "ops_cases.json").read_text()).items() if not k.startswith("_"))


def builders(config, bundled=False):
    return [op["builder"] for op in dsops.needed(config, bundled=bundled)]


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_ops_of_each_config(name):
    assert builders(CASES[name]["config"]) == CASES[name]["builders"]


def test_the_field_notes_corrected_config_needs_cpu_adam():
    config = json.loads((FIXTURES / "field_notes_corrected.json").read_text())
    assert dsops.needed(config) == [{
        "builder": "CPUAdamBuilder", "op": "cpu_adam",
        "why": "optimizer Adam with zero_optimization.offload_optimizer.device cpu (DeepSpeed's CPU Adam)"}]


def test_the_bundled_trainer_lets_deepspeed_build_adamw_where_the_optimizer_is_offloaded():
    offload = {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}
    assert builders(offload, bundled=True) == ["CPUAdamBuilder"]
    # offload_optimizer there, device none: still DeepSpeed's AdamW (train.py deepspeed_builds_optimizer), on the
    # accelerator: FusedAdam.
    assert builders({"zero_optimization": {"offload_optimizer": {"device": "none"}}}, bundled=True) == [
        "FusedAdamBuilder"]
    # No optimizer and no offload: the trainer's own torch AdamW.
    assert builders({"zero_optimization": {"stage": 2}}, bundled=True) == []


def test_the_trainers_generated_configs_need_nothing_a_cpu_node_lacks():
    """The stack role prebuilds ShareMemCommBuilder on CPU workers and FusedAdam and CPU Adam on GPU workers: the
    bundled trainer's own configs (multinode_ds/ds_config.py) need nothing else."""
    cpu = trainer_config.generate(10 ** 6, 2, accelerator="cpu")
    assert builders(cpu, bundled=True) == []
    gpu_offload = trainer_config.generate(10 ** 10, 2, accelerator="gpu", device_memory_gib=1)
    assert "offload_optimizer" in gpu_offload["zero_optimization"]
    assert builders(gpu_offload, bundled=True) == ["CPUAdamBuilder"]
    gpu = trainer_config.generate(10 ** 6, 2, accelerator="gpu", device_memory_gib=80)
    assert builders(gpu, bundled=True) == []


def test_odd_configs_need_nothing_and_do_not_fail():
    for config in ({}, None, {"optimizer": "Adam"}, {"zero_optimization": 2}, {"optimizer": {"type": None}},
                   {"zero_optimization": {"offload_optimizer": "cpu"}}):
        assert builders(config) == []


# DeepSpeed's engine on one CPU process, every op load recorded and stopped there: what the mapping must agree with.
PROBE = r"""
import json, os, sys
import torch, deepspeed
import deepspeed.comm.torch
from deepspeed.ops.op_builder.builder import OpBuilder

class Stop(Exception):
    pass

loaded = []
def load(self, verbose=False):
    loaded.append(type(self).__name__)
    raise Stop()

OpBuilder.load = load
sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None  # the comm op: not the config's
deepspeed.init_distributed(dist_backend="gloo")
out = {}
for name, config in json.loads(sys.argv[1]).items():
    del loaded[:]
    model = torch.nn.Linear(4, 4)
    try:
        deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
        result = "ok"
    except Stop:
        result = "stopped"
    except Exception as exc:
        result = "%s: %s" % (type(exc).__name__, str(exc).splitlines()[0])
    out[name] = {"loaded": list(loaded), "result": result}
print("PROBE " + json.dumps(out))
"""


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_the_mapping_is_what_deepspeeds_engine_loads(tmp_path):
    pytest.importorskip("deepspeed")
    configs = dict((k, v["config"]) for k, v in CASES.items() if v["engine"])
    env = dict(os.environ, DS_ACCELERATOR="cpu", RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()), TORCH_EXTENSIONS_DIR=str(tmp_path / "ext"))
    res = subprocess.run([sys.executable, "-c", PROBE, json.dumps(configs)], env=env, capture_output=True, text=True,
                         timeout=300, check=False)
    line = [x for x in res.stdout.splitlines() if x.startswith("PROBE ")]
    assert line, res.stderr[-3000:]
    probed = json.loads(line[0][len("PROBE "):])
    for name, config in configs.items():
        expected = builders(config)
        if CASES[name].get("cpu_lacks"):
            # The CPU accelerator has no such op: its engine refuses the config (ds_check says so before launch).
            assert probed[name]["result"].startswith("ValueError: This op had not been implemented"), (name, probed)
            assert len(expected) == 1
        else:
            assert probed[name]["loaded"] == expected, (name, probed[name])


def test_ds_check_gets_the_ops_and_for_the_bundled_trainer_its_arguments():
    ops = dsops.needed(CASES["adam_offload_cpu"]["config"])
    assert dsops.check_args(ops, "/shared/w/train.py", ["--x"]) == ["--op", "CPUAdamBuilder"]
    assert dsops.check_args([], "", ["--micro-batch", "2"]) == ["--bundled", "--", "--micro-batch", "2"]


def test_the_node_steps_argv():
    ops = dsops.needed(CASES["nvme_optimizer_and_params"]["config"])
    assert dsops.ops_argv("/opt/v/", "/opt/ext", ops, 1770) == [
        "/opt/v/bin/python", "-m", "multinode_ds.ops_ready", "--extensions-dir", "/opt/ext", "--wait", "1770", "--json",
        "--op", "cpu_adam=CPUAdamBuilder", "--op", "async_io=AsyncIOBuilder"]


def test_the_node_steps_report_is_worded_with_the_node_the_op_and_the_fix():
    report = {"removed": [{"path": "/opt/ext/cpu_adam/lock", "why": "left by a build that did not end"}],
              "built": [{"op": "cpu_adam", "builder": "CPUAdamBuilder", "seconds": 97.4}], "ready": ["fused_adam"],
              "problems": [{"op": "fused_lamb", "builder": "FusedLambBuilder",
                            "message": "DeepSpeed's fused_lamb (FusedLambBuilder) does not exist for the cpu "
                                       "accelerator"}]}
    lines, problems = dsops.ops_result(json.dumps(report), "worker1", "cpu")
    assert lines == ["worker1: removed the stale build lock /opt/ext/cpu_adam/lock (left by a build that did not "
                     "end)", "worker1: built DeepSpeed's cpu_adam in 97 s", "worker1: fused_adam was built already"]
    assert problems == [
        "worker1: DeepSpeed's fused_lamb (FusedLambBuilder) does not exist for the cpu accelerator \u2014 change the "
        "config so that it does not need fused_lamb (for an optimizer: \"torch_adam\": true in the optimizer's "
        "params, or a torch.optim class name), or provision it: add FusedLambBuilder to stack_ops.cpu in your "
        "inventory and run site.yml"]


def test_a_node_step_without_a_report_says_what_it_printed_last():
    assert dsops.ops_result("", "worker2", err="Traceback...\nImportError: no deepspeed\n") == (
        [], ["worker2: the DeepSpeed ops step gave no result: ImportError: no deepspeed"])
    assert dsops.ops_result("[1]", "worker2")[1] == ["worker2: the DeepSpeed ops step gave no result: [1]"]


def test_call_gives_the_output_and_stops_a_command_past_its_time():
    assert dsops.call([sys.executable, "-c", "import sys; print(sys.stdin.read().upper())"], data="ab") == (
        0, "AB\n", "", False)
    start = time.time()
    rc, _out, _err, timed_out = dsops.call(
        [sys.executable, "-c", "import subprocess; subprocess.run(['sleep', '60'])"], timeout=1)
    assert timed_out and rc is not None and time.time() - start < 15
    assert dsops.call(["/nonexistent/python"])[0] is None


def test_a_node_package_older_than_the_collection_says_run_site_yml():
    err = "/opt/multinode-deepspeed/venv/bin/python: No module named multinode_ds.ops_ready\n"
    assert dsops.ops_result("", "worker1", err=err)[1] == [
        "worker1: the node package there has no multinode_ds.ops_ready (it is older than the collection) \u2014 run "
        "site.yml (it copies the package to every node)"]
