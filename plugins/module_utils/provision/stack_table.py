# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node table every answer about the stack prints: one row per node (``node_row``: its Python, accelerator,
driver and highest CUDA, the torch and DeepSpeed it gets or would get, what that needs, its status) and the table as
fixed-width text (``format_table``).

The rows of ``stack_select.select_stack``'s result and of a ``StackError`` (``stack_misfit``) are built here.
Pure Python, no Ansible import.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

COLUMNS = [
    ("host", "HOST"),
    ("python", "PYTHON"),
    ("accelerator", "ACCEL"),
    ("driver", "DRIVER"),
    ("max_cuda", "MAX CUDA"),
    ("torch", "TORCH"),
    ("deepspeed", "DEEPSPEED"),
    ("needs", "NEEDS"),
    ("status", "STATUS"),
]


def format_table(rows):
    """A fixed-width text table of ``rows`` (the ``rows`` of a result or of a ``StackError``)."""
    cells = [[title for key, title in COLUMNS]]
    for row in rows:
        cells.append([str(row.get(key) if row.get(key) not in (None, "") else "-") for key, title in COLUMNS])
    widths = [max(len(line[i]) for line in cells) for i in range(len(COLUMNS))]
    return "\n".join(
        "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(line)).rstrip() for line in cells)


def _python_text(f):
    return f["python_text"] if f["python_text"] is not None else "-"


def node_row(f, torch_text=None, deepspeed=None, needs=None, status="ok"):
    """The table's row of the node whose facts are ``f`` (driver and highest CUDA shown for a GPU node only)."""
    gpu = f["accelerator"] == "cuda"
    return {
        "host": f["host"],
        "python": _python_text(f),
        "accelerator": f["accelerator"],
        "driver": f["driver"] if gpu else None,
        "max_cuda": f["max_cuda"] if gpu else None,
        "torch": torch_text,
        "deepspeed": deepspeed,
        "needs": needs,
        "status": status,
    }
