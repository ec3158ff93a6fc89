"""The shape of the code: module_utils by stage (the folder listing is the architecture) beside one folder of what
several stages share, imports that follow the stages' order, no function past a screen, small launch backends whose
names are compared nowhere but in their own file."""
import ast
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
MODULE_UTILS = ROOT / "plugins" / "module_utils"
UNIT_TESTS = ROOT / "tests" / "unit" / "plugins" / "module_utils"
BACKENDS = MODULE_UTILS / "launch" / "backends"
# The stages a run goes through, in order: what the folders of module_utils are named after.  A stage's code may import
# its own, any earlier stage's and common/; never a later stage's.
FLOW = ["provision", "plan", "preflight", "launch", "run"]
# Beside the flow: the inference benchmark, which imports only common/.
STAGES = FLOW + ["bench"]
# Beside the stages: what more than one stage uses (formats, records and rules they share), importing only itself.
SHARED = ["common"]
PACKAGE = "ansible_collections.multinode.deepspeed.plugins.module_utils"
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


def may_import(stage, target):
    """Whether code of ``stage`` (a folder of module_utils) may import from folder ``target``: its own, common/, and,
    for a stage of the flow, an earlier stage of the flow; common/ and bench/ import nothing else."""
    if target == stage or target in SHARED:
        return True
    return stage in FLOW and target in FLOW and FLOW.index(target) < FLOW.index(stage)


def imported_folders(path, root):
    """``(line, folder)`` for each import in ``path`` (under the module_utils tree ``root``) of a module_utils module,
    as Python reads the file: ``import P.x.y``, ``from P.x.y import a``, ``from P import x``, over any number of
    lines and wherever it is (in a function too), and relative imports (``from ..x import a``)."""
    package = list(path.relative_to(root).with_suffix("").parts)[:-1]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level:
            base = package[:len(package) - node.level + 1]
            names = [".".join([PACKAGE] + base + ([node.module] if node.module else []))]
            names = names if base or node.module else [PACKAGE + "." + alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module] if node.module != PACKAGE else [PACKAGE + "." + a.name for a in node.names]
        else:
            continue
        out += [(node.lineno, name[len(PACKAGE) + 1:].split(".")[0]) for name in names
                if name.startswith(PACKAGE + ".")]
    return out


def imports_against_the_flow(root):
    """``path:line: stage imports folder`` for each import in the module_utils tree ``root`` that ``may_import``
    refuses."""
    found = []
    for path in python_files(root):
        stage = path.relative_to(root).parts[0]
        for line, target in imported_folders(path, root):
            if not may_import(stage, target):
                found.append("%s:%d: %s imports %s" % (path.relative_to(root), line, stage, target))
    return found


