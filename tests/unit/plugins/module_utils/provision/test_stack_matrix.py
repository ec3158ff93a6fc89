import copy

import pytest

from ansible_collections.multinode.deepspeed.plugins.module_utils.provision.stack_matrix import (
    StackError, build_cuda, build_name, driver_max_cuda, in_range, load_matrix)
from ansible_collections.multinode.deepspeed.plugins.module_utils.provision.stack_select import select_stack
from ansible_collections.multinode.deepspeed.plugins.module_utils.provision.stack_table import format_table
from ansible_collections.multinode.deepspeed.plugins.module_utils.provision.stack_matrix_data import MATRIX

# Nodes as the facts describe them.
A30 = {"python": "3.11.2", "accelerator": "cuda", "cuda_driver_version": "12.2", "driver_version": "535.183.01"}
H100X8 = {"python": "3.11.2", "accelerator": "cuda", "cuda_driver_version": "12.4", "driver_version": "550.90.07"}
H100 = {"python": "3.11.2", "accelerator": "cuda", "cuda_driver_version": "13.0", "driver_version": "580.159.04"}
COORD = {"python": "3.11.2", "accelerator": "cpu", "cuda_driver_version": None, "driver_version": None}
BROKEN = {"python": "3.11.2", "accelerator": "cuda", "cuda_driver_version": None, "driver_version": None}


def node(base, **changes):
    out = dict(base)
    out.update(changes)
    return out


def problems(exc):
    """The problem lines of a StackError (after the table)."""
    return str(exc.value).rsplit("\n\n", 1)[-1].splitlines()


# ---------------------------------------------------------------- the data


def test_matrix_data_is_valid_and_load_matrix_copies_it():
    m = load_matrix()
    assert m == MATRIX and m is not MATRIX
    m["torch"]["2.13"]["versions"].append("2.13.9")
    assert MATRIX["torch"]["2.13"]["versions"] == ["2.13.0"]


@pytest.mark.parametrize("cuda,driver", [
    ("11.8", "520.61.05"), ("12.0", "525.60.13"), ("12.1", "530.30.02"), ("12.2", "535.54.03"),
    ("12.3", "545.23.06"), ("12.4", "550.54.14"), ("12.5", "555.42.02"), ("12.6", "560.28.03"),
    ("12.8", "570.26"), ("12.9", "575.51.03"), ("13.0", "580.65.06")])
def test_driver_table_matches_the_toolkit_release_notes(cuda, driver):
    assert MATRIX["cuda"][cuda] == driver


def test_every_torch_release_has_the_pinned_shape():
    for release, entry in MATRIX["torch"].items():
        assert entry["versions"] and all(v.startswith(release + ".") for v in entry["versions"])
        assert entry["default_build"] in entry["builds"]
        assert set(entry.get("nccl", {})) <= set(entry["builds"])


def test_project_pins_are_in_the_matrix():
    assert "2.13.0" in MATRIX["torch"]["2.13"]["versions"]
    assert in_range("3.11", MATRIX["torch"]["2.13"]["python"])  # wheel METADATA: Requires-Python >=3.10
    assert MATRIX["deepspeed"]["0.19"] == {"versions": ["0.19.8"], "torch": ">=2.0.0", "python": ">=3.8"}


def test_observed_h100_nccl_is_recorded():
    assert MATRIX["torch"]["2.11"]["nccl"]["cu130"] == "2.28.9"


# ---------------------------------------------------------------- helpers


@pytest.mark.parametrize("driver,cuda", [
    ("535.183.01", "12.2"), ("550.90.07", "12.4"), ("580.159.04", "13.0"), ("570.26", "12.8"),
    ("565.57.01", "12.6"), ("520.61.05", "11.8"), ("595.45.04", "13.2")])
def test_driver_max_cuda_uses_the_strict_table(driver, cuda):
    assert driver_max_cuda(driver) == cuda


def test_driver_older_than_the_table_has_no_cuda():
    assert driver_max_cuda("470.256.02") is None


