"""What every unit test shares."""
import pytest


@pytest.fixture(autouse=True, scope="session")
def _records_away_from_this_machine(tmp_path_factory):
    """No unit test reads or writes the quarantine and spares records' real default place on this machine (the
    shared directory's default, /srv/multinode-deepspeed): a module called without their paths uses a temporary
    directory instead."""
    # pylint: disable=import-outside-toplevel
    from ansible_collections.multinode.deepspeed.plugins.module_utils.provision import node_read
    from ansible_collections.multinode.deepspeed.plugins.module_utils.common import records
    patch = pytest.MonkeyPatch()
    shared = str(tmp_path_factory.mktemp("shared-dir"))
    patch.setattr(records, "SHARED_DIR", shared)
    patch.setattr(node_read, "SHARED_DIR", shared)
    yield shared
    patch.undo()
