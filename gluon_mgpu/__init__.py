"""gluon_mgpu: the d2l chapter "Gluon Implementation for Multi-GPU Computation", runnable anywhere.

``gluon_mgpu.train`` is the training function; ``python -m gluon_mgpu.train`` is the command
line (the module ``gluon_mgpu/train.py``).
"""
import os
import sys
import types

from . import startup
from .mxnet_env import check_environment
from .threads import configure_threads, thread_settings, usable_cores, warn_if_imported_late

# A Ctrl-C while a command loads MXNet: one line, not a traceback from inside the import.
startup.guard()
# Before anything imports MXNet: it reads OMP_NUM_THREADS once, at start-up, and aborts on a
# value it cannot parse.
try:
    check_environment(os.environ, usable_cores())
    configure_threads()
except ValueError as e:  # a bad MXNet variable or GLUON_MGPU_CPU_DEVICES: a command says so in
    # one line
    _command = startup.starting_command()
    if _command is None:
        raise
    sys.stderr.write('%s: error: %s\n' % (_command, e))
    raise SystemExit(2)
# The book's import order (d2lzh, so MXNet, first) leaves MXNet on half the cores: say so.
warn_if_imported_late()
# The GPU build: load NVIDIA's CUDA wheels' libraries, or say in one line that no driver is there.
from .gpu_build import prepare_for_package  # noqa: E402
prepare_for_package()

from .book import book_setting, init_training, new_network
from .data import (DataError, DataNotFoundError, find_data_dir, get_fashion_mnist_labels,
                   load_data_fashion_mnist)
from .devices import format_devices, get_devices, try_all_gpus, try_gpu
from .events import EpochLine, LossGuard, LossNotFiniteError
from .inference import fold_batchnorm
from .model import Residual, resnet18
from .replicas import (ParameterReplicas, ReplicaCheck, ReplicaMismatchError, ReplicaReport,
                       assert_replicas_match, format_replica_report, format_replica_summary,
                       get_replica, inspect_replicas)
from .training import evaluate_accuracy, split_batch, train, train_batch, train_epoch

startup.release()

__version__ = '0.1.0'

__all__ = ['Residual', 'resnet18', 'try_gpu', 'try_all_gpus', 'get_devices', 'format_devices',
           'load_data_fashion_mnist', 'find_data_dir', 'get_fashion_mnist_labels', 'DataError',
           'DataNotFoundError', 'evaluate_accuracy', 'split_batch', 'train_batch', 'train_epoch',
           'train', 'book_setting', 'new_network', 'init_training', 'EpochLine', 'LossGuard',
           'LossNotFiniteError', 'thread_settings', 'inspect_replicas', 'assert_replicas_match',
           'ReplicaMismatchError', 'ReplicaReport', 'ParameterReplicas', 'get_replica',
           'format_replica_report', 'format_replica_summary', 'ReplicaCheck', 'fold_batchnorm']


class _Package(types.ModuleType):
    # Importing the submodule gluon_mgpu.train (the command line) makes Python set the package
    # attribute `train` to that module, hiding the function. `python -m gluon_mgpu.train` does
    # not (runpy runs it as __main__), but `from gluon_mgpu.train import main` does; renaming
    # either would break the chapter's call or the documented command, so the function stays.
    def __setattr__(self, name, value):
        if name == 'train' and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