@pytest.mark.parametrize("version,spec,ok", [
    ("3.11.2", ">=3.10,<3.16", True), ("3.15.1", ">=3.10,<3.16", True), ("3.16", ">=3.10,<3.16", False),
    ("3.9.18", ">=3.10", False), ("2.13.0", ">=2.0.0", True), ("2.9.1", "<2.9", False),
    ("3.11.4", "==3.11.*", True), ("3.12.0", "==3.11.*", False), ("3.11", "!=3.11.*", False), ("1.0", "", True)])
def test_in_range(version, spec, ok):
    assert in_range(version, spec) is ok


def test_build_names_round_trip():
    assert build_name("12.8") == "cu128" and build_cuda("cu128") == "12.8"
    assert build_name("13.0") == "cu130" and build_cuda("cu118") == "11.8"
    with pytest.raises(ValueError):
        build_cuda("cpu")


def test_format_table_aligns_columns_and_marks_missing_cells():
    text = format_table([{"host": "a", "python": "3.11.2", "accelerator": "cpu", "status": "ok"},
                         {"host": "long-name", "python": "3.12.1", "accelerator": "cuda", "driver": "580.159.04",
                          "max_cuda": "13.0", "status": "ok"}])
    lines = text.splitlines()
    assert lines[0].split()[:3] == ["HOST", "PYTHON", "ACCEL"]
    assert lines[1].startswith("a          3.11.2")
    assert "580.159.04" in lines[2] and " - " in lines[1]
    assert len(set(line.index("PYTHON") if i == 0 else line.index("3.1") for i, line in enumerate(lines))) == 1


# ---------------------------------------------------------------- selection


def test_h100_with_580_gets_the_newest_torch_on_cu130():
    out = select_stack({"h100-1": H100})
    assert (out["torch"], out["cuda"], out["deepspeed"]) == ("2.13.0", "13.0", "0.19.8")
    assert out["builds"] == {"h100-1": "cu130"}
    assert out["packages"] == {"h100-1": ["torch==2.13.0+cu130", "deepspeed==0.19.8"]}
    assert out["index_urls"] == {"h100-1": "https://download.pytorch.org/whl/cu130"}
    assert out["cuda_toolkit"] == {"h100-1": "13-0"}
    assert out["nccl"] == "2.29.7"


def test_a30_with_535_falls_back_to_the_newest_torch_with_a_build_it_runs():
    # CUDA 12.2: torch 2.8+ start at cu126; 2.7 still has cu118.
    out = select_stack({"a30": A30})
    assert (out["torch"], out["cuda"], out["builds"]["a30"]) == ("2.7.1", "11.8", "cu118")
    assert out["deepspeed"] == "0.19.8"  # torch>=2.0.0 still holds
    assert out["cuda_toolkit"] == {"a30": "11-8"}


def test_h100x8_with_550_runs_the_same_fallback():
    out = select_stack({"h100x8": H100X8})
    assert out["packages"]["h100x8"] == ["torch==2.7.1+cu118", "deepspeed==0.19.8"]


def test_the_driver_version_alone_is_enough():
    out = select_stack({"h100-1": node(H100, cuda_driver_version=None)})
    assert out["cuda"] == "13.0"
    assert out["rows"][0]["max_cuda"] == "13.0"


def test_nvidia_smi_cuda_version_is_preferred_over_the_driver():
    # 12.8 caps the build: torch 2.13 has no cu128, so its cu126 is the highest it runs.
    out = select_stack({"h100-1": node(H100, cuda_driver_version="12.8")})
    assert (out["torch"], out["cuda"]) == ("2.13.0", "12.6")


def test_mixed_cluster_uses_the_lowest_common_build():
    out = select_stack({"a30": A30, "h100-1": H100})
    assert out["builds"] == {"a30": "cu118", "h100-1": "cu118"}
    assert out["torch"] == "2.7.1"


