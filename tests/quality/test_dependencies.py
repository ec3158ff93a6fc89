"""galaxy.yml declares every collection the collection uses: each FQCN outside ansible.builtin and this collection -
a task's module or action, a filter or test, a lookup, a callback, a Python import from ansible_collections - names a
collection galaxy.yml's dependencies list (ansible-galaxy would install the collection without it)."""
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
OWN = {"ansible.builtin", "ansible.legacy", "multinode.deepspeed"}
NAME = r"[a-z0-9_]+"
FQCN = re.compile(r"^(%s\.%s)\.%s$" % (NAME, NAME, NAME))
# In a template: ``| ns.coll.filter``, ``is ns.coll.test``, ``lookup('ns.coll.x')``, ``query("ns.coll.x")``.
IN_TEXT = re.compile(r"(?:\|\s*|\bis\s+(?:not\s+)?|\b(?:lookup|query|q)\(\s*['\"])(%s\.%s)\.%s\b" % (NAME, NAME, NAME))
PY_IMPORT = re.compile(r"ansible_collections\.(%s)\.(%s)\b" % (NAME, NAME))
# The keys whose value names a role: include_role/import_role (name:), a play's roles (role:).
ROLE_KEYS = ("include_role", "import_role", "role", "strategy")
SOURCES = ("roles", "playbooks", "plugins", "extensions")


def declared():
    galaxy = yaml.safe_load((ROOT / "galaxy.yml").read_text())
    return set((galaxy.get("dependencies") or {}).keys())


def walk(node, found, where):
    """Collections named by ``node`` (a loaded YAML document): FQCN keys of mappings, and template text."""
    if isinstance(node, dict):
        for key, value in node.items():
            match = FQCN.match(str(key))
            if match:
                found.setdefault(match.group(1), set()).add(where)
            if str(key).rsplit(".", 1)[-1] in ROLE_KEYS:
                # An included role, or a play's role, by its FQCN.
                role = value.get("name") or value.get("role") if isinstance(value, dict) else value
                match = FQCN.match(str(role or "").strip())
                if match:
                    found.setdefault(match.group(1), set()).add(where)
            walk(value, found, where)
    elif isinstance(node, list):
        for item in node:
            walk(item, found, where)
    elif isinstance(node, str):
        for name in IN_TEXT.findall(node):
            found.setdefault(name, set()).add(where)


def used(root):
    found = {}
    files = [p for d in SOURCES for p in (root / d).rglob("*") if p.is_file()] + sorted(root.glob("*.yml"))
    for path in files:
        rel = str(path.relative_to(root))
        if path.suffix in (".yml", ".yaml") and rel != "galaxy.yml":
            try:
                docs = list(yaml.safe_load_all(path.read_text()))
            except yaml.YAMLError:
                continue
            for doc in docs:
                walk(doc, found, rel)
        elif path.suffix == ".py":
            for ns, coll in PY_IMPORT.findall(path.read_text()):
                found.setdefault("%s.%s" % (ns, coll), set()).add(rel)
        elif path.suffix == ".j2":
            for name in IN_TEXT.findall(path.read_text()):
                found.setdefault(name, set()).add(rel)
    cfg = root / "ansible.cfg"
    if cfg.exists():
        for line in cfg.read_text().splitlines():
            key, _sep, value = line.partition("=")
            if key.strip() in ("callbacks_enabled", "callback_whitelist", "stdout_callback", "strategy"):
                for item in value.split(","):
                    match = FQCN.match(item.strip())
                    if match:
                        found.setdefault(match.group(1), set()).add("ansible.cfg")
    return dict((k, v) for k, v in found.items() if k not in OWN)


def test_every_collection_used_is_declared():
    missing = dict((k, sorted(v)[:3]) for k, v in used(ROOT).items() if k not in declared())
    assert not missing, "galaxy.yml's dependencies lack (collection: where it is used): %s" % missing


def test_the_scan_finds_what_a_role_would_use(tmp_path):
    """The check itself: a module key, a filter, a lookup, an included role and a Python import are each found."""
    (tmp_path / "roles" / "r" / "tasks").mkdir(parents=True)
    (tmp_path / "roles" / "r" / "tasks" / "main.yml").write_text(
        "- name: a\n  community.docker.docker_container: {name: x}\n"
        "- name: b\n  ansible.builtin.debug:\n    msg: \"{{ x | community.general.json_query('a') }}\"\n"
        "- name: c\n  ansible.builtin.set_fact:\n    y: \"{{ lookup('community.hashi_vault.hashi_vault', 'p') }}\"\n"
        "- name: d\n  ansible.builtin.include_role:\n    name: containers.podman.podman_image\n")
    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins" / "x.py").write_text("from ansible_collections.kubernetes.core.plugins import k\n")
    assert set(used(tmp_path)) == {"community.docker", "community.general", "community.hashi_vault",
                                   "containers.podman", "kubernetes.core"}
