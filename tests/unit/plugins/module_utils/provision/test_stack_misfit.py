"""Why no stack fits (stack_misfit), on nodes built from the nvidia-smi fixtures (real captures): the nodes a pin
contradicts, then the nodes no torch release fits, no release common to all, no DeepSpeed that takes it."""
from ansible_collections.multinode.deepspeed.plugins.module_utils.provision.stack_matrix import load_matrix
from ansible_collections.multinode.deepspeed.plugins.module_utils.provision.stack_misfit import (
    _cuda_pin_misfits, _deepspeed_for_torch_pin, _deepspeed_pin_misfits, _deepspeed_refusals, _driver_fix,
    _no_common_torch, _release_fits, _torch_pin_misfits, _torchless_nodes)

from tests.unit.plugins.module_utils.provision.test_stack_select import MATRIX, RELEASES, node_facts


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
    assert _driver_fix(a30, ["2.11"], MATRIX, "12.8") == (
        "upgrade the NVIDIA driver on a30-2 to >= 570.26 (cu128 of torch 2.11.0)")
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