def test_h100_pair_with_550_and_580_shares_one_build():
    out = select_stack({"h100x8": H100X8, "h100-1": H100})
    assert set(out["builds"].values()) == {"cu118"} and out["torch"] == "2.7.1"


def test_cpu_coordinator_gets_the_cpu_build_of_the_same_torch():
    out = select_stack({"coord": COORD, "h100-1": H100})
    assert out["torch"] == "2.13.0"
    assert out["builds"] == {"coord": "cpu", "h100-1": "cu130"}
    assert out["packages"]["coord"] == ["torch==2.13.0", "deepspeed==0.19.8"]
    assert out["index_urls"]["coord"] is None and out["cuda_toolkit"]["coord"] is None
    assert [r["host"] for r in out["rows"]] == ["coord", "h100-1"]


def test_cpu_only_cluster_has_no_cuda():
    out = select_stack({"coord": COORD, "w1": node(COORD, python="3.11.9")})
    assert (out["torch"], out["cuda"], out["nccl"]) == ("2.13.0", None, None)
    assert set(out["builds"].values()) == {"cpu"}


def test_cpu_requirement_and_index_are_configurable():
    matrix = load_matrix({"cpu_requirement": "torch=={version}+{build}",
                          "cpu_index_url": "https://download.pytorch.org/whl/cpu"})
    out = select_stack({"coord": COORD}, matrix=matrix)
    assert out["packages"]["coord"][0] == "torch==2.13.0+cpu"
    assert out["index_urls"]["coord"] == "https://download.pytorch.org/whl/cpu"


def test_result_rows_print_the_chosen_stack():
    out = select_stack({"coord": COORD, "h100-1": H100})
    text = format_table(out["rows"])
    assert "2.13.0+cu130" in text and "2.13.0+cpu" in text
    assert "driver >= 580.65.06 for cu130" in text


def test_select_stack_is_pure():
    nodes = {"a30": A30, "h100-1": H100}
    before = copy.deepcopy(nodes)
    assert select_stack(nodes) == select_stack(nodes)
    assert nodes == before and MATRIX == load_matrix()


# ---------------------------------------------------------------- pins


@pytest.mark.parametrize("pin,version", [("2.13.0", "2.13.0"), ("2.13", "2.13.0"), ("2.12", "2.12.1"),
                                         ("2.12.0", "2.12.0")])
def test_torch_pin_is_honoured(pin, version):
    out = select_stack({"h100-1": H100}, {"torch": pin})
    assert out["torch"] == version and out["cuda"] == "13.0"


def test_cuda_pin_is_honoured():
    out = select_stack({"h100-1": H100, "coord": COORD}, {"cuda": "12.8"})
    assert (out["torch"], out["cuda"]) == ("2.11.0", "12.8")
    assert out["packages"]["h100-1"][0] == "torch==2.11.0+cu128"
    assert out["nccl"] == "2.28.9"


def test_torch_and_cuda_pins_together():
    out = select_stack({"h100-1": H100}, {"torch": "2.9", "cuda": "12.6", "deepspeed": "0.19.8", "python": None})
    assert out["packages"]["h100-1"] == ["torch==2.9.1+cu126", "deepspeed==0.19.8"]


def test_deepspeed_pin_by_release():
    assert select_stack({"h100-1": H100}, {"deepspeed": "0.19"})["deepspeed"] == "0.19.8"


def test_torch_pin_a_driver_cannot_run_names_host_variable_and_fix():
    with pytest.raises(StackError) as exc:
        select_stack({"a30": A30, "h100-1": H100}, {"torch": "2.13.0"})
    lines = problems(exc)
    assert len(lines) == 1
    assert lines[0].startswith("a30: stack_torch_version 2.13.0 needs driver >= 560.28.03 (cu126")
    assert "535.183.01 (max CUDA 12.2)" in lines[0]
    assert "Fix: upgrade the NVIDIA driver on a30 to >= 560.28.03" in lines[0]
    assert "set stack_torch_version to 2.7.1" in lines[0]
    rows = {r["host"]: r for r in exc.value.rows}
    assert rows["a30"]["status"] == "driver too old" and rows["h100-1"]["status"] == "ok"
    assert rows["a30"]["needs"] == "driver >= 560.28.03 for cu126"


