# Copyright (c) 2025 NVIDIA CORPORATION & AFFILIATES. All rights reserved.
#
# The five functions of Megatron-LM's megatron/training/utils.py (tag core_v0.16.1) that
# arguments.py imports, copied verbatim, except get_device_arch_version: it asks the GPU, and the
# start-up check runs without one, so it returns the architecture the test gives (an H100,
# Hopper, 9, unless the test sets DEVICE_ARCH). The rest of utils.py needs the training loop.
# See ../../README.md.

import warnings

from megatron.core._rank_utils import safe_get_rank as _safe_get_rank

DEVICE_ARCH = 9


def print_rank_0(message, rank=None):
    """If distributed is initialized or rank is specified, print only on rank 0."""
    if rank is not None:
        if rank == 0:
            print(message, flush=True)
    else:
        if _safe_get_rank() == 0:
            print(message, flush=True)


def warn_rank_0(message, rank=None):
    """If distributed is initialized or rank is specified, warn only on rank 0."""
    if rank is not None:
        if rank == 0:
            warnings.warn(message)
    else:
        if _safe_get_rank() == 0:
            warnings.warn(message)


def is_rank0():
    """Returns true if called in the rank0, false otherwise."""
    return _safe_get_rank() == 0


def get_device_arch_version():
    """Returns GPU arch version (8: Ampere, 9: Hopper, 10: Blackwell, ...): here the test's."""
    return DEVICE_ARCH


def update_use_dist_ckpt(args):
    args.use_dist_ckpt = args.ckpt_format != "torch"
