"""gluon_mgpu: the d2l chapter "Gluon Implementation for Multi-GPU Computation", runnable anywhere.
The package re-exports the chapter's functions: ``gluon_mgpu.train`` is the training function,
``python -m gluon_mgpu.train`` the command line. README.md maps the chapter to the code;
docs/events.md explains the loop and why the command's ``main`` is imported from
``gluon_mgpu.commands.train``.
"""
import os
import sys

from .runtime import startup
from .runtime.mxnet_env import check_environment
from .runtime.threads import (configure_threads, thread_settings, usable_cores,
                              warn_if_imported_late)

# A Ctrl-C while a command loads MXNet: one line, not a traceback from inside the import.
startup.guard()
# Before anything imports MXNet: it reads OMP_NUM_THREADS once, at start-up, and aborts on a
# value it cannot parse.
try:
    check_environment(os.environ, usable_cores())
    configure_threads()
except ValueError as e:  # a bad MXNet variable or GLUON_MGPU_CPU_DEVICES: one line for a command
    _command = startup.starting_command()
    if _command is None:
        raise
    sys.stderr.write('%s: error: %s\n' % (_command, e))
    raise SystemExit(2)
# The book's import order (d2lzh, so MXNet, first) leaves MXNet on half the cores: say so.
warn_if_imported_late()
# The GPU build: load NVIDIA's CUDA wheels' libraries, or say in one line that no driver is there.
from .runtime.gpu_build import prepare_for_package  # noqa: E402
prepare_for_package()

from .data import (DataError, DataNotFoundError, find_data_dir, get_fashion_mnist_labels,
                   load_data_fashion_mnist)
from .devices import format_devices, get_devices, try_all_gpus, try_gpu
from .handlers.events import EpochLine, LossGuard, LossNotFiniteError
from .model import Residual, resnet18
from .replicas import (ParameterReplicas, ReplicaCheck, ReplicaMismatchError, ReplicaReport,
                       assert_replicas_match, format_replica_report, format_replica_summary,
                       get_replica, inspect_replicas)
from .training import (book_setting, evaluate_accuracy, init_training, new_network, split_batch,
                       train, train_batch, train_epoch)

startup.release()

__version__ = '0.1.0'

__all__ = ['Residual', 'resnet18', 'try_gpu', 'try_all_gpus', 'get_devices', 'format_devices',
           'load_data_fashion_mnist', 'find_data_dir', 'get_fashion_mnist_labels', 'DataError',
           'DataNotFoundError', 'evaluate_accuracy', 'split_batch', 'train_batch', 'train_epoch',
           'train', 'book_setting', 'new_network', 'init_training', 'EpochLine', 'LossGuard',
           'LossNotFiniteError', 'thread_settings', 'inspect_replicas', 'assert_replicas_match',
           'ReplicaMismatchError', 'ReplicaReport', 'ParameterReplicas', 'get_replica',
           'format_replica_report', 'format_replica_summary', 'ReplicaCheck']