def test_cuda_pin_above_a_driver_names_host_variable_and_fix():
    with pytest.raises(StackError) as exc:
        select_stack({"h100x8": H100X8, "h100-1": H100}, {"cuda": "12.8"})
    (line,) = problems(exc)
    assert line.startswith("h100x8: stack_cuda_version 12.8 needs driver >= 570.26 (cu128)")
    assert "Fix: upgrade the NVIDIA driver on h100x8 to >= 570.26" in line
    assert "set stack_cuda_version to 12.4" in line


def test_cuda_pin_the_pinned_torch_has_no_build_for():
    with pytest.raises(StackError, match=r"stack_cuda_version 12.8: torch 2.13 has no cu128 build "
                                         r"\(it has cu126, cu130, cu132\)"):
        select_stack({"h100-1": H100}, {"torch": "2.13", "cuda": "12.8"})


def test_cuda_pin_no_release_builds():
    with pytest.raises(StackError, match="stack_cuda_version 12.7: no torch release in the matrix has a cu127"):
        select_stack({"h100-1": H100}, {"cuda": "12.7"})


@pytest.mark.parametrize("pin", ["3.0", "2.13.7", "latest", "2.4"])
def test_unknown_torch_pin(pin):
    with pytest.raises(StackError) as exc:
        select_stack({"h100-1": H100}, {"torch": pin})
    (line,) = problems(exc)
    assert line.startswith("all nodes: stack_torch_version %s is not in the matrix (known: 2.13.0, " % pin)
    assert "Fix: set stack_torch_version to one of them" in line


def test_torch_pin_with_a_build_tag_is_refused():
    with pytest.raises(StackError, match="set stack_torch_version to 2.13.0 and stack_cuda_version to 13.0"):
        select_stack({"h100-1": H100}, {"torch": "2.13.0+cu130"})


def test_unknown_deepspeed_pin():
    with pytest.raises(StackError, match=r"stack_deepspeed_version 0.14.0 is not in the matrix \(known: 0.19.8\)"):
        select_stack({"h100-1": H100}, {"deepspeed": "0.14.0"})


def test_torch_pin_outside_deepspeed_range():
    matrix = load_matrix({"deepspeed": {"0.19": {"torch": ">=2.0.0,<2.9"}}})
    with pytest.raises(StackError) as exc:
        select_stack({"h100-1": H100}, {"torch": "2.13", "deepspeed": "0.19.8"}, matrix)
    (line,) = problems(exc)
    assert line.startswith("all nodes: stack_torch_version 2.13 is outside deepspeed 0.19.8's torch range")
    assert "Fix: set stack_torch_version to a torch in >=2.0.0,<2.9" in line


def test_torch_pin_no_deepspeed_takes():
    matrix = load_matrix({"deepspeed": {"0.19": {"torch": "<2.9"}}})
    with pytest.raises(StackError, match="stack_torch_version 2.13 is outside every DeepSpeed release's torch range"):
        select_stack({"h100-1": H100}, {"torch": "2.13"}, matrix)


def test_deepspeed_range_lowers_the_unpinned_torch():
    matrix = load_matrix({"deepspeed": {"0.19": {"torch": ">=2.0.0,<2.9"}}})
    out = select_stack({"h100-1": H100}, matrix=matrix)
    assert (out["torch"], out["cuda"]) == ("2.8.0", "12.9")


# ---------------------------------------------------------------- nodes that do not fit


