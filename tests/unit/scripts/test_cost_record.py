"""scripts/cost/record.py: a benchmark's output and JSON kept as dated files (docs/benchmarks/), none for a failed
one."""
import datetime
import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
spec = importlib.util.spec_from_file_location("cost_record", ROOT / "scripts" / "cost" / "record.py")
cost_record = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cost_record)

DAY = datetime.date(2026, 11, 28)


def test_the_result_is_named_by_its_date_and_target(tmp_path):
    written = cost_record.record("bench-site", ["python", "scripts/cost/site.py", "--sizes", "2"],
                                 "nodes first (s)\n3 98.4\n", {"sizes": [{"nodes": 3}]}, when=DAY, out_dir=tmp_path,
                                 where="2 CPUs", revision="abc1234")
    assert [p.name for p in written] == ["2026-11-28-bench-site.md", "2026-11-28-bench-site.json"]
    text = written[0].read_text()
    assert text.startswith("# bench-site, 2026-11-28\n")
    assert "`make bench-site`: `python scripts/cost/site.py --sizes 2`, on 2 CPUs; commit abc1234." in text
    assert "```\nnodes first (s)\n3 98.4\n```" in text
    assert "[2026-11-28-bench-site.json](2026-11-28-bench-site.json)" in text
    assert json.loads(written[1].read_text()) == {"sizes": [{"nodes": 3}]}


def test_a_second_result_of_the_day_keeps_the_first(tmp_path):
    first = cost_record.record("bench-floor", ["x"], "one\n", when=DAY, out_dir=tmp_path, where="m", revision="r")
    second = cost_record.record("bench-floor", ["x"], "two\n", when=DAY, out_dir=tmp_path, where="m", revision="r")
    third = cost_record.record("bench-floor", ["x"], "three\n", when=DAY, out_dir=tmp_path, where="m", revision="r")
    assert [p.name for p in first + second + third] == [
        "2026-11-28-bench-floor.md", "2026-11-28-bench-floor-2.md", "2026-11-28-bench-floor-3.md"]
    assert "one" in first[0].read_text() and "two" in second[0].read_text()


def test_the_json_argument_is_found_both_ways():
    assert cost_record.json_argument(["a", "--json", "out/x.json", "--rounds", "3"]) == Path("out/x.json")
    assert cost_record.json_argument(["a", "--json=out/y.json"]) == Path("out/y.json")
    assert cost_record.json_argument(["a", "--rounds", "3"]) is None


def test_a_run_that_ends_well_is_recorded_with_its_json_and_plot(tmp_path, capsys):
    data, out = tmp_path / "bench.json", tmp_path / "results"
    script = ("import json, sys; print('round 1 3.0 s'); print('median 3.0 s'); "
              "open(sys.argv[2], 'w').write(json.dumps({'median_s': 3.0})); "
              "open(sys.argv[2][:-5] + '.png', 'wb').write(b'png')")
    rc = cost_record.main(["bench-launch", "--out", str(out), "--", sys.executable, "-c", script, "--json",
                           str(data)])
    assert rc == 0
    assert "round 1 3.0 s\nmedian 3.0 s\n" in capsys.readouterr().out  # what it prints passes through
    today = datetime.date.today().isoformat()
    names = sorted(p.name for p in out.iterdir())
    assert names == ["%s-bench-launch.%s" % (today, ext) for ext in ("json", "md", "png")]
    assert json.loads((out / ("%s-bench-launch.json" % today)).read_text()) == {"median_s": 3.0}
    assert "round 1 3.0 s\nmedian 3.0 s" in (out / ("%s-bench-launch.md" % today)).read_text()


def test_a_failed_run_writes_nothing_and_keeps_its_exit_code(tmp_path):
    out = tmp_path / "results"
    rc = cost_record.main(["bench-recovery", "--out", str(out), "--", sys.executable, "-c",
                           "print('half way'); raise SystemExit(3)"])
    assert rc == 3
    assert not out.exists()
