"""The parts select_stack decides with, on nodes built from the nvidia-smi fixtures (real captures)."""
import pytest

from ansible_collections.multinode.deepspeed.plugins.module_utils.provision.stack_matrix import (
    StackError, _cuda_pin_misfits, _deepspeed_for_torch_pin, _deepspeed_pin_misfits, _deepspeed_refusals,
    _driver_fix, _named_releases, _newest_stack, _no_common_torch, _nodes_facts, _release_fits, _releases,
    _torch_pin_misfits, _torchless_nodes, load_matrix)

from tests.unit.plugins.module_utils.provision.test_accelerator import facts_of

MATRIX = load_matrix()
RELEASES = _releases(MATRIX["torch"])


def fixture_node(name, python="3.11.2"):
    """The stack role's node record (roles/stack/tasks/select.yml) for the nvidia-smi fixture ``name``."""
    acc = facts_of(name)
    return {"python": python, "accelerator": "cuda" if acc["status"] in ("ok", "driver_error") else "cpu",
            "driver_version": acc["driver_version"], "cuda_driver_version": acc["cuda_driver_version"]}


def node_facts(matrix=MATRIX, **pythons):
    """``_nodes_facts`` of fixtures, keyword = fixture name (dashes as underscores), value = its Python."""
    return _nodes_facts(dict((name.replace("_", "-"), fixture_node(name.replace("_", "-"), python))
                             for name, python in pythons.items()), None, matrix)


# ---------------------------------------------------------------- which CUDA each node's driver allows


def test_nodes_facts_take_the_highest_cuda_from_nvidia_smi():
    facts = node_facts(a30_2="3.11.2", h100_8="3.11.2", h100_1="3.11.2", no_gpu="3.12.3")
    assert [(f["host"], f["accelerator"], f["driver"], f["max_cuda"]) for f in facts] == [
        ("a30-2", "cuda", "535.183.01", "12.2"), ("h100-8", "cuda", "550.90.07", "12.4"),
        ("h100-1", "cuda", "580.159.04", "13.0"), ("no-gpu", "cpu", None, None)]
    assert facts[3]["python"] == (3, 12, 3)


def test_nodes_facts_refuse_a_failed_driver_and_mark_the_row():
    with pytest.raises(StackError) as exc:
        node_facts(driver_failed="3.11.2", h100_1="3.11.2")
    assert str(exc.value).endswith(
        "driver-failed: accelerator cuda but no NVIDIA driver found (no driver version, no CUDA version from "
        "nvidia-smi). Fix: install the NVIDIA driver on driver-failed, or set its stack_accelerator to cpu.")
    assert [(r["host"], r["status"]) for r in exc.value.rows] == [("driver-failed", "no driver"), ("h100-1", "ok")]


# ---------------------------------------------------------------- which releases the pins name


def test_named_releases_resolve_each_pin():
    facts = node_facts(h100_1="3.11.2")
    assert _named_releases({"torch": "2.13", "cuda": "cu130", "deepspeed": "0.19"}, MATRIX, facts) == (
        "2.13", "2.13.0", "0.19", "0.19.8", "13.0")
    assert _named_releases({"torch": "2.12.0", "cuda": "12.6"}, MATRIX, facts) == ("2.12", "2.12.0", None, None, "12.6")
    assert _named_releases({}, MATRIX, facts) == (None, None, None, None, None)


def test_named_releases_do_not_read_the_cuda_pin_after_a_bad_torch_pin():
    with pytest.raises(StackError) as exc:
        _named_releases({"torch": "3.0", "cuda": "12.7"}, MATRIX, node_facts(h100_1="3.11.2"))
    (line,) = str(exc.value).rsplit("\n\n", 1)[-1].splitlines()
    assert line.startswith("all nodes: stack_torch_version 3.0 is not in the matrix (known: 2.13.0, 2.12.1,")


# ---------------------------------------------------------------- which nodes the pins do not fit


def test_cuda_pin_misfits_name_the_driver_below_it():
    facts = node_facts(h100_8="3.11.2", h100_1="3.11.2")
    bad_hosts = {}
    assert _cuda_pin_misfits(facts, "12.8", None, MATRIX, bad_hosts) == [
        "h100-8: stack_cuda_version 12.8 needs driver >= 570.26 (cu128); h100-8 has driver 550.90.07 (max CUDA "
        "12.4). Fix: upgrade the NVIDIA driver on h100-8 to >= 570.26, or set stack_cuda_version to 12.4 (the "
        "newest CUDA build its driver runs), or unset it."]
    assert bad_hosts == {"h100-8": "driver too old"}
    assert _cuda_pin_misfits(facts, "12.4", None, MATRIX, {}) == []