def test_cuda_node_without_driver_is_named_with_the_fix():
    with pytest.raises(StackError) as exc:
        select_stack({"bad-gpu": BROKEN, "h100-1": H100})
    (line,) = problems(exc)
    assert line.startswith("bad-gpu: accelerator cuda but no NVIDIA driver found")
    assert "Fix: install the NVIDIA driver on bad-gpu, or set its stack_accelerator to cpu." in line
    assert {r["host"]: r["status"] for r in exc.value.rows} == {"bad-gpu": "no driver", "h100-1": "ok"}
    assert "bad-gpu" in str(exc.value).split("\n\n")[1]


def test_driver_older_than_every_cuda():
    with pytest.raises(StackError, match=r"old: driver 470.256.02 is older than every CUDA in the matrix "
                                         r"\(CUDA 11.8 needs >= 520.61.05\)"):
        select_stack({"old": node(A30, cuda_driver_version=None, driver_version="470.256.02")})


def test_unknown_accelerator():
    with pytest.raises(StackError, match="r1: stack_accelerator 'rocm' is not one the matrix knows"):
        select_stack({"r1": node(COORD, accelerator="rocm")})


def test_python_below_every_torch():
    with pytest.raises(StackError) as exc:
        select_stack({"h100-1": node(H100, python="3.8.10"), "coord": COORD})
    (line,) = problems(exc)
    assert line.startswith("h100-1: python 3.8.10 fits no torch release")
    assert "Fix: use a Python in one of those ranges on h100-1" in line
    assert {r["host"]: r["status"] for r in exc.value.rows}["h100-1"] == "python out of range"


def test_python_outside_the_pinned_torch():
    with pytest.raises(StackError) as exc:
        select_stack({"a30": node(A30, python="3.14.0")}, {"torch": "2.7"})
    (line,) = problems(exc)
    assert line.startswith("a30: stack_torch_version 2.7 takes Python >=3.9,<3.14; a30 has python 3.14.0.")


def test_new_python_on_an_old_driver():
    # Python 3.14 needs torch >= 2.9, whose oldest build (cu126) needs driver 560.28.03.
    with pytest.raises(StackError) as exc:
        select_stack({"a30": node(A30, python="3.14.0")})
    (line,) = problems(exc)
    assert line.startswith("a30: driver 535.183.01 (max CUDA 12.2) runs no CUDA build")
    assert "upgrade the NVIDIA driver on a30 to >= 560.28.03" in line
    assert "or use a Python that torch 2.7.1 takes" in line


def test_python_on_one_node_and_driver_on_another_conflict():
    with pytest.raises(StackError) as exc:
        select_stack({"a30": A30, "coord": node(COORD, python="3.14.1")})
    (line,) = problems(exc)
    assert line.startswith("a30: driver 535.183.01 (max CUDA 12.2) runs torch 2.5-2.7 only")
    assert "other nodes' Python needs torch 2.9-2.13" in line


def test_pythons_no_single_torch_takes():
    matrix = load_matrix({"torch": {"2.5": None, "2.6": None, "2.7": None, "2.8": None,
                                    "2.13": {"python": ">=3.10,<3.15"}}})
    matrix["torch"]["2.9"]["python"] = ">=3.9,<3.10"
    with pytest.raises(StackError) as exc:
        select_stack({"old": node(COORD, python="3.9.2"), "new": node(COORD, python="3.14.0")}, matrix=matrix)
    lines = problems(exc)
    assert [line.split(":")[0] for line in lines] == ["old", "new"]
    assert all("Fix: use the same Python minor on every node" in line for line in lines)


def test_python_pin_replaces_the_nodes_python():
    out = select_stack({"h100-1": H100}, {"python": "3.12"})
    assert out["rows"][0]["python"] == "3.12"
    with pytest.raises(StackError, match="h100-1: stack_python_version 3.8 fits no torch release"):
        select_stack({"h100-1": H100}, {"python": "3.8"})


