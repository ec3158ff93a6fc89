"""The venv runs the chosen stack, the op is prebuilt, and the GPU path follows the fixture's driver."""
import json
import os
import re
import subprocess
from pathlib import Path

INVENTORY = os.environ["MOLECULE_INVENTORY_FILE"]
# podman exec straight into the node (much faster than an ansible run per command).
testinfra_hosts = ["podman://mndsm-stack-worker1"]
PY = "/opt/multinode-deepspeed/venv/bin/python"


def test_venv_runs_the_chosen_stack(host):
    code = ("import json, torch, deepspeed, transformers, multinode_ds; "
            "print(json.dumps([torch.__version__, deepspeed.__version__, transformers.__version__]))")
    res = host.run("%s -c %s", PY, code)
    assert res.rc == 0, res.stderr
    torch_v, ds_v, tf_v = json.loads(res.stdout.strip().splitlines()[-1])
    assert torch_v.startswith("2.13.0") and ds_v == "0.19.8" and tf_v == "5.23.0"
    record = json.loads(host.file("/etc/multinode-deepspeed/stack.json").content_string)
    assert record["build"] == "cpu" and record["accelerator"] == "cpu"
    assert record["versions"]["torch"] == torch_v and record["versions"]["deepspeed"] == ds_v
    assert "torch==2.13.0" in record["packages"] and "deepspeed==0.19.8" in record["packages"]


def test_deepspeed_op_is_built_on_the_node(host):
    built = host.run("ls /opt/multinode-deepspeed/torch_extensions/*/*.so")
    assert built.rc == 0 and "deepspeed_shm_comm" in built.stdout, built.stdout + built.stderr
    # Loading it again compiles nothing (it is current).
    # The environment a rank gets: the venv's bin (ninja) first on PATH, the node-local extensions dir.
    code = "from deepspeed.accelerator import get_accelerator as g; g().create_op_builder('ShareMemCommBuilder').load(verbose=True)"
    res = host.run("cd /tmp && env PATH=/opt/multinode-deepspeed/venv/bin:/usr/bin:/bin DS_ACCELERATOR=cpu "
                   "TORCH_EXTENSIONS_DIR=/opt/multinode-deepspeed/torch_extensions %s -c %s 2>&1", PY, code)
    assert res.rc == 0, res.stdout
    # ninja finds the op current ("no work to do") instead of compiling it.
    assert "no work to do" in res.stdout and "Building extension module" not in res.stdout, res.stdout


def test_trainer_plans_a_run(host):
    res = host.run(PY + " -m multinode_ds.train --dry-run --model llama-tiny --run-dir /tmp/plan --world-size 2")
    assert res.rc == 0, res.stderr
    assert json.loads(res.stdout.splitlines()[-1])["model"] == "llama-tiny"


def select(*extra):
    playbook = Path(__file__).resolve().parents[1] / "select.yml"
    cmd = ["ansible-playbook", "-i", INVENTORY, str(playbook)]
    for e in extra:
        cmd += ["-e", e]
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)


def test_gpu_fixture_node_gets_the_newest_build_its_driver_runs(host):
    # A30 with driver 535.183.01 (CUDA 12.2): nothing newer than cu121 builds can run there.
    res = select("stack_torch_version=")
    assert res.returncode == 0, res.stdout[-3000:]
    chosen = re.search(r"CHOSEN (cu\d+) (.*) toolkit (\d+-\d+)", res.stdout)
    assert chosen, res.stdout[-3000:]
    build, packages, toolkit = chosen.groups()
    assert build.startswith("cu") and int(build[2:]) <= 122, build
    assert toolkit.replace("-", "") == build[2:]
    assert "+" + build in packages and "deepspeed==0.19.8" in packages
    assert re.search(r"mndsm-stack-a30\s+3\.11\.\d+\s+cuda\s+535\.183\.01\s+12\.2", res.stdout)


def test_gpu_fixture_node_refuses_a_torch_pin_its_driver_cannot_run(host):
    res = select("stack_torch_version=2.13.0")
    assert res.returncode != 0
    flat = " ".join(res.stdout.split())
    assert "mndsm-stack-a30: stack_torch_version 2.13.0 needs driver >= 560.28.03" in flat, res.stdout[-3000:]
    assert "Fix: upgrade the NVIDIA driver on mndsm-stack-a30" in flat
