"""module_utils/provision/node.py: one node read without importing torch (fixtures: real /proc text of a cluster node)."""
import socket

from ansible_collections.multinode.deepspeed.plugins.module_utils.provision import node

MEMINFO = """MemTotal:       24613492 kB
MemFree:         9251316 kB
MemAvailable:   20154020 kB
"""
# /proc/net/route of a local-cluster node (podman network 10.89.0.0/24), with a second default route.
ROUTE = """Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT
eth0\t00000000\t0100590A\t0003\t0\t0\t100\t00000000\t0\t0\t0
eth0\t0000590A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0
ib0\t00000000\t0100A8C0\t0003\t0\t0\t50\t00000000\t0\t0\t0
"""
DISTS = ["deepspeed-0.19.8.dist-info", "torch-2.13.0+cu126.dist-info", "transformers-5.23.0.dist-info",
         "nvidia_nccl_cu12-2.27.5.dist-info", "pip-23.0.1.dist-info"]


def test_memory_and_default_route():
    assert node.meminfo_total_mb(MEMINFO) == 24036
    assert node.meminfo_total_mb("") is None
    assert node.default_interface(ROUTE) == "ib0"
    assert node.default_interface(ROUTE.replace("ib0\t00000000\t0100A8C0\t0003\t0\t0\t50", "ib0\t0000A8C0\t0\t1\t0\t0\t5")) == "eth0"
    assert node.default_interface("Iface\tDestination\n") is None


def test_versions_from_dist_info_names():
    dists = node.dist_versions(DISTS)
    assert dists["torch"] == "2.13.0+cu126" and dists["nvidia_nccl_cu12"] == "2.27.5"
    got = node.stack_versions(dists, "3.11.2", "0.1.0")
    assert got == {"python": "3.11.2", "trainer": "0.1.0", "torch": "2.13.0+cu126", "deepspeed": "0.19.8",
                   "transformers": "5.23.0", "cuda": "12.6", "nccl": "2.27.5"}
    cpu = node.stack_versions(node.dist_versions(["torch-2.13.0+cpu.dist-info"]), "3.11.2", None)
    assert cpu["cuda"] == "none" and cpu["nccl"] == "none" and cpu["deepspeed"] == "missing"
    assert cpu["trainer"] == "unknown"
    assert node.pyvenv_python("home = /usr/bin\nversion = 3.11.2\n") == "3.11.2"
    assert node.pyvenv_python("version_info = 3.12.1.final.0\n") == "3.12.1"


def make_venv(root, dists, trainer="0.1.0"):
    site = root / "venv" / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    (root / "venv" / "pyvenv.cfg").write_text("home = /usr/bin\nversion = 3.11.2\n")
    for d in dists:
        (site / d).mkdir()
    lib = root / "lib" / "multinode_ds"
    lib.mkdir(parents=True)
    (lib / "__init__.py").write_text('"""The trainer."""\n__version__ = "%s"\n' % trainer)
    return str(root / "venv"), str(lib)


def test_read_versions_and_a_fingerprint_that_any_package_changes(tmp_path):
    venv, lib = make_venv(tmp_path / "a", DISTS)
    versions, fp = node.read_versions(venv, lib)
    assert versions["deepspeed"] == "0.19.8" and versions["trainer"] == "0.1.0" and len(fp) == 16
    assert node.read_versions(*make_venv(tmp_path / "b", DISTS)) == (versions, fp)
    other = [d.replace("pip-23.0.1", "pip-24.0") for d in DISTS]
    assert node.read_versions(*make_venv(tmp_path / "c", other))[1] != fp
    assert node.read_versions(*make_venv(tmp_path / "d", DISTS, trainer="0.2.0"))[1] != fp
    err, none = node.read_versions(str(tmp_path / "nothing"), lib)
    assert "no venv" in err["error"] and none is None


def test_tracker_packages_from_the_venvs_dist_info(tmp_path):
    venv, _lib = make_venv(tmp_path / "a", DISTS + ["tensorboard-2.21.0.dist-info", "comet_ml-3.49.0.dist-info"])
    assert node.tracker_packages(venv) == {"tensorboard": "2.21.0", "wandb": None, "comet": "3.49.0"}
    assert node.tracker_packages(str(tmp_path / "none")) == {"tensorboard": None, "wandb": None, "comet": None}


def test_port_state_sees_a_listener():
    sock = socket.socket()
    sock.bind(("", 0))
    sock.listen(1)
    port = sock.getsockname()[1]
    try:
        free, why = node.port_state(port)
        assert not free and "port %d is not free" % port in why and "in use" in why
    finally:
        sock.close()
    assert node.port_state(port) == (True, "")


def test_a_node_is_unchanged_only_while_its_venv_and_the_wanted_stack_match_the_record():
    from ansible_collections.multinode.deepspeed.plugins.module_utils.provision.node import stack_unchanged
    wanted = {"build": "cpu", "accelerator": "cpu", "packages": ["torch==2.13.0+cpu", "deepspeed==0.18.2"],
              "cuda_env": {}}
    record = dict(wanted, fingerprint="ab12", versions={"torch": "2.13.0+cpu", "deepspeed": "0.18.2"})
    node = {"stack_fingerprint": "ab12", "stack_record": record}
    assert stack_unchanged(node, wanted) is True
    # A package installed or removed by hand (the fingerprint), a new pin, another build or CUDA settings: not.
    assert stack_unchanged(dict(node, stack_fingerprint="cd34"), wanted) is False
    assert stack_unchanged(node, dict(wanted, packages=["torch==2.13.0+cpu", "deepspeed==0.18.3"])) is False
    assert stack_unchanged(node, dict(wanted, build="cu126")) is False
    assert stack_unchanged(node, dict(wanted, cuda_env={"CUDA_HOME": "/usr/local/cuda"})) is False
    # No venv, no record, a record from before fingerprints, or one whose versions could not be read: not.
    assert stack_unchanged({"stack_fingerprint": None, "stack_record": record}, wanted) is False
    assert stack_unchanged({"stack_fingerprint": "ab12", "stack_record": None}, wanted) is False
    assert stack_unchanged(dict(node, stack_record=dict(record, fingerprint=None)), wanted) is False
    assert stack_unchanged(dict(node, stack_record=dict(record, versions={"error": "no torch"})), wanted) is False
