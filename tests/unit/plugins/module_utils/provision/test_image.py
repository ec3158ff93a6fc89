"""The image's decision (provision/image.py): the stack the matrix selects for the image's accelerator, the inputs
refused before anything is built, the tag predicted from pip's report (a real one, trimmed: pip 23.0.1's dry run in a
venv seeded with bookworm's ensurepip wheels) and the base's
ensurepip wheels and dpkg status (real, from a bookworm debootstrap) -- equal to what node_facts reads from a venv
holding those packages -- and the Containerfile."""
import io
import json
import tarfile
import zipfile
from pathlib import Path

import pytest

from ansible_collections.multinode.deepspeed.plugins.module_utils.provision import image as build, registry
from ansible_collections.multinode.deepspeed.plugins.module_utils.provision import node

FIX = Path(__file__).resolve().parents[4] / "fixtures" / "image"
PARAMS = {"accelerator": "cpu", "cuda": "", "registry": "127.0.0.1:5000", "name": "multinode-deepspeed",
          "push": True, "suite": "bookworm", "mirror": "http://deb.debian.org/debian", "torch": "2.13.0",
          "deepspeed": "0.19.8", "matrix_extra": {}, "extra_packages": ["transformers==5.23.0"],
          "venv": "/opt/multinode-deepspeed/venv", "home": "/opt/multinode-deepspeed", "build_ops": True,
          "ops": {"cpu": ["ShareMemCommBuilder"], "cuda": ["FusedAdamBuilder", "CPUAdamBuilder"]},
          "cache_dir": "/root/.cache/multinode-deepspeed/images"}
GPU = {"status": "ok", "count": 8, "driver_version": "580.65.06", "cuda_driver_version": "13.0"}
NO_GPU = {"status": "absent", "count": 0, "driver_version": None, "cuda_driver_version": None}


def decide(workers=None, **over):
    return build.plan(dict(PARAMS, **over), workers or {}, "3.11")


def test_a_cpu_image_gets_the_cpu_build_of_the_pinned_stack():
    d = decide()
    assert (d["accelerator"], d["build"], d["torch"], d["deepspeed"]) == ("cpu", "cpu", "2.13.0", "0.19.8")
    assert d["packages"] == ["torch==2.13.0", "deepspeed==0.19.8", "transformers==5.23.0"]
    assert d["repository"] == "127.0.0.1:5000/multinode-deepspeed" and d["ops"] == ["ShareMemCommBuilder"]
    assert d["base"]["tarball"].startswith("/root/.cache/multinode-deepspeed/images/base-bookworm-")
    assert d["accelerator_from"] == "image_accelerator"


def test_the_workers_facts_decide_the_accelerator_and_their_drivers_the_cuda():
    d = decide({"w1": GPU, "w2": dict(GPU, cuda_driver_version="12.9"), "c": NO_GPU}, accelerator="")
    assert d["accelerator"] == "cuda" and d["build"] == "cu126", d
    assert "the workers' facts (c, w1, w2)" == d["accelerator_from"]
    assert decide({"w1": NO_GPU}, accelerator="")["build"] == "cpu"


def test_a_cuda_image_with_no_worker_gets_the_newest_build_or_the_named_cuda():
    assert decide(accelerator="cuda")["build"] == "cu132"
    d = decide(accelerator="cuda", cuda="13.0")
    assert d["build"] == "cu130" and d["cuda_toolkit"] == "13-0" and d["index_url"].endswith("/cu130")


