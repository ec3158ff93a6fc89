"""scripts/cost/scale.py: Ansible's growth against the floor measured on the same cluster, the per-node constants
and the projection to 64, 256 and 1024 nodes.

The smallest size is a real measurement (tests/fixtures/bench/bench-scale-3-nodes.json: make bench-scale's 2-worker
size on the 2-core machine, 2026-11-29); the larger one is made of round numbers, so that the arithmetic can be
followed by hand."""
import copy
import importlib.util
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "scripts"))
spec = importlib.util.spec_from_file_location("cost_scale", ROOT / "scripts" / "cost" / "scale.py")
cost_scale = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cost_scale)

SMALL = json.loads((ROOT / "tests" / "fixtures" / "bench" / "bench-scale-3-nodes.json").read_text())


def larger(nodes=17, ansible=5.0, cpu=10.0, kept=(0.5, 0.3), login=(1.7, 1.2)):
    size = copy.deepcopy(SMALL)
    size.update(nodes=nodes, workers=nodes - 1)
    size["median"].update(ansible_s=ansible, controller_cpu_s=cpu, controller_cpu_per_node_s=cpu / nodes)
    size["floor"] = {"kept": {"start_s": kept[0], "read_s": kept[1], "sum_s": sum(kept)},
                     "login": {"start_s": login[0], "read_s": login[1], "sum_s": sum(login)}}
    return size


def test_the_measured_size_has_what_the_report_needs():
    assert SMALL["nodes"] == 3 and SMALL["workers"] == 2
    m = SMALL["median"]
    assert math.isclose(m["ansible_s"], m["before_s"] + m["after_s"])
    assert math.isclose(m["controller_cpu_per_node_s"], m["controller_cpu_s"] / 3)
    for kind in ("login", "kept"):
        floor = SMALL["floor"][kind]
        assert math.isclose(floor["sum_s"], floor["start_s"] + floor["read_s"])
    assert SMALL["floor"]["login"]["sum_s"] > SMALL["floor"]["kept"]["sum_s"]


def test_growth_is_from_the_smallest_size_to_the_largest_against_the_floor_of_the_same_run():
    g = cost_scale.growth([SMALL, larger()])
    assert (g["from_workers"], g["to_workers"]) == (2, 16)
    assert math.isclose(g["ansible_s"], 5.0 - SMALL["median"]["ansible_s"])
    assert math.isclose(g["floor_kept_s"], 0.8 - SMALL["floor"]["kept"]["sum_s"])
    assert math.isclose(g["ansible_to_floor_kept"], g["ansible_s"] / g["floor_kept_s"])
    assert math.isclose(g["floor_login_s"], 2.9 - SMALL["floor"]["login"]["sum_s"])
    # A floor that did not grow gives no ratio rather than a division by zero.
    flat = larger(kept=(SMALL["floor"]["kept"]["start_s"], SMALL["floor"]["kept"]["read_s"]))
    assert cost_scale.growth([SMALL, flat])["ansible_to_floor_kept"] is None


def test_the_constants_reproduce_the_measured_controller_cpu():
    results = [SMALL, larger()]
    k = cost_scale.constants(results)
    for size in results:
        assert math.isclose(k["cpu_fixed_s"] + k["cpu_per_node_s"] * size["nodes"], size["median"]["controller_cpu_s"])
    assert math.isclose(k["cpu_per_node_s"], (10.0 - SMALL["median"]["controller_cpu_s"]) / 14)
    extra = (2.9 - 0.8) - (SMALL["floor"]["login"]["sum_s"] - SMALL["floor"]["kept"]["sum_s"])
    assert math.isclose(k["login_cpu_per_node_s"], extra * 2 / 14)
    assert k["ansible_wave_s"] == SMALL["median"]["ansible_s"]


def test_the_projection_adds_a_wave_of_forks_every_64_nodes_and_names_the_part_that_grew_most():
    results = [SMALL, larger()]
    rows = cost_scale.projection(results)
    assert [r["nodes"] for r in rows] == [64, 256, 1024] and [r["waves"] for r in rows] == [1, 4, 16]
    assert rows[0]["forks_s"] == 0 and math.isclose(rows[1]["forks_s"], 3 * SMALL["median"]["ansible_s"])
    for row in rows:
        parts = {"forks": row["forks_s"], "controller": row["controller_s"], "fanout": row["fanout_s"]}
        assert row["bottleneck"] == max(parts, key=parts.get)
        assert math.isclose(row["launch_s"], SMALL["median"]["ansible_s"]
                            + max(row["forks_s"], row["controller_s"]) + row["fanout_s"])
    assert rows[0]["launch_s"] < rows[1]["launch_s"] < rows[2]["launch_s"]
    # Twice the cores: the controller's and the fan-out's parts halve; the waves of forks do not move.
    wide = cost_scale.projection(results, cores=2 * cost_scale.PROJECT_CORES)
    assert math.isclose(wide[2]["controller_s"], rows[2]["controller_s"] / 2)
    assert math.isclose(wide[2]["fanout_s"], rows[2]["fanout_s"] / 2) and wide[2]["forks_s"] == rows[2]["forks_s"]
    # More forks: fewer waves.
    assert cost_scale.projection(results, forks=1024)[2]["waves"] == 1
