# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Which NVIDIA driver runs which CUDA, which PyTorch is built for which CUDA, which DeepSpeed
takes which PyTorch: the data ``stack_select.select_stack`` chooses from.

Plain data, so that a user can extend it: ``stack_matrix.load_matrix(extra)`` merges a dict of
the same shape over ``MATRIX`` (dicts are merged key by key, any other value replaces the old
one, ``None`` removes the key).  Version ranges are PEP 440 style specifiers (``>=3.10,<3.16``;
operators ``>= > <= < == !=``, ``==X.Y.*`` for a prefix).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

MATRIX = {
    # CUDA minor -> minimum Linux x86_64 driver of its GA toolkit.
    # Source: NVIDIA CUDA Toolkit release notes, table "CUDA Toolkit and Corresponding Driver
    # Versions" (https://docs.nvidia.com/cuda/cuda-toolkit-release-notes/, archived per release
    # under https://docs.nvidia.com/cuda/archive/<version>/cuda-toolkit-release-notes/).
    # There is no CUDA 12.7.  A driver also runs newer minors of its CUDA major through
    # minor-version compatibility, but the selection uses this strict table only: the driver's
    # highest CUDA is the newest row whose driver it meets (nvidia-smi's "CUDA Version").
    "cuda": {
        "11.8": "520.61.05",
        "12.0": "525.60.13",
        "12.1": "530.30.02",
        "12.2": "535.54.03",
        "12.3": "545.23.06",
        "12.4": "550.54.14",
        "12.5": "555.42.02",
        "12.6": "560.28.03",
        "12.8": "570.26",
        "12.9": "575.51.03",
        "13.0": "580.65.06",
        "13.1": "590.44.01",
        "13.2": "595.45.04",
    },
    # PyTorch release (major.minor) -> its patch releases, Python range, CUDA builds (the wheel's
    # local version tag, i.e. the index https://download.pytorch.org/whl/<build>), the build the
    # plain PyPI wheel for Linux x86_64 is, and the NCCL each build bundles (informational).
    # Every release also has a CPU build (https://download.pytorch.org/whl/cpu, tag +cpu).
    # Sources: pytorch.org/get-started/previous-versions and the download.pytorch.org/whl/cuXYZ
    # indexes (builds per release); the "Release Compatibility Matrix" in pytorch/pytorch
    # RELEASE.md (Python range, stable/experimental CUDA, NCCL per CUDA: 2.10-2.13 rows from
    # pytorch/pytorch PRs #170603, #187075, #190386); the CUDA matrix RFCs pytorch/pytorch
    # #172663 (2.11: CUDA 13.0 becomes the PyPI build) and #178665 (2.12: CUDA 12.8 removed,
    # CUDA 13.2 added); pytorch/FBGEMM#5976 (download.pytorch.org has no cu128 torch 2.12/2.13).
    # NCCL for <= 2.9: the nvidia-nccl-cu12 pin in the wheels' Requires-Dist.  2.11.0+cu130 with
    # NCCL 2.28.9 was also seen on an H100 node.  torch 2.13.0: Requires-Python >=3.10 and
    # classifiers 3.10-3.15 in the installed wheel's METADATA.
    "torch": {
        "2.5": {
            "versions": ["2.5.0", "2.5.1"],
            "python": ">=3.9,<3.14",
            "builds": ["cu118", "cu121", "cu124"],
            "default_build": "cu124",
            "nccl": {"cu121": "2.21.5", "cu124": "2.21.5"},
        },
        "2.6": {
            "versions": ["2.6.0"],
            "python": ">=3.9,<3.14",
            "builds": ["cu118", "cu124", "cu126"],
            "default_build": "cu124",
            "nccl": {"cu124": "2.21.5", "cu126": "2.21.5"},
        },
        "2.7": {
            "versions": ["2.7.0", "2.7.1"],
            "python": ">=3.9,<3.14",
            "builds": ["cu118", "cu126", "cu128"],
            "default_build": "cu126",
            "nccl": {"cu126": "2.26.2", "cu128": "2.26.2"},
        },
        "2.8": {
            "versions": ["2.8.0"],
            "python": ">=3.9,<3.14",
            "builds": ["cu126", "cu128", "cu129"],
            "default_build": "cu128",
            "nccl": {"cu126": "2.27.3", "cu128": "2.27.3", "cu129": "2.27.3"},
        },
        "2.9": {
            "versions": ["2.9.0", "2.9.1"],
            "python": ">=3.10,<3.15",
            "builds": ["cu126", "cu128", "cu130"],
            "default_build": "cu128",
            "nccl": {"cu126": "2.27.5", "cu128": "2.27.5"},
        },
        "2.10": {
            "versions": ["2.10.0"],
            "python": ">=3.10,<3.15",
            "builds": ["cu126", "cu128", "cu130"],
            "default_build": "cu128",
            "nccl": {"cu126": "2.27.5", "cu128": "2.27.5", "cu130": "2.28.9"},
        },
        "2.11": {
            "versions": ["2.11.0"],
            "python": ">=3.10,<3.15",
            "builds": ["cu126", "cu128", "cu130"],
            "default_build": "cu130",
            "nccl": {"cu126": "2.28.9", "cu128": "2.28.9", "cu130": "2.28.9"},
        },
        "2.12": {
            "versions": ["2.12.0", "2.12.1"],
            "python": ">=3.10,<3.15",
            "builds": ["cu126", "cu130", "cu132"],
            "default_build": "cu130",
            "nccl": {"cu126": "2.29.3", "cu130": "2.29.7", "cu132": "2.29.7"},
        },
        "2.13": {
            "versions": ["2.13.0"],
            "python": ">=3.10,<3.16",
            "builds": ["cu126", "cu130", "cu132"],
            "default_build": "cu130",
            "nccl": {"cu126": "2.29.3", "cu130": "2.29.7", "cu132": "2.29.7"},
        },
    },
    # DeepSpeed release (major.minor) -> its patch releases, the torch range it declares and the
    # Python it runs on.  Source: the deepspeed 0.19.8 wheel's METADATA (Requires-Dist
    # torch>=2.0.0; no Requires-Python; classifiers list Python 3.8-3.12; a py3-none-any wheel
    # that pip installs on any Python 3) and DeepSpeed's requirements/requirements.txt.  Older
    # releases are left out: their torch pins changed between releases (one requirements.txt
    # pinned torch<2.7.0), so add them through load_matrix(extra) after checking their METADATA.
    "deepspeed": {
        "0.19": {
            "versions": ["0.19.8"],
            "torch": ">=2.0.0",
            "python": ">=3.8",
        },
    },
    # Requirement strings and indexes.  {version} is the torch version, {build} the CUDA build.
    # The CPU requirement is the plain version: `torch==2.13.0` also matches the CPU index's
    # 2.13.0+cpu (a specifier without a local tag matches any local tag).  Set cpu_index_url to
    # https://download.pytorch.org/whl/cpu to get the CPU build from the index: the plain PyPI
    # wheel for Linux x86_64 is the default_build CUDA build above.
    "cuda_requirement": "torch=={version}+{build}",
    "cpu_requirement": "torch=={version}",
    "deepspeed_requirement": "deepspeed=={version}",
    "index_url": "https://download.pytorch.org/whl/{build}",
    "cpu_index_url": None,
}
