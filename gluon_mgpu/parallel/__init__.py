"""The chapter's three ways to split training over devices, each runnable on any devices.

* ``scratch``: data parallelism written by hand, as the book's preceding section does it
  (``get_params``, ``allreduce``, ``split_batch``, ``train_batch`` on the book's LeNet);
  the chapter's own Gluon version is ``gluon_mgpu.training``.
* ``layers``: method 1, consecutive layers on consecutive devices, optionally pipelined
  with micro-batches.
* ``channels``: method 2, every convolution, BatchNorm and dense layer split by channels.

Each split network starts from an ordinary one-device network (``init_one_device``) and
reads and writes ordinary ``.params`` files. ``options`` holds what the command line calls.
"""
from .common import CopyCounter, check_trace, init_one_device, trace_devices
from .loop import train_split
from .options import (METHODS, check_parallel_options, data_parallel_summary, make_parallel,
                      parse_cut)

__all__ = ['METHODS', 'check_parallel_options', 'parse_cut', 'make_parallel',
           'data_parallel_summary', 'train_split', 'init_one_device', 'CopyCounter', 'trace_devices',
           'check_trace']
