"""image_context's build context: every build writes a directory of its own (two image.yml at once, e.g. a scheduled
build beside one by hand, never write or remove each other's)."""
import os
from pathlib import Path

from ansible_collections.multinode.deepspeed.plugins.modules import image_context

ROOT = Path(__file__).resolve().parents[4]


def planned(tmp_path):
    base = tmp_path / "base.tar"
    base.write_bytes(b"base")
    return {"context": str(tmp_path / "cache" / "context-cpu"), "base": {"tarball": str(base)}}


def wheels(tmp_path):
    folder = tmp_path / "wheels"
    folder.mkdir()
    (folder / "torch-2.13.0-cp311-none-linux_x86_64.whl").write_bytes(b"wheel")
    (folder / "notes.txt").write_text("not a wheel")
    return str(folder)


def test_two_builds_at_once_get_two_contexts_and_neither_touches_the_other(tmp_path):
    image, folder = planned(tmp_path), wheels(tmp_path)
    args = (str(ROOT / "multinode_ds"), str(ROOT / "plugins" / "module_utils"))
    first = image_context.write_context(image, folder, *args, "FROM scratch\n")
    second = image_context.write_context(image, folder, *args, "FROM scratch # 2\n")
    assert first != second
    for ctx, text in ((first, "FROM scratch\n"), (second, "FROM scratch # 2\n")):
        assert os.path.dirname(ctx) == str(tmp_path / "cache")
        assert os.path.basename(ctx).startswith("context-cpu-")
        assert sorted(os.listdir(os.path.join(ctx, "wheels"))) == ["torch-2.13.0-cp311-none-linux_x86_64.whl"]
        assert Path(ctx, "base.tar").read_bytes() == b"base"
        assert Path(ctx, "Containerfile").read_text() == text
        assert Path(ctx, "multinode_ds", "rank.py").is_file()
        assert not list(Path(ctx, "multinode_ds").rglob("__pycache__"))
    assert not os.path.exists(image["context"])  # the planned path itself is never written
