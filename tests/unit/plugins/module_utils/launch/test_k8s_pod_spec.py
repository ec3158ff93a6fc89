"""The kubernetes backend's pod, part by part (module_utils/launch/backends/kubernetes/objects.py): its environment, its container, the
run's Secret, the pod's spec."""
from ansible_collections.multinode.deepspeed.plugins.module_utils.launch.backends.kubernetes import objects as k8s

JOB = {"run_id": "r1", "rank_hosts": ["w1", "w2"], "slots": {"w1": 2, "w2": 2}, "accelerator": "cuda",
       "env": {"A": "1", "NCCL_IB_DISABLE": "1"}, "venv": "/v", "run_dir": "/s/runs/r1", "shared_dir": "/s",
       "home": "/h", "master_port": 29500, "interface": "ib0"}
OPTS = {"namespace": "train", "image": "img:1", "fabric": "tcp", "cluster_domain": "cluster.local"}
NAME = "mnds-r1"


def names(container):
    return [e["name"] for e in container["env"]]


def test_pod_env_over_tcp_uses_the_pods_interface_and_names_the_master():
    env = k8s.pod_env(JOB, OPTS, NAME)
    assert env["A"] == "1" and env["NCCL_IB_DISABLE"] == "1" and env["NCCL_SOCKET_IFNAME"] == "=eth0"
    assert env["GLOO_SOCKET_IFNAME"] == "eth0" and env["MULTINODE_DS_K8S_MASTER"] == "mnds-r1-0.mnds-r1.train.svc.cluster.local"
    # With the node's network, the node's interface (the option's, else the plan's).
    assert k8s.pod_env(JOB, dict(OPTS, host_network=True), NAME)["GLOO_SOCKET_IFNAME"] == "ib0"
    assert k8s.pod_env(JOB, dict(OPTS, host_network=True, interface="ib1"), NAME)["GLOO_SOCKET_IFNAME"] == "ib1"


def test_pod_env_over_rdma_never_switches_infiniband_off():
    env = k8s.pod_env(JOB, dict(OPTS, fabric="rdma", cluster_domain=None), NAME)
    assert "NCCL_IB_DISABLE" not in env and env["NCCL_SOCKET_IFNAME"] == "=eth0"
    assert env["MULTINODE_DS_K8S_MASTER"].endswith(".svc.cluster.local")


def test_container_asks_for_the_hosts_gpus_and_rdma_devices():
    plain = k8s.container(dict(JOB, accelerator="cpu"), OPTS, NAME)
    assert "resources" not in plain
    assert plain["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    assert plain["command"] == ["/v/bin/python", "-m", "multinode_ds.k8s", "pod", "--run-dir", "/s/runs/r1"]
    assert names(plain)[-1] == "MULTINODE_DS_POD" and names(plain)[:-1] == sorted(names(plain)[:-1])
    assert plain["ports"] == [{"name": "master", "containerPort": 29500}]
    rdma = k8s.container(JOB, dict(OPTS, fabric="rdma", rdma_resource="rdma/hca", rdma_count=2), NAME)
    assert rdma["resources"]["limits"] == rdma["resources"]["requests"] == {"nvidia.com/gpu": "2", "rdma/hca": "2"}
    assert rdma["securityContext"] == {"allowPrivilegeEscalation": False,
                                       "capabilities": {"drop": ["ALL"], "add": ["IPC_LOCK"]}}


def test_secret_items_are_the_runs_secrets_only():
    assert k8s.secret_items(JOB) == []
    both = dict(JOB, env={"HF_TOKEN_PATH": "/h/secrets/hf_token"}, secret_file="/h/secrets/runs/r1.json")
    assert k8s.secret_items(both) == [{"key": "hf_token", "path": "hf_token"},
                                      {"key": "secret_env", "path": "runs/r1.json"}]


def test_pod_spec_mounts_the_secret_only_when_the_run_has_one():
    spec = k8s.pod_spec(JOB, dict(OPTS, shm_size="8Gi"), NAME)
    assert [v["name"] for v in spec["volumes"]] == ["shared", "dshm"] and "hostNetwork" not in spec
    assert spec["volumes"][1]["emptyDir"] == {"medium": "Memory", "sizeLimit": "8Gi"}
    assert spec["volumes"][0] == {"name": "shared", "hostPath": {"path": "/s", "type": "Directory"}}
    secret = k8s.pod_spec(dict(JOB, secret_file="/h/secrets/runs/r1.json"), dict(OPTS, host_network=True), NAME)
    assert secret["volumes"][2]["secret"]["secretName"] == "mnds-r1-secrets"
    assert secret["containers"][0]["volumeMounts"][-1] == {"name": "secrets", "mountPath": "/h/secrets",
                                                           "readOnly": True}
    assert secret["hostNetwork"] is True and secret["dnsPolicy"] == "ClusterFirstWithHostNet"
