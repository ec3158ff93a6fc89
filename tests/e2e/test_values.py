"""Values that cannot escape, secrets that stay secret (issue 15, items 6 and 7), on the local cluster.

The classic injections and traversals go in through -e; the ones the plan refuses stop the play before anything is
written, the others reach a user's script verbatim, with every backend, and nothing they spell is run anywhere.
A secret_env value reaches every rank and appears in no collected file, no play output and no command line."""
import json
import time
from pathlib import Path

import pytest
from e2e_nodes import node_name, podman

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
NODES = ("coord", "worker1", "worker2")
PWNED = "/tmp/mnds-pwned"
SECRET = "s3cr3t-%d; $(touch /tmp/mnds-pwned-secret)" % int(time.time())
SCRIPT_DIR = "/shared/e2e values"
# The script's own path has a space and a command in it: a shell that split it would run `touch`.
SCRIPT = SCRIPT_DIR + "/echo me;touch mnds-pwned-path.py"
ECHO = """import glob, json, os, socket, subprocess, sys
secret = os.environ.get("MY_API_SECRET", "")
ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
# What code in a rank can reach: a private key it can read, a login to another node.
keys = [k for k in glob.glob("/home/*/.ssh/id_*") + glob.glob("/root/.ssh/id_*") + glob.glob("/etc/ssh/ssh_host_*_key")
        if not k.endswith(".pub") and os.access(k, os.R_OK)]
logins = [n for n in ("coord", "worker1", "worker2") if n != socket.gethostname() and subprocess.run(
    ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", n, "true"], capture_output=True).returncode == 0]
out = {"argv": sys.argv[1:], "note": os.environ.get("MY_NOTE"), "secret_seen": bool(secret),
       "secret_in_ps": bool(secret) and secret in ps, "uid": os.getuid(), "keys": keys, "logins": logins}
path = os.path.join(os.environ["MULTINODE_DS_RUN_DIR"], "seen-rank%s.json" % os.environ["RANK"])
json.dump(out, open(path, "w"))
print("rank", os.environ["RANK"], "saw", len(sys.argv) - 1, "arguments")
"""
HOSTILE_ARGS = ["$(touch %s-subst)" % PWNED, "`touch %s-tick`" % PWNED, "x; touch %s-semi" % PWNED,
                "x && touch %s-and" % PWNED, "x | touch %s-pipe" % PWNED, "a b'c\"d \\$HOME *"]
HOSTILE_ENV = "$(touch %s-env); `touch %s-env2`" % (PWNED, PWNED)


def on(node, command):
    return podman("exec", node_name(node), "sh", "-c", command)


def pwned_anywhere(run_dir=None):
    found = []
    for node in NODES:
        out = on(node, "ls -d %s* 2>/dev/null; %s true" % (
            PWNED, ("ls -d '%s'/mnds-pwned* 2>/dev/null;" % run_dir) if run_dir else "")).stdout.split()
        found += ["%s:%s" % (node, f) for f in out]
    found += [str(p) for p in Path("/tmp").glob("mnds-pwned*")]
    return found


# A line in the launching user's ~/.deepspeed_env that the run does not own (left by hand, another tool): DeepSpeed
# would paste it into pdsh's remote shell. The run reads only its own file (DS_ENV_FILE), so it never runs.
HOME_ENV_LINE = "NCCL_DEBUG_FILE=/tmp/x$(touch %s-home)" % PWNED


@pytest.fixture(scope="module")
def echo_script(provisioned):
    on("coord", "mkdir -p '%s'" % SCRIPT_DIR)
    assert podman("exec", "-i", node_name("coord"), "sh", "-c", "cat > \"$0\"", SCRIPT, input=ECHO).returncode == 0
    for node in NODES:
        on(node, "rm -f %s*" % PWNED)
    home_env = on("coord", "echo ~deepspeed/.deepspeed_env").stdout.strip()
    assert podman("exec", "-i", node_name("coord"), "sh", "-c", "cat >> \"$0\"", home_env,
                  input=HOME_ENV_LINE + "\n").returncode == 0
    yield SCRIPT
    on("coord", "sed -i '/mnds-pwned-home/d' %s" % home_env)


def vars_file(tmp_path, data):
    path = tmp_path / "vars.json"
    path.write_text(json.dumps(data))
    return "@%s" % path