def test_torch_pin_misfits_name_each_old_driver_and_out_of_range_python():
    facts = node_facts(a30_2="3.11.2", h100_8="3.9.18", h100_1="3.11.2")
    bad_hosts = {}
    problems = _torch_pin_misfits(facts, {"torch": "2.13"}, "2.13", None, MATRIX, bad_hosts)
    assert problems == [
        "a30-2: stack_torch_version 2.13 needs driver >= 560.28.03 (cu126, its oldest CUDA build); a30-2 has "
        "driver 535.183.01 (max CUDA 12.2). Fix: upgrade the NVIDIA driver on a30-2 to >= 560.28.03, or set "
        "stack_torch_version to 2.7.1 (the newest torch with a build that a driver for CUDA 12.2 runs), or unset it.",
        "h100-8: stack_torch_version 2.13 takes Python >=3.10,<3.16; h100-8 has python 3.9.18. Fix: use a Python "
        "in that range on h100-8, or set stack_torch_version to a release for Python 3.9.18 (or unset it)."]
    assert bad_hosts == {"a30-2": "driver too old", "h100-8": "python out of range"}


def test_torch_pin_misfits_leave_the_driver_to_a_cuda_pin():
    facts = node_facts(a30_2="3.11.2")
    assert _torch_pin_misfits(facts, {"torch": "2.7", "cuda": "12.6"}, "2.7", "12.6", MATRIX, {}) == []


def test_deepspeed_for_torch_pin():
    assert _deepspeed_for_torch_pin({"torch": "2.13"}, "2.13.0", MATRIX) == []
    matrix = load_matrix({"deepspeed": {"0.19": {"torch": "<2.9"}}})
    assert _deepspeed_for_torch_pin({"torch": "2.13"}, "2.13.0", matrix) == [
        "all nodes: stack_torch_version 2.13 is outside every DeepSpeed release's torch range (0.19.8: torch <2.9). "
        "Fix: set stack_torch_version to a torch in one of those ranges, or add a DeepSpeed release that takes it "
        "with stack_matrix_extra."]


def test_deepspeed_pin_misfits_name_the_torch_then_each_python():
    matrix = load_matrix({"deepspeed": {"0.19": {"torch": ">=2.0.0,<2.9", "python": "<3.11"}}})
    facts = node_facts(matrix, h100_1="3.11.2", no_gpu="3.10.12")
    bad_hosts = {}
    problems = _deepspeed_pin_misfits(facts, {"torch": "2.13", "deepspeed": "0.19.8", "python": None}, "0.19",
                                      "0.19.8", "2.13", "2.13.0", matrix, bad_hosts)
    assert problems == [
        "all nodes: stack_torch_version 2.13 is outside deepspeed 0.19.8's torch range >=2.0.0,<2.9. Fix: set "
        "stack_torch_version to a torch in >=2.0.0,<2.9, or set stack_deepspeed_version to a release that takes "
        "torch 2.13.0 (or unset it).",
        "h100-1: stack_deepspeed_version 0.19.8 takes Python <3.11; h100-1 has python 3.11.2. Fix: use a Python in "
        "that range on h100-1, or set stack_deepspeed_version to another release (or unset it)."]
    assert bad_hosts == {"h100-1": "python out of range"}


# ---------------------------------------------------------------- which torch build fits, which DeepSpeed takes it


def test_newest_stack_takes_the_build_of_the_oldest_driver():
    out = _newest_stack(node_facts(h100_1="3.11.2", no_gpu="3.11.2"), MATRIX, RELEASES, ["0.19"], None, None, None)
    assert out["packages"] == {"h100-1": ["torch==2.13.0+cu130", "deepspeed==0.19.8"],
                               "no-gpu": ["torch==2.13.0", "deepspeed==0.19.8"]}
    out = _newest_stack(node_facts(a30_2="3.11.2", h100_1="3.11.2"), MATRIX, RELEASES, ["0.19"], None, None, None)
    assert (out["torch"], out["builds"]) == ("2.7.1", {"a30-2": "cu118", "h100-1": "cu118"})


def test_newest_stack_is_none_when_nothing_fits():
    facts = node_facts(a30_2="3.14.0")
    assert _newest_stack(facts, MATRIX, RELEASES, ["0.19"], None, None, None) is None


# ---------------------------------------------------------------- why nothing fits


def test_release_fits_by_driver_and_by_python():
    fits, py_fits = _release_fits(node_facts(a30_2="3.14.0", h100_1="3.11.2"), MATRIX, RELEASES, None)
    assert fits == {"a30-2": [], "h100-1": RELEASES}
    assert py_fits == {"a30-2": ["2.13", "2.12", "2.11", "2.10", "2.9"], "h100-1": RELEASES}
    fits, dummy = _release_fits(node_facts(h100_8="3.11.2"), MATRIX, RELEASES, "12.8")
    assert fits == {"h100-8": []}


