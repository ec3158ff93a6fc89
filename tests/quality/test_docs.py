"""The reference pages under docs/reference/ are what the code says: scripts/gen_docs.py regenerates them from the
plugins' DOCUMENTATION/EXAMPLES/RETURN and the roles' argument specs, and they must match what is committed."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
REFERENCE = ROOT / "docs" / "reference"
pytestmark = pytest.mark.quality


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


def test_reference_pages_match_the_code(tmp_path):
    env = dict(os.environ, PATH="%s:%s" % (BIN, os.environ.get("PATH", "")), ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"))
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_docs.py"), "--out", str(tmp_path)], cwd=ROOT,
                         env=env, capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    generated = pages(tmp_path)
    assert {"README.md", "modules/hostfile.md", "filters/select_stack.md", "roles/nccl.md"} <= set(generated)
    stale = stale_pages(pages(REFERENCE), generated)
    assert not stale, ("docs/reference/ is stale; run `make docs` and commit the result:\n  " + "\n  ".join(stale))


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
