"""The reference pages under docs/reference/ and the variables table of docs/train.md are what the code says:
scripts/gen_docs.py regenerates them from the plugins' DOCUMENTATION/EXAMPLES/RETURN and the roles' argument specs,
and they must match what is committed. Every link between the pages leads somewhere, and every make bench-* target
keeps its result under docs/benchmarks/."""
import ast
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ansible_collections.multinode.deepspeed.plugins.module_utils.launch.backends import DEFAULT, REGISTRY
from ansible_collections.multinode.deepspeed.plugins.module_utils.plan.job import DEFAULTS

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
REFERENCE = ROOT / "docs" / "reference"
TRAIN_PAGE = ROOT / "docs" / "train.md"
pytestmark = pytest.mark.quality
spec = importlib.util.spec_from_file_location("gen_docs", ROOT / "scripts" / "gen_docs.py")
gen_docs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gen_docs)


def pages(folder):
    return {p.relative_to(folder).as_posix(): p.read_text() for p in sorted(folder.rglob("*.md"))}


def stale_pages(committed, generated):
    """``path: why`` of every page that differs between the two trees of pages."""
    out = []
    for path in sorted(set(committed) | set(generated)):
        if path not in committed:
            out.append("%s: missing (the code documents it)" % path)
        elif path not in generated:
            out.append("%s: extra (nothing in the code documents it any more)" % path)
        elif committed[path] != generated[path]:
            out.append("%s: differs from what the code says" % path)
    return out


def test_stale_pages_are_listed():
    """The comparison itself: a changed, a missing and an extra page are each named."""
    committed = {"README.md": "a\n", "modules/x.md": "x\n", "modules/gone.md": "g\n"}
    generated = {"README.md": "a\n", "modules/x.md": "x, edited\n", "filters/new.md": "n\n"}
    assert stale_pages(committed, generated) == [
        "filters/new.md: missing (the code documents it)",
        "modules/gone.md: extra (nothing in the code documents it any more)",
        "modules/x.md: differs from what the code says"]
    assert stale_pages(committed, dict(committed)) == []


def test_reference_pages_and_the_variables_table_match_the_code(tmp_path):
    env = dict(os.environ, PATH="%s:%s" % (BIN, os.environ.get("PATH", "")), ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"))
    train_page = tmp_path / "train.md"
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_docs.py"), "--out", str(tmp_path / "reference"),
                          "--train-page", str(train_page)], cwd=ROOT, env=env, capture_output=True, text=True,
                         check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    generated = pages(tmp_path / "reference")
    assert {"README.md", "modules/hostfile.md", "filters/select_stack.md", "roles/nccl.md"} <= set(generated)
    stale = stale_pages(pages(REFERENCE), generated)
    assert not stale, ("docs/reference/ is stale; run `make docs` and commit the result:\n  " + "\n  ".join(stale))
    assert train_page.read_text() == TRAIN_PAGE.read_text(), (
        "the variables table of docs/train.md differs from job_plan's settings (plugins/modules/job_plan.py); run "
        "`make docs` and commit the result")


def test_the_table_goes_between_its_markers_and_nowhere_else():
    page = "# T\n\n%s\n| old | table |\n%s\n\nafter\n" % (gen_docs.TABLE_BEGIN, gen_docs.TABLE_END)
    assert gen_docs.splice(page, "| new |") == "# T\n\n%s\n| new |\n%s\n\nafter\n" % (
        gen_docs.TABLE_BEGIN, gen_docs.TABLE_END)
    for broken in ("# T\n", page.replace(gen_docs.TABLE_END, ""), page + gen_docs.TABLE_BEGIN + "\n",
                   "%s\n%s\n" % (gen_docs.TABLE_END, gen_docs.TABLE_BEGIN)):
        with pytest.raises(SystemExit, match="docs/train.md must hold the lines"):
            gen_docs.splice(broken, "| new |")


def job_plan_settings():
    """The suboptions of job_plan's settings, read from its DOCUMENTATION string."""
    tree = ast.parse((ROOT / "plugins" / "modules" / "job_plan.py").read_text())
    text = next(node.value.value for node in tree.body if isinstance(node, ast.Assign)
                and [t.id for t in node.targets if isinstance(t, ast.Name)] == ["DOCUMENTATION"])
    return yaml.safe_load(text)["options"]["settings"]["suboptions"]


def test_the_variables_table_holds_every_setting_with_its_default():
    settings = job_plan_settings()
    page = TRAIN_PAGE.read_text()
    table = page[page.index(gen_docs.TABLE_BEGIN):page.index(gen_docs.TABLE_END)]
    rows = re.findall(r"^\| `([a-z_]+)` \| ([^|]+) \|", table, re.M)
    assert [name for name, _default in rows] == sorted(settings)
    for name, default in rows:
        assert default == ("`%s`" % str(settings[name]["default"]).lower() if "default" in settings[name]
                           else "unset"), name
    assert table.count("shlex.split") == 1, "how args is split is said once, in its row"


