"""The chapter's three ways to split training over devices, each runnable on any devices: data
parallelism by hand (``scratch``), by layers (``layers``) and by channels (``channels``), with
the chapter's own Gluon version in ``gluon_mgpu.training``; ``options`` holds what the command
line calls. docs/three-ways.md explains each.
"""
from .common import (CopyCounter, check_trace, data_parallel_summary, init_one_device,
                     trace_devices, train_split)
from .options import METHODS, check_parallel_options, make_parallel, parse_cut

__all__ = ['METHODS', 'check_parallel_options', 'parse_cut', 'make_parallel',
           'data_parallel_summary', 'train_split', 'init_one_device', 'CopyCounter',
           'trace_devices', 'check_trace']