@pytest.mark.parametrize("over, workers, words", [
    ({"accelerator": "rocm"}, {}, ["image_accelerator='rocm'", "Fix: -e image_accelerator=cuda"]),
    ({"accelerator": "cuda", "cuda": "99.9"}, {}, ["image_cuda 99.9", "torch 2.13 has no cu999 build",
                                                   "Fix: set image_cuda to one of"]),
    ({"accelerator": "cuda", "cuda": "12.8"}, {}, ["image_cuda 12.8", "torch 2.13 has no cu128 build"]),
    ({"accelerator": "cpu", "cuda": "13.0"}, {}, ["image_cuda=13.0 is set for a CPU image"]),
    ({"accelerator": ""}, {}, ["no worker answered and image_accelerator is not set"]),
    ({"registry": "not a registry"}, {}, ["image_registry='not a registry' is not a registry"]),
    ({"registry": ""}, {}, ["image_registry='' is not a registry", "-e push=false"]),
    ({"name": "Bad_Name"}, {}, ["image_name='Bad_Name' is not an image name"]),
    ({"suite": "sid"}, {}, ["image_base_suite='sid'"]),
    ({"mirror": "deb.debian.org"}, {}, ["image_base_mirror='deb.debian.org' is not a Debian mirror URL"]),
])
def test_bad_inputs_are_refused_before_anything_is_built(over, workers, words):
    with pytest.raises(build.ImageError) as err:
        decide(workers, **over)
    for word in words:
        assert word in str(err.value), str(err.value)


def test_a_local_image_needs_no_registry_and_a_base_needs_the_controllers_python():
    assert decide(registry="", push=False)["repository"] == "localhost/multinode-deepspeed"
    with pytest.raises(build.ImageError, match="controller builds the wheelhouse with Python 3.12"):
        build.plan(PARAMS, {}, "3.12")


def wheel(path, dist_info):
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(dist_info + "/METADATA", "Metadata-Version: 2.1\n")


def base_tar(path):
    with tarfile.open(path, "w") as tf:
        for name, data in (("./var/lib/dpkg/status", (FIX / "dpkg_status").read_bytes()),
                           ("./usr/share/python-wheels/pip-23.0.1-py3-none-any.whl", b"x"),
                           ("./usr/share/python-wheels/setuptools-66.1.1-py3-none-any.whl", b"x"),
                           ("./usr/share/python-wheels/wheel-0.38.4-py3-none-any.whl", b"x")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))


def test_the_tag_is_the_fingerprint_node_facts_reads_from_the_installed_venv(tmp_path):
    wheels = tmp_path / "WHEELS"
    wheels.mkdir()
    for name, info in json.loads((FIX / "dist_info.json").read_text()).items():
        wheel(wheels / name, info)
    report = json.loads((FIX / "pip_report.json").read_text().replace("/WHEELS", str(wheels)))
    base_tar(tmp_path / "base.tar")
    python, seeds, members = build.base_python(str(tmp_path / "base.tar"))
    assert python == "3.11.2" and seeds == [("pip", "pip-23.0.1.dist-info"),
                                            ("setuptools", "setuptools-66.1.1.dist-info")]
    assert members == {"pip-23.0.1-py3-none-any.whl": "./usr/share/python-wheels/pip-23.0.1-py3-none-any.whl",
                       "setuptools-66.1.1-py3-none-any.whl":
                       "./usr/share/python-wheels/setuptools-66.1.1-py3-none-any.whl"}
    names = build.predicted_names(seeds, report, {})
    # pip stays; the wheelhouse's setuptools, which pip's report lists (a requirement wants a newer one), replaces
    # ensurepip's; a percent-encoded URL (torch's +cpu) is read.
    assert "pip-23.0.1.dist-info" in names and "setuptools-84.2.1.dist-info" in names
    assert "setuptools-66.1.1.dist-info" not in names and "torch-2.13.0+cpu.dist-info" in names
    assert "jinja2-3.1.6.dist-info" in names and len(names) == 25
    # The venv site.yml would make: the same dist-info directories, the same pyvenv.cfg, the same trainer.
    venv = tmp_path / "venv"
    site = venv / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\ninclude-system-site-packages = false\nversion = 3.11.2\n")
    for name in names:
        (site / name).mkdir()
    trainer = tmp_path / "multinode_ds"
    trainer.mkdir()
    (trainer / "__init__.py").write_text('__version__ = "0.1.0"\n')
    _versions, fingerprint = node.read_versions(str(venv), str(trainer))
    assert build.fingerprint(python, names, "0.1.0") == fingerprint


def test_a_report_naming_a_package_with_no_local_wheel_is_refused():
    with pytest.raises(ValueError, match="no local wheel"):
        build.predicted_names([], {"install": [{"metadata": {"name": "x"}, "download_info": {"url": "https://x"}}]},
                              {})