def test_traversals_and_injections_the_plan_refuses_stop_the_play_first(provisioned, run_playbook, tmp_path):
    """One play with every refused value: the plan names each, and nothing is written or run."""
    extra = vars_file(tmp_path, {
        "run_id": "../../tmp/mnds-pwned-dir", "model": "../../../tmp/mnds-pwned-model",
        "deepspeed_rank_env": {"NCCL_DEBUG": "INFO\ntouch /tmp/mnds-pwned-line", "RANK": "7", "HF_TOKEN": "hf_x",
                               "BAD KEY": "x"},
        "secret_env": {"LOCAL_RANK": "1"}})
    res = run_playbook("train.yml", "-e", extra, "-e", "preflight=false", name="values-refused")
    assert res.rc != 0
    flat = " ".join(res.out.split())
    for needle in ("run_id='../../tmp/mnds-pwned-dir': letters, digits",
                   "model='../../../tmp/mnds-pwned-model' is not a model name",
                   "deepspeed_rank_env: NCCL_DEBUG must be one line of text",
                   "deepspeed_rank_env: 'BAD KEY' is not a variable name",
                   "deepspeed_rank_env: RANK is set by the run itself",
                   "deepspeed_rank_env: HF_TOKEN looks like a secret", "Fix: pass it in secret_env",
                   "secret_env: LOCAL_RANK is set by the run itself"):
        assert needle in flat, f"{needle!r} not in the output:\n{res.tail(20)}"
    assert "hf_x" not in res.out
    assert "TASK [Check the run id" not in res.out
    assert pwned_anywhere() == []
    assert on("coord", "ls -d /shared/tmp /tmp/mnds-pwned-dir 2>/dev/null").stdout == ""


@pytest.mark.parametrize("backend", ["pdsh", "ssh-free", "slurm"])
def test_hostile_values_reach_a_users_script_verbatim_and_run_nothing(
        echo_script, run_playbook, tmp_path, backend, request):
    if backend == "slurm":
        request.getfixturevalue("slurm")  # preflight=false: the test sees that Slurm's workers are idle
    run_id = f"e2e-values-{backend}-{int(time.time())}"
    extra = vars_file(tmp_path, {
        "backend": backend, "entrypoint": echo_script, "run_id": run_id, "preflight": False,
        "args": " ".join("'%s'" % a.replace("'", "'\"'\"'") for a in HOSTILE_ARGS),
        "deepspeed_rank_env": {"MY_NOTE": HOSTILE_ENV},
        "secret_env": {"MY_API_SECRET": SECRET}})
    res = run_playbook("train.yml", "-e", extra, name=f"values-{backend}")
    assert res.rc == 0, res.tail()
    run_dir = f"/shared/runs/{run_id}"
    seen = [json.loads(on("coord", f"cat {run_dir}/seen-rank{r}.json").stdout) for r in (0, 1)]
    for rank in seen:
        assert rank["argv"][1:] == HOSTILE_ARGS and rank["argv"][0].startswith("--local_rank=")
        assert rank["note"] == HOSTILE_ENV
        assert rank["secret_seen"] is True and rank["secret_in_ps"] is False
        # The default account is not root; from a rank no private key is readable and no other node lets it in.
        assert rank["uid"] != 0 and rank["keys"] == [] and rank["logins"] == [], rank
    assert pwned_anywhere(run_dir) == []
    # The secret: in no collected file, not in the play's output, and its node-local file is gone.
    collected = ROOT / "runs" / run_id
    assert (collected / "summary.json").exists()
    leaks = [str(p) for p in collected.rglob("*") if p.is_file() and SECRET.split(";")[0] in p.read_text(errors="replace")]
    assert leaks == []
    assert SECRET.split(";")[0] not in res.out
    summary = json.loads((collected / "summary.json").read_text())
    assert summary["environment"]["MY_NOTE"] == HOSTILE_ENV and "MY_API_SECRET" not in summary["environment"]
    for node in ("worker1", "worker2"):
        assert on(node, "ls /opt/multinode-deepspeed/secrets/runs/%s.json 2>/dev/null" % run_id).stdout == "", node
    assert on("coord", f"stat -c %a {run_dir}/rank.env {run_dir}/.deepspeed_env").stdout.split() == ["600", "600"]


def test_nccl_env_a_shell_would_expand_is_refused_before_the_role_writes(provisioned, run_playbook, tmp_path):
    """nccl_env reaches every launch's .deepspeed_env and DeepSpeed's remote shell: refused at its source."""
    before = {n: on(n, "md5sum /etc/multinode-deepspeed/deepspeed_env ~deepspeed/.deepspeed_env").stdout
              for n in NODES}
    extra = vars_file(tmp_path, {"nccl_env": {"NCCL_DEBUG_FILE": "/tmp/x$(touch %s-nccl)" % PWNED},
                                 "nccl_socket_ifname": "eth0;touch %s-ifname" % PWNED})
    res = run_playbook(str(ROOT / "tests" / "e2e" / "files" / "nccl_role.yml"), "-e", extra, name="values-nccl")
    assert res.rc != 0
    flat = " ".join(res.out.split())
    for node in ("worker1", "worker2"):
        assert f"host {node}: nccl_socket_ifname='eth0;touch" in flat, res.tail(20)
    assert "nccl_env: NCCL_DEBUG_FILE='/tmp/x$(touch" in flat and "deepspeed_rank_env" in flat
    assert "TASK [multinode.deepspeed.nccl : Write NCCL's configuration file]" not in res.out
    assert {n: on(n, "md5sum /etc/multinode-deepspeed/deepspeed_env ~deepspeed/.deepspeed_env").stdout
            for n in NODES} == before
    assert pwned_anywhere() == []