def test_driver_fix_names_the_lowest_driver_for_the_newest_release():
    (a30,) = node_facts(a30_2="3.14.0")
    assert _driver_fix(a30, ["2.9", "2.13"], MATRIX, None) == (
        "upgrade the NVIDIA driver on a30-2 to >= 560.28.03 (cu126 of torch 2.13.0)")
    assert _driver_fix(a30, ["2.11"], MATRIX, "12.8") == "upgrade the NVIDIA driver on a30-2 to >= 570.26 (cu128 of torch 2.11.0)"
    assert _driver_fix(a30, ["2.13"], MATRIX, "12.8") == "set its stack_accelerator to cpu"


def test_torchless_nodes_name_python_or_driver():
    facts = node_facts(a30_2="3.14.0", h100_8="3.8.10", h100_1="3.11.2")
    fits, py_fits = _release_fits(facts, MATRIX, RELEASES, None)
    bad_hosts = {}
    assert _torchless_nodes(facts, MATRIX, RELEASES, fits, py_fits, None, None, bad_hosts) == [
        "a30-2: driver 535.183.01 (max CUDA 12.2) runs no CUDA build of the torch releases its python 3.14.0 fits "
        "(2.9-2.13). Fix: upgrade the NVIDIA driver on a30-2 to >= 560.28.03 (cu126 of torch 2.13.0), or use a "
        "Python that torch 2.7.1 takes (>=3.9,<3.14) on a30-2.",
        "h100-8: python 3.8.10 fits no torch release (Python ranges: >=3.10,<3.16; >=3.10,<3.15; >=3.9,<3.14). "
        "Fix: use a Python in one of those ranges on h100-8."]
    assert bad_hosts == {"a30-2": "driver too old", "h100-8": "python out of range"}


def test_no_common_torch_names_the_driver_the_other_pythons_outrun():
    facts = node_facts(a30_2="3.11.2", no_gpu="3.14.1")
    fits, py_fits = _release_fits(facts, MATRIX, RELEASES, None)
    common_py = [r for r in RELEASES if all(r in py_fits[f["host"]] for f in facts)]
    bad_hosts = {}
    assert _no_common_torch(facts, MATRIX, fits, py_fits, common_py, None, "python", bad_hosts) == [
        "a30-2: driver 535.183.01 (max CUDA 12.2) runs torch 2.5-2.7 only, but the other nodes' Python needs torch "
        "2.9-2.13. Fix: upgrade the NVIDIA driver on a30-2 to >= 560.28.03 (cu126 of torch 2.13.0)."]
    assert bad_hosts == {"a30-2": "driver too old"}


def test_no_common_torch_names_every_python_when_no_release_takes_them_all():
    facts = node_facts(h100_8="3.9.18", h100_1="3.14.0")
    fits, py_fits = _release_fits(facts, MATRIX, RELEASES, None)
    bad_hosts = {}
    assert _no_common_torch(facts, MATRIX, fits, py_fits, [], None, "python", bad_hosts) == [
        "h100-8: python 3.9.18 fits torch 2.5-2.8; no torch release fits every node's Python. Fix: use the same "
        "Python minor on every node (one that a torch release takes).",
        "h100-1: python 3.14.0 fits torch 2.9-2.13; no torch release fits every node's Python. Fix: use the same "
        "Python minor on every node (one that a torch release takes)."]
    assert bad_hosts == {"h100-8": "python mismatch", "h100-1": "python mismatch"}


def test_deepspeed_refusals_name_the_torch_range_and_each_python():
    matrix = load_matrix({"deepspeed": {"0.19": {"python": "<3.11", "torch": "<2.0"}}})
    facts = node_facts(matrix, h100_1="3.11.2", no_gpu="3.10.12")
    bad_hosts = {}
    assert _deepspeed_refusals(facts, matrix, ["2.13", "2.12"], ["0.19"], None, None, "python", bad_hosts) == [
        "all nodes: deepspeed 0.19.8 takes torch <2.0, which holds none of the torch releases these nodes run "
        "(2.12-2.13). Fix: set stack_deepspeed_version to a release that takes torch 2.13.0, or add one with "
        "stack_matrix_extra.",
        "h100-1: deepspeed 0.19.8 takes Python <3.11; h100-1 has python 3.11.2. Fix: use a Python in that range on "
        "h100-1, or set stack_deepspeed_version to another release."]
    assert bad_hosts == {"h100-1": "python out of range"}