def test_a_backward_import_is_found(tmp_path):
    """The rule itself, on a planted tree: each form of a backward import is found (a multi-line one, a plain
    ``import``, a package's module, a relative one, one inside a function), bench/ and common/ importing a stage
    too; imports of the same stage, an earlier one and common/ are not."""
    files = {
        "plan/job.py": "from %s.run.watch import (\n    lease_timeout,\n)\nfrom %s.provision.node import X\n",
        "preflight/ssh.py": "import %s.launch.backends\nfrom %s.common import flags\n",
        "provision/node.py": "from %s import plan, common\n",
        "launch/prepare.py": "def f():\n    from ..run import lock\n    from .lock import take\n",
        "run/collected.py": "from %s.plan.hostfile import parse\nfrom %s.launch import lock\n",
        "bench/core.py": "from %s.common.files import read_text\nfrom %s.run.summary import x\n",
        "common/files.py": "from %s.common import lease\nfrom %s.plan import job\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text.replace("%s", PACKAGE))
    assert sorted(imports_against_the_flow(tmp_path)) == [
        "bench/core.py:2: bench imports run", "common/files.py:2: common imports plan",
        "launch/prepare.py:2: launch imports run", "plan/job.py:1: plan imports run",
        "preflight/ssh.py:1: preflight imports launch", "provision/node.py:1: provision imports plan"]


def test_stages_import_only_earlier_stages_and_common():
    found = imports_against_the_flow(MODULE_UTILS)
    assert not found, ("imports against the stages' order (%s; each may use common/; bench/ and common/ use only "
                       "common/): move what two stages share to common/, or have the plugin that composes the stages "
                       "pass it in:\n%s" % (" -> ".join(FLOW), "\n".join(found)))


def test_the_files_the_nodes_get_alone_import_no_collection_module():
    """Role stack copies a few module_utils files into the node package on their own (bench/core.py as benchcore.py,
    plan/dsconfig.py as dsconfigcore.py): a collection import there would fail on the nodes, whatever the stages'
    order allows."""
    tasks = yaml.safe_load((ROOT / "roles" / "stack" / "tasks" / "trainer.yml").read_text())
    copies = [task for task in tasks if "/plugins/module_utils/" in str((task.get("ansible.builtin.copy") or {}).get("src"))]
    shipped = [item["src"] for task in copies for item in task.get("loop") or []]
    assert "bench/core.py" in shipped and "plan/dsconfig.py" in shipped
    for name in shipped:
        assert imported_folders(MODULE_UTILS / name, MODULE_UTILS) == [], name


def test_unit_tests_mirror_the_stages():
    folders = sorted(p.name for p in UNIT_TESTS.iterdir() if p.is_dir() and p.name != "__pycache__")
    assert folders == sorted(STAGES + SHARED)
    for stage in STAGES + SHARED:
        assert list((UNIT_TESTS / stage).glob("test_*.py")), "no unit test for stage %s" % stage


def backend_names():
    """Each backend's NAME, read from its module: a file of the package, or a package's ``__init__.py``."""
    out = {}
    for path in sorted(BACKENDS.glob("*.py")) + sorted(BACKENDS.glob("*/__init__.py")):
        found = re.search(r'^\s+NAME = "([a-z-]+)"', path.read_text(), re.M)
        if found:
            out[found.group(1)] = path
    return out


def test_a_backend_is_one_file_or_one_package():
    """Where is a backend?  Its module in launch/backends/ (a file, or a folder of its own), nothing else of it in
    launch/ (its Kubernetes objects, pods and API client are in its package), and at most one folder of steps in
    role backend."""
    names = backend_names()
    assert {"pdsh", "ssh-free", "slurm", "kubernetes"} <= set(names)
    assert sorted(p.name for p in (MODULE_UTILS / "launch").glob("*.py")) == ["__init__.py", "lock.py", "prepare.py"]
    for folder in sorted(p for p in BACKENDS.iterdir() if p.is_dir() and p.name != "__pycache__"):
        assert (folder / "__init__.py") in names.values(), "%s is a backend's package without its Backend" % folder
    for name, path in names.items():
        tasks = ROOT / "roles" / "backend" / "tasks" / (path.parent.name if path.name == "__init__.py" else path.stem)
        assert not tasks.exists() or tasks.is_dir(), tasks
    # provision/ holds no launch code: nothing of a run's start, drains or batch script.
    for path in python_files(MODULE_UTILS / "provision"):
        assert not re.search(r"def (batch_script|drain_argvs|resume_argvs|pod_spec|objects)\(", path.read_text()), path


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
    files = [p for p in python_files(ROOT / "plugins", ROOT / "multinode_ds") if BACKENDS not in p.parents]
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


def test_every_end_to_end_file_is_marked_e2e():
    """The e2e marker is what puts a test in its lane (tests/e2e/lanes.py), waits for the node image and starts the
    cluster early: an end-to-end file without it ran in the first lane whatever LANE_B said."""
    unmarked = [path.name for path in sorted((ROOT / "tests" / "e2e").glob("test_*.py"))
                if not re.search(r"^pytestmark = .*pytest\.mark\.e2e\b", path.read_text(), re.M)]
    assert not unmarked, "end-to-end files without pytestmark = pytest.mark.e2e: %s" % unmarked
