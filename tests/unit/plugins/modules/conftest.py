"""Run a module's main() in this process, as Ansible would with these arguments, and return its JSON result."""
import json

import pytest
from ansible.module_utils.testing import patch_module_args


@pytest.fixture
def run_module(capsys):
    def run(module, args):
        with patch_module_args(args):
            with pytest.raises(SystemExit):
                module.main()
        return json.loads(capsys.readouterr().out)
    return run