def test_the_containerfile_installs_from_bind_mounted_wheels_prebuilds_the_ops_and_labels_the_stack():
    d = decide()
    text = build.containerfile(d, "d312f27811669737", "0.1.0")
    assert text.splitlines()[1:3] == ["FROM scratch", "ADD base.tar /"]
    assert "RUN --mount=type=bind,source=wheels,target=/wheels python3 -m venv /opt/multinode-deepspeed/venv" in text
    assert "--no-index --find-links /wheels 'torch==2.13.0' 'deepspeed==0.19.8' 'transformers==5.23.0'" in text
    assert "-m multinode_ds.build_ops ShareMemCommBuilder" in text
    assert 'LABEL %s="d312f27811669737"' % registry.FINGERPRINT_LABEL in text
    assert "COPY wheels" not in text and "ADD wheels" not in text
    # Issue 44, point 14: a non-root USER of its own, numeric (a kubelet's runAsNonRoot can only check a number),
    # after every step that needs root.
    lines = text.splitlines()
    assert "USER 65532:65532" in lines
    assert lines.index("USER 65532:65532") > max(i for i, line in enumerate(lines) if line.startswith("RUN"))
    assert "mnds:x:65532:65532::/home/mnds:/usr/sbin/nologin" in text
    no_ops = build.containerfile(decide(build_ops=False), "x", "0.1.0")
    assert "build_ops" not in no_ops and "chmod 1777 /opt/multinode-deepspeed/torch_extensions" in no_ops


def test_a_requirement_that_is_not_a_pin_is_refused():
    with pytest.raises(build.ImageError, match="not a package requirement"):
        build.containerfile(decide(extra_packages=["x; rm -rf /"]), "t", "0.1.0")


def test_the_mirror_is_read_from_apt_sources(tmp_path):
    (tmp_path / "etc/apt/sources.list.d").mkdir(parents=True)
    (tmp_path / "etc/apt/sources.list.d/debian.sources").write_text(
        "Types: deb\nURIs: http://mirror.local/debian-security\nSuites: bookworm-security\n\n"
        "Types: deb\nURIs: http://mirror.local/debian\nSuites: bookworm\n")
    assert build.apt_mirror(str(tmp_path)) == "http://mirror.local/debian"
    assert build.apt_mirror(str(tmp_path / "none")) == "http://deb.debian.org/debian"
    assert build.mirror_uris("deb [arch=amd64] http://m/debian bookworm main\n# deb x\n") == ["http://m/debian"]


def test_a_cuda_image_prebuilds_no_op_the_base_cannot_compile():
    assert decide(accelerator="cuda")["ops"] == [] and decide()["ops"] == ["ShareMemCommBuilder"]


def test_the_interpreter_package_gives_the_version_pyvenv_cfg_records():
    text = (FIX / "dpkg_status").read_text()
    assert build.python_from_status(text) == "3.11.2"
    # python3 (the metapackage) says 3.11.2-1+b1; only the interpreter's own package counts.
    assert build.python_from_status(text.replace("Version: 3.11.2-6+deb12u8", "Version: 3.11.9-1")) == "3.11.9"
    assert build.python_from_status("Package: python3\nStatus: install ok installed\n") is None


@pytest.mark.parametrize("over, words", [
    ({"mirror": "https://user:s3cret@mirror.example/debian"}, ["<credentials>@", "auth.conf.d"]),
])
def test_a_mirror_with_credentials_is_refused_without_showing_them(over, words):
    with pytest.raises(build.ImageError) as err:
        decide(**over)
    assert "s3cret" not in str(err.value)
    for word in words:
        assert word in str(err.value)


@pytest.mark.parametrize("over", [{"venv": "/opt/my venv"}, {"home": "/opt/x;reboot"}, {"home": "relative/path"},
                                  {"ops": {"cpu": ["Shm$(id)"]}}])
def test_paths_and_op_names_that_a_run_line_cannot_hold_are_refused(over):
    with pytest.raises(build.ImageError, match="not an absolute path or an op builder's name"):
        build.containerfile(decide(**over), "t", "0.1.0")


def test_workers_that_did_not_answer_are_left_out():
    d = decide({"w1": GPU, "w2": None}, accelerator="")
    assert d["accelerator"] == "cuda" and d["accelerator_from"] == "the workers' facts (w1)"
