"""gluon_mgpu: the d2l chapter "Gluon Implementation for Multi-GPU Computation", runnable anywhere.

``gluon_mgpu.train`` is the training function; ``python -m gluon_mgpu.train`` is the command
line (the module ``gluon_mgpu/train.py``). Importing that module would normally replace the
package attribute ``train`` with the module, so the package keeps the function in place.
"""
import sys
import types

from .threads import configure_threads, format_thread_settings, thread_settings

# Before anything imports MXNet: it reads OMP_NUM_THREADS once, at start-up.
configure_threads()
# The GPU build: load NVIDIA's CUDA wheels' libraries, or say in one line that no driver is there.
from .gpu_build import prepare_for_package  # noqa: E402
prepare_for_package()

from .data import (DataError, DataNotFoundError, find_data_dir, get_fashion_mnist_labels,
                   load_data_fashion_mnist)
from .devices import format_devices, get_devices, try_all_gpus, try_gpu
from .model import Residual, resnet18
from .replicas import (ParameterReplicas, ReplicaMismatchError, ReplicaReport,
                       assert_replicas_match, format_replica_report, format_replica_summary,
                       get_replica, inspect_replicas)
from .training import evaluate_accuracy, split_batch, train, train_epoch

__version__ = '0.1.0'

__all__ = ['Residual', 'resnet18', 'try_gpu', 'try_all_gpus', 'get_devices', 'format_devices',
           'load_data_fashion_mnist', 'find_data_dir', 'get_fashion_mnist_labels', 'DataError',
           'DataNotFoundError', 'evaluate_accuracy', 'split_batch', 'train', 'train_epoch', 'thread_settings',
           'format_thread_settings', 'inspect_replicas', 'assert_replicas_match',
           'ReplicaMismatchError', 'ReplicaReport', 'ParameterReplicas', 'get_replica',
           'format_replica_report', 'format_replica_summary']


class _Package(types.ModuleType):
    def __setattr__(self, name, value):
        # The import system sets `gluon_mgpu.train = <module gluon_mgpu.train>` after the CLI
        # module is first imported; keep the function, the module stays in sys.modules.
        if name == 'train' and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