def test_deepspeed_python_range():
    matrix = load_matrix({"deepspeed": {"0.19": {"python": "<3.11"}}})
    with pytest.raises(StackError, match=r"h100-1: deepspeed 0.19.8 takes Python <3.11; h100-1 has python 3.11.2"):
        select_stack({"h100-1": H100}, matrix=matrix)
    with pytest.raises(StackError, match="h100-1: stack_deepspeed_version 0.19.8 takes Python <3.11"):
        select_stack({"h100-1": H100}, {"deepspeed": "0.19.8"}, matrix)


def test_error_message_is_a_table_then_problems():
    with pytest.raises(StackError) as exc:
        select_stack({"a30": A30, "h100x8": H100X8, "h100-1": H100, "coord": COORD}, {"torch": "2.13"})
    head, table, tail = str(exc.value).split("\n\n")
    assert head.startswith("No consistent driver/CUDA/PyTorch/DeepSpeed stack")
    assert table == format_table(exc.value.rows)
    assert [line.split(":")[0] for line in tail.splitlines()] == ["a30", "h100x8"]
    assert all("stack_torch_version" in line and "Fix:" in line for line in tail.splitlines())


def test_no_nodes():
    with pytest.raises(StackError, match="no nodes"):
        select_stack({})


# ---------------------------------------------------------------- extending the matrix


def test_user_adds_a_torch_release():
    matrix = load_matrix({"torch": {"2.14": {"versions": ["2.14.0"], "python": ">=3.10,<3.16",
                                             "builds": ["cu126", "cu130", "cu132"], "default_build": "cu132"}}})
    assert "2.13" in matrix["torch"]
    out = select_stack({"h100-1": H100}, matrix=matrix)
    assert out["packages"]["h100-1"][0] == "torch==2.14.0+cu130"
    assert out["nccl"] is None


def test_user_adds_a_cuda_and_a_build():
    matrix = load_matrix({"cuda": {"13.3": "610.43.02"}, "torch": {"2.13": {"builds": ["cu126", "cu130", "cu133"]}}})
    out = select_stack({"b200": node(H100, cuda_driver_version=None, driver_version="610.50.01")}, matrix=matrix)
    assert (out["torch"], out["cuda"]) == ("2.13.0", "13.3")
    assert matrix["torch"]["2.13"]["versions"] == ["2.13.0"]  # merged, not replaced


def test_user_adds_a_deepspeed_release():
    matrix = load_matrix({"deepspeed": {"0.20": {"versions": ["0.20.0"], "torch": ">=2.4", "python": ">=3.10"}}})
    assert select_stack({"h100-1": H100}, matrix=matrix)["deepspeed"] == "0.20.0"
    assert select_stack({"h100-1": H100}, {"deepspeed": "0.19"}, matrix)["deepspeed"] == "0.19.8"


def test_none_removes_an_entry():
    matrix = load_matrix({"torch": {"2.13": None}})
    assert select_stack({"h100-1": H100}, matrix=matrix)["torch"] == "2.12.1"


def test_build_without_a_driver_row_is_refused():
    with pytest.raises(StackError, match="torch 2.13 has build cu135 but the cuda table has no 13.5 row"):
        load_matrix({"torch": {"2.13": {"builds": ["cu130", "cu135"]}}})


@pytest.mark.parametrize("extra,message", [
    ({"torch": {"2.14": {"versions": ["2.14.0"]}}}, "torch 2.14 lacks python, builds"),
    ({"torch": {"2.14": {"versions": ["2.15.0"], "python": ">=3.10", "builds": []}}},
     "lists version 2.15.0 of another release"),
    ({"deepspeed": {"0.20": {"versions": ["0.20.0"], "torch": "newest", "python": ""}}}, "not a version range"),
    ({"cuda": {"13.9": "soon"}}, "cuda '13.9' -> driver 'soon'"),
    ({"torch": "all"}, "section 'torch' is missing or not a mapping"),
])
def test_malformed_extension_is_refused(extra, message):
    with pytest.raises(StackError, match=message):
        load_matrix(extra)


def test_extension_must_be_a_mapping():
    with pytest.raises(StackError, match="not a mapping"):
        load_matrix(["torch"])
