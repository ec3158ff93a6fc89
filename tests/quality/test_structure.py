"""The shape of the code: module_utils by stage (the folder listing is the architecture) beside one folder of what
several stages share, no function past a screen, small launch backends whose names are compared nowhere but in their
own file."""
import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODULE_UTILS = ROOT / "plugins" / "module_utils"
UNIT_TESTS = ROOT / "tests" / "unit" / "plugins" / "module_utils"
BACKENDS = MODULE_UTILS / "launch" / "backends"
# The stages a run goes through, in order: what the folders of module_utils are named after.
STAGES = ["provision", "plan", "preflight", "launch", "run", "bench"]
# Beside the stages: what more than one stage uses (the run directory's files, read and written without a link).
SHARED = ["common"]
MAX_FUNCTION_LINES = 60
pytestmark = pytest.mark.quality


def python_files(*roots):
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            if "__pycache__" not in path.parts:
                yield path


def long_functions(paths, limit, root=ROOT):
    """(path:line, name, lines) of every function or method longer than ``limit`` lines."""
    out = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    out.append(("%s:%d" % (path.relative_to(root), node.lineno), node.name, lines))
    return out


def test_long_functions_are_found(tmp_path):
    """The measure itself: a 61-line function is listed, a 60-line one is not."""
    body = "\n".join("    x%d = %d" % (i, i) for i in range(59))
    (tmp_path / "a.py").write_text("def short():\n%s\n\n\ndef long():\n%s\n    x = 0\n" % (body, body))
    assert [(name, lines) for _where, name, lines in long_functions([tmp_path / "a.py"], 60, tmp_path)] == [("long", 61)]


def test_no_function_longer_than_a_screen():
    offenders = long_functions(python_files(ROOT / "plugins", ROOT / "multinode_ds"), MAX_FUNCTION_LINES)
    assert not offenders, "functions longer than %d lines (split them by what each part decides):\n%s" % (
        MAX_FUNCTION_LINES, "\n".join("  %s %s: %d lines" % o for o in offenders))


def test_module_utils_folders_are_the_stages():
    entries = sorted(p.name for p in MODULE_UTILS.iterdir() if p.name != "__pycache__")
    assert entries == sorted(STAGES + SHARED), ("plugins/module_utils/ holds one folder per stage and common/ (what "
                                                "several stages use), nothing else")
    for stage in STAGES + SHARED:
        assert (MODULE_UTILS / stage / "__init__.py").exists(), stage
        assert list((MODULE_UTILS / stage).glob("*.py")) != [MODULE_UTILS / stage / "__init__.py"], stage


def test_unit_tests_mirror_the_stages():
    folders = sorted(p.name for p in UNIT_TESTS.iterdir() if p.is_dir() and p.name != "__pycache__")
    assert folders == sorted(STAGES + SHARED)
    for stage in STAGES + SHARED:
        assert list((UNIT_TESTS / stage).glob("test_*.py")), "no unit test for stage %s" % stage


def backend_names():
    """Each backend file's NAME, read from the file itself."""
    out = {}
    for path in BACKENDS.glob("*.py"):
        found = re.search(r'^\s+NAME = "([a-z-]+)"', path.read_text(), re.M)
        if found:
            out[found.group(1)] = path
    return out


def code_lines(path):
    """The lines of a Python file that hold code: not blank, not a comment, not part of a docstring."""
    text = path.read_text()
    docs = set()
    for node in ast.walk(ast.parse(text)):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and \
                isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            docs.update(range(body[0].lineno, body[0].end_lineno + 1))
    return [line for n, line in enumerate(text.splitlines(), 1)
            if n not in docs and line.strip() and not line.strip().startswith("#")]


def test_the_local_backends_are_a_few_lines():
    names = backend_names()
    assert {"pdsh", "ssh-free", "slurm", "kubernetes"} <= set(names)
    for name in ("pdsh", "ssh-free"):
        lines = len(code_lines(names[name]))
        assert lines <= 30, "%s is %d lines of code" % (names[name].relative_to(ROOT), lines)


def test_no_backend_name_is_compared_outside_its_file():
    names = backend_names()
    quoted = "|".join(re.escape(n) for n in names)
    compare = re.compile(r"""(==|!=|\bin\b|\bis\b)\s*\(?\s*['"](%s)['"]|['"](%s)['"]\s*(==|!=)""" % (quoted, quoted))
    found = []
    files = [p for p in python_files(ROOT / "plugins", ROOT / "multinode_ds") if p.parent != BACKENDS]
    files += sorted((ROOT / "roles").rglob("*.yml")) + sorted((ROOT / "playbooks").rglob("*.yml"))
    for path in files:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if compare.search(line):
                found.append("%s:%d: %s" % (path.relative_to(ROOT), number, line.strip()))
    assert not found, "backend names compared outside their own file:\n" + "\n".join(found)


def test_no_two_test_files_share_a_name():
    """pytest imports test files by their base name (no __init__.py in tests/): two with one name stop the whole
    session at collection ("import file mismatch") when both are collected, as make test does."""
    seen = {}
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        if "__pycache__" not in path.parts:
            seen.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    twice = dict((name, paths) for name, paths in seen.items() if len(paths) > 1)
    assert not twice, "test files with the same name (rename one): %s" % twice
