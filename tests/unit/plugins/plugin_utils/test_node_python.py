"""plugin_utils/node_python: a module_utils function run in a plain Python start, as on a node without Ansible."""
import json
import subprocess
import sys

import pytest

from ansible_collections.multinode.deepspeed.plugins.module_utils.provision import node_read
from ansible_collections.multinode.deepspeed.plugins.plugin_utils import node_python
from tests.unit.plugins.module_utils.provision.test_node import DISTS, make_venv

UTILS = "ansible_collections.multinode.deepspeed.plugins.module_utils."


def run_isolated(code):
    """The script's output from a Python that cannot import Ansible or the collection (-I: no PYTHONPATH, no user
    site; -S: no site-packages), as on a bare node."""
    proc = subprocess.run([sys.executable, "-I", "-S", "-"], input=code, capture_output=True, text=True, check=False)
    return proc.returncode, proc.stdout, proc.stderr


def params(tmp_path, **extra):
    env = tmp_path / "deepspeed_env"
    env.write_text("NCCL_IB_DISABLE=1\nGLOO_SOCKET_IFNAME=eth0\n")
    venv, lib = make_venv(tmp_path, DISTS)
    out = {"paths": [str(env), str(tmp_path / "missing")], "venv": venv, "trainer_dir": lib,
           "nvidia_smi": str(tmp_path / "no-nvidia-smi"), "user": "root", "record": None, "port": ""}
    out.update(extra)
    return out


def test_the_script_needs_no_ansible_and_gives_what_the_function_gives(tmp_path):
    checked = params(tmp_path)
    rc, out, err = run_isolated(node_python.script(node_read.__name__, "node_facts", checked))
    assert rc == 0, err
    res = json.loads(out)
    assert res == node_read.node_facts(checked)
    node = res["ansible_facts"]["multinode_node"]
    assert res["changed"] is False and node["uid"] == 0 and node["versions"]["deepspeed"] == "0.19.8"
    assert node["files"] == [str(tmp_path / "deepspeed_env")] and len(node["stack_fingerprint"]) == 16
    assert res["ansible_facts"]["multinode_node_env"] == {"NCCL_IB_DISABLE": "1", "GLOO_SOCKET_IFNAME": "eth0"}
    assert res["ansible_facts"]["multinode_accelerators"]["status"] == "absent"


def test_a_job_variable_file_that_cannot_be_read_is_a_failure_naming_it(tmp_path, monkeypatch):
    checked = params(tmp_path)

    def refuse(path, *args):
        raise IOError(13, "Permission denied")
    monkeypatch.setattr(node_read, "open", refuse, raising=False)
    res = node_read.node_facts(checked)
    assert res == {"failed": True, "msg": "cannot read %s: [Errno 13] Permission denied" % checked["paths"][0]}


def test_the_sources_are_the_function_module_and_what_it_imports():
    found = node_python.sources(node_read.__name__)
    assert sorted(found) == [UTILS + m for m in ("common.records", "common.spawn", "common.tracking",
                                                 "provision.accelerator", "provision.fabric", "provision.node",
                                                 "provision.node_read")]
    assert all("from ansible." not in text and "import ansible." not in text for text in found.values())


def test_a_module_that_imports_ansible_is_refused(monkeypatch):
    texts = {"a.x": "from %sb import y\n" % UTILS, UTILS + "b": "from ansible.module_utils.basic import AnsibleModule\n"}
    monkeypatch.setattr(node_python, "_source", texts.__getitem__)
    with pytest.raises(ValueError, match="imports Ansible"):
        node_python.sources("a.x")


def test_a_function_name_is_a_name():
    with pytest.raises(ValueError, match="not a function name"):
        node_python.script(node_read.__name__, "node_facts(); import os", {})


def test_parameters_reach_the_node_as_data_not_code(tmp_path):
    """A value with quotes, newlines and Python in it arrives as that string."""
    checked = params(tmp_path, user="x'\"\n); import os; os._exit(3) #")
    rc, out, err = run_isolated(node_python.script(node_read.__name__, "node_facts", checked))
    assert rc == 0, err
    assert json.loads(out)["ansible_facts"]["multinode_node"]["uid"] is None


def test_a_module_imported_from_its_package_is_sent_too():
    """``from ...launch import lock`` names a module of package ``launch``: it goes with the script."""
    text = ("from %slaunch import lock\nfrom %srun.bundle import (\n    pack,  # packs\n    unpack)\n"
            "import %splan.job\n" % (UTILS, UTILS, UTILS))
    assert node_python.imported(text) == [UTILS + "launch", UTILS + "launch.lock", UTILS + "run.bundle", UTILS + "plan.job"]
    from ansible_collections.multinode.deepspeed.plugins.module_utils.run import status
    assert UTILS + "launch.lock" in node_python.sources(status.__name__)