def test_the_documented_settings_are_the_plans():
    """Each backend is a choice of -e backend, and each default the plan's own (plan/job.py DEFAULTS)."""
    settings = job_plan_settings()
    assert sorted(settings["backend"]["choices"]) == sorted(REGISTRY)
    assert settings["backend"]["default"] == DEFAULT
    for name in set(settings) & set(DEFAULTS):
        assert settings[name].get("default") == DEFAULTS[name], name
    assert {"model", "steps", "timeout", "master_port", "restarts", "recover_wait"} <= set(settings) & set(DEFAULTS)


def test_every_plugin_has_its_page():
    """One page per module and filter file, and per role with an argument spec, all in the index."""
    index = (REFERENCE / "README.md").read_text()
    expected = ["modules/%s.md" % p.stem for p in (ROOT / "plugins" / "modules").glob("*.py") if p.stem != "__init__"]
    expected += ["filters/%s.md" % p.stem for p in (ROOT / "plugins" / "filter").glob("*.py") if p.stem != "__init__"]
    expected += ["roles/%s.md" % p.parent.parent.name for p in (ROOT / "roles").glob("*/meta/argument_specs.yml")]
    for page in sorted(expected):
        assert (REFERENCE / page).is_file(), page
        assert "(%s)" % page in index, page
    assert not (ROOT / "docs" / "modules.md").exists(), "docs/reference/ replaces docs/modules.md"


# --- Links between the pages --------------------------------------------------------------------------------------

LINK = re.compile(r"\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)\)")


def slug(heading):
    """GitHub's anchor of a heading: lower case, without punctuation but '-' and '_', spaces as '-'."""
    return re.sub(r"[^\w\- ]", "", re.sub(r"<[^>]+>", "", heading).strip().lower()).replace(" ", "-")


def prose(text):
    """The text outside fenced code blocks."""
    out, fence = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence:
            out.append(line)
    return out


def anchors(text):
    found = set()
    for line in prose(text):
        heading = re.match(r"^#{1,6} (.*)$", line)
        if heading:
            name, n = slug(heading.group(1)), 0
            while (name if not n else "%s-%d" % (name, n)) in found:
                n += 1
            found.add(name if not n else "%s-%d" % (name, n))
    return found


def broken_links(files, root=ROOT):
    """``page: target (why)`` of every relative link that leads to no file, or to no heading of a page."""
    out = []
    for page in files:
        for target in LINK.findall("\n".join(prose(page.read_text()))):
            if re.match(r"^[a-z]+:", target):
                continue
            path, _sep, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                out.append("%s: %s (no such file)" % (page.relative_to(root), target))
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text()):
                out.append("%s: %s (no such heading)" % (page.relative_to(root), target))
    return out


def test_a_broken_link_is_found(tmp_path):
    (tmp_path / "a.md").write_text("# A page\n\n## The `x` part: one\n\n[b](b.md#there) [a](#the-x-part-one) "
                                   "[gone](gone.md) [c](b.md#nowhere) [web](https://example.org/x)\n"
                                   "```\n[in code](ignored.md)\n```\n")
    (tmp_path / "b.md").write_text("# B\n\n## There\n")
    assert broken_links([tmp_path / "a.md", tmp_path / "b.md"], tmp_path) == [
        "a.md: gone.md (no such file)", "a.md: b.md#nowhere (no such heading)"]


def test_every_link_between_the_pages_leads_somewhere():
    files = [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))
    broken = broken_links(files)
    assert not broken, "links that lead nowhere (a page moved or a heading changed):\n  " + "\n  ".join(broken)


def test_the_readme_is_the_pitch():
    """The README: the pitch, the two commands, a real-cluster quickstart and links; the rest is in docs/."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    assert "make test-fast" in text and "`make test` is the full check" in text


# --- The benchmarks' results ---------------------------------------------------------------------------------------

@pytest.mark.skipif(not os.path.exists("/usr/bin/make"), reason="no make on this machine")
def test_every_bench_target_keeps_its_result():
    """make bench-* runs its launch-cost script through scripts/cost/record.py (make -n: nothing runs)."""
    phony = re.search(r"^\.PHONY:(.*)$", (ROOT / "Makefile").read_text(), re.M).group(1).split()
    targets = [t for t in phony if t.startswith("bench-")]
    assert len(targets) >= 7
    for target in targets:
        out = subprocess.run(["make", "-n", "-C", str(ROOT), "--no-print-directory", target], capture_output=True,
                             text=True, check=True).stdout
        line = [x for x in out.splitlines() if "scripts/cost/" in x][-1]
        assert re.search(r"scripts/cost/record\.py %s -- \S+ scripts/cost/\w+\.py .*--json \S+" % target, line), line
