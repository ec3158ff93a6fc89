"""The image the role built: tagged with the fingerprint of the venv it holds (read from the image's own file
system, as node_facts reads a node), labelled with its stack, and usable by a non-root user (DeepSpeed's prebuilt
op loads without a compiler run)."""
import json
import subprocess

testinfra_hosts = ["local://"]
LABEL = "io.github.multinode.deepspeed.stack-fingerprint"
PY = "/opt/multinode-deepspeed/venv/bin/python"


def podman(*args, check=True):
    res = subprocess.run(["podman", *args], capture_output=True, text=True, check=False, timeout=600)
    assert res.returncode == 0 or not check, res.stderr
    return res


def built():
    out = podman("images", "--format", "json", "--filter", "reference=localhost/multinode-deepspeed").stdout
    images = [i for i in json.loads(out or "[]") if (i.get("Labels") or {}).get(LABEL)]
    assert images, "no image localhost/multinode-deepspeed with a stack label"
    image = images[0]
    tag = image["Labels"][LABEL]
    return "localhost/multinode-deepspeed:" + tag, image["Labels"]


def test_the_tag_is_the_fingerprint_of_the_venv_inside(host):
    ref, labels = built()
    code = ("import sys; sys.path.insert(0, '/opt/multinode-deepspeed/lib'); import glob, hashlib, os, re; "
            "cfg = open('/opt/multinode-deepspeed/venv/pyvenv.cfg').read(); "
            "py = re.search(r'^version(?:_info)?\\s*=\\s*(\\S+)', cfg, re.M).group(1); "
            "names = sorted(os.path.basename(p) for p in glob.glob("
            "'/opt/multinode-deepspeed/venv/lib/python*/site-packages/*.dist-info')); "
            "import multinode_ds; tr = multinode_ds.__version__; "
            "print(hashlib.sha256('\\n'.join([py] + names + [tr]).encode()).hexdigest()[:16])")
    res = podman("run", "--rm", "--network=none", ref, PY, "-c", code)
    assert res.stdout.strip() == ref.rsplit(":", 1)[1], res.stdout + res.stderr
    assert labels["io.github.multinode.deepspeed.build"] == "cpu"
    assert labels["io.github.multinode.deepspeed.torch"] == "2.13.0"
    assert labels["io.github.multinode.deepspeed.venv"] == "/opt/multinode-deepspeed/venv"


def test_a_non_root_user_runs_the_stack_and_its_prebuilt_op(host):
    ref, _labels = built()
    code = ("import torch, deepspeed, multinode_ds.train; from deepspeed.accelerator import get_accelerator; "
            "get_accelerator().create_op_builder('ShareMemCommBuilder').load(verbose=False); "
            "print(torch.__version__, deepspeed.__version__)")
    res = podman("run", "--rm", "--network=none", "--user", "4321:4321", "-e", "HOME=/tmp", ref, PY, "-c", code)
    assert res.stdout.split()[-2:] == ["2.13.0+cpu", "0.19.8"], res.stdout + res.stderr
    # Loaded from the image, not compiled now (no build output).
    assert "Building extension module" not in res.stderr and "ninja" not in res.stderr.lower(), res.stderr[-2000:]


def test_the_image_holds_no_build_context_or_cache(host):
    ref, _labels = built()
    res = podman("run", "--rm", "--network=none", ref, "sh", "-c",
                 "ls /wheels /root/.cache/pip /var/cache/apt/archives/*.deb 2>&1; ls /var/lib/apt/lists | wc -l")
    assert "No such file" in res.stdout and res.stdout.strip().splitlines()[-1] == "0", res.stdout
