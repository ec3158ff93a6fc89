"""Issue 26, point 4: the kubernetes backend's pods are hardened (no API token, no privilege escalation, every
capability dropped but rdma's IPC_LOCK, a non-root user when asked, fsGroup so that user reads the Secret)."""
from ansible_collections.multinode.deepspeed.plugins.module_utils.launch.backends.kubernetes import objects as k8s

JOB = {"run_id": "r1", "rank_hosts": ["w1", "w2"], "slots": {"w1": 2, "w2": 2}, "accelerator": "cuda",
       "env": {"A": "1"}, "venv": "/v", "run_dir": "/s/runs/r1", "shared_dir": "/s", "home": "/h",
       "master_port": 29500, "interface": "ib0", "secret_file": "/h/secrets/runs/r1.json"}
OPTS = {"namespace": "train", "image": "img:1", "fabric": "tcp", "cluster_domain": "cluster.local"}


def template(opts):
    return k8s.objects(JOB, opts)[1]["spec"]


def test_pods_get_no_service_account_token_and_no_privilege():
    spec = template(OPTS)
    assert spec["automountServiceAccountToken"] is False
    ctx = spec["containers"][0]["securityContext"]
    assert ctx["allowPrivilegeEscalation"] is False and ctx["capabilities"] == {"drop": ["ALL"]}
    # An image whose user is root and no option: the user is the image's, nothing forces non-root.
    assert "runAsNonRoot" not in ctx and spec["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}


def test_pods_run_under_the_runtimes_seccomp_filter_and_end_after_the_runs_timeout():
    """Issue 44, point 14: seccompProfile RuntimeDefault (Kubernetes' default is Unconfined), and a pod whose
    controller and agent are gone ends by the kubelet's deadline: the run's timeout and a minute."""
    spec = template(OPTS)
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert "activeDeadlineSeconds" not in spec
    timed = k8s.objects(dict(JOB, timeout=600), OPTS)[1]["spec"]
    assert timed["activeDeadlineSeconds"] == 600 + k8s.DEADLINE_MARGIN
    assert all(p["spec"]["activeDeadlineSeconds"] == 660 for p in k8s.objects(dict(JOB, timeout=600), OPTS)[1:])


def test_rdma_mode_keeps_only_ipc_lock():
    ctx = template(dict(OPTS, fabric="rdma", rdma_resource="rdma/hca"))["containers"][0]["securityContext"]
    assert ctx["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}
    assert ctx["allowPrivilegeEscalation"] is False


def test_a_non_root_user_runs_as_non_root_and_reads_the_secret():
    spec = template(dict(OPTS, run_as_user="1000"))
    ctx = spec["containers"][0]["securityContext"]
    assert ctx["runAsUser"] == 1000 and ctx["runAsNonRoot"] is True
    # The Secret's files belong to the fsGroup (the user's id unless k8s_fs_group says), group-readable only.
    assert spec["securityContext"] == {"fsGroup": 1000, "runAsNonRoot": True,
                                       "seccompProfile": {"type": "RuntimeDefault"}}
    secret = [v for v in spec["volumes"] if v["name"] == "secrets"][0]["secret"]
    assert secret["defaultMode"] == 0o440
    assert template(dict(OPTS, run_as_user=1000, fs_group=2000))["securityContext"]["fsGroup"] == 2000
    # Asking for root says so, and is not "non-root".
    root = template(dict(OPTS, run_as_user=0))
    assert root["containers"][0]["securityContext"]["runAsNonRoot"] is False
    assert root["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}


def test_bad_ids_are_named_with_the_fix():
    problems = k8s.check(JOB, dict(OPTS, run_as_user="nobody", fs_group="-1"))
    assert any("k8s_run_as_user='nobody' is not a numeric id" in p for p in problems)
    assert any("k8s_fs_group='-1' is not a numeric id" in p for p in problems)
    assert not k8s.check(JOB, dict(OPTS, run_as_user=1000, fs_group="1000"))
    # A bad id never breaks the objects (the plan's check names it).
    assert "runAsUser" not in template(dict(OPTS, run_as_user="nobody"))["containers"][0]["securityContext"]


def test_the_pods_run_as_the_runs_account_unless_told():
    """Unset, k8s_run_as_user is the run account's uid on the coordinator (node_facts' user, job_plan's run_uid):
    every capability is dropped, so root in a pod could not write the run directory that account owns."""
    from ansible_collections.multinode.deepspeed.plugins.module_utils.launch import backends
    options = backends.get("kubernetes").options
    assert options.read({"run_uid": 2000}, [])["run_as_user"] == 2000
    assert options.read({"run_uid": 2000, "k8s_run_as_user": 1234}, [])["run_as_user"] == 1234
    # A root run account (uid 0) or an unknown one leaves the image's own user.
    assert options.read({"run_uid": 0}, [])["run_as_user"] is None
    assert options.read({}, [])["run_as_user"] is None
