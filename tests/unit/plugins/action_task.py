"""An action plugin of the collection built around a mocked task, as the strategy would hand it over (tests)."""
from unittest.mock import MagicMock

from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar


def action_plugin(cls, action, args, check_mode=False, connection=None):
    """``cls`` (an ActionModule) for a task of ``action`` with ``args``; its connection is ``connection`` or a mock."""
    task = MagicMock()
    task.args = args
    task.async_val = 0
    task.check_mode = check_mode
    task.diff = False
    task.action = action
    return cls(task, connection if connection is not None else MagicMock(), MagicMock(), loader=DataLoader(),
               templar=Templar(loader=DataLoader(), variables={}), shared_loader_obj=None)
