"""How select_stack decides (stack_select), on nodes built from the nvidia-smi fixtures (real captures): each node's
facts, the releases the pins name, the newest stack that fits."""
import pytest

from ansible_collections.multinode.deepspeed.plugins.module_utils.provision.stack_matrix import (
    StackError, load_matrix, newest_first)
from ansible_collections.multinode.deepspeed.plugins.module_utils.provision.stack_select import (
    _named_releases, _newest_stack, _nodes_facts)

from tests.unit.plugins.module_utils.provision.test_accelerator import facts_of

MATRIX = load_matrix()
RELEASES = newest_first(MATRIX["torch"])


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
