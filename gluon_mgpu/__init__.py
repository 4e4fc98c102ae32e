"""gluon_mgpu: the d2l chapter "Gluon Implementation for Multi-GPU Computation", runnable anywhere.
``gluon_mgpu.train`` is the chapter's training function, ``python -m gluon_mgpu.train`` the
command line; README.md maps the chapter to the code.

Importing the package does only what must come before MXNet starts: it chooses MXNet's threads
(docs/devices.md) and has ``import mxnet`` run its checks first (``_BeforeMXNet``). The rest is
imported when first used.
"""
import importlib.util
import sys

from .runtime.threads import configure_threads, thread_settings, warn_if_imported_late

from ._version import __version__

_EXPORTS = {
    'data': ('DataError', 'DataNotFoundError', 'find_data_dir', 'get_fashion_mnist_labels',
             'load_data_fashion_mnist'),
    'devices': ('format_devices', 'get_devices', 'try_all_gpus', 'try_gpu'),
    'handlers.checkpoint': ('CheckpointError', 'lock_dir', 'read_checkpoint', 'restore',
                            'resumable'),
    'handlers.checkpoint_names': ('list_checkpoints',),
    'handlers.interrupts': ('DeferredInterrupt',),
    # What a script beside the package builds a command from (docs/python.md):
    'commands.cli': ('CommandError', 'Parser', 'UsageError', 'run_command'),
    'commands.train': ('recorded_settings', 'resolve'),
    'runtime.files': ('atomic_path', 'open_input', 'output_problem'),
    'handlers.events': ('EpochLine', 'LossGuard', 'LossNotFiniteError', 'format_epoch'),
    'model': ('Residual', 'resnet18'),
    'handlers.replica_check': ('ReplicaCheck',),
    'replicas': ('ParameterReplicas', 'ReplicaMismatchError', 'ReplicaReport',
                 'assert_replicas_match', 'format_replica_report', 'format_replica_summary',
                 'get_replica', 'inspect_replicas'),
    'training': ('book_setting', 'evaluate_accuracy', 'init_training', 'new_network',
                 'split_batch', 'train', 'train_batch', 'train_epoch'),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_WHERE) + ['thread_settings']


class _BeforeMXNet:
    """On ``sys.meta_path`` until MXNet is imported: runs the checks that must come before it
    (``runtime.mxnet_env``, ``runtime.gpu_build``), then steps aside. A command runs them
    itself first, to refuse in one line (``runtime.startup.before_mxnet``)."""

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name == 'mxnet' and cls in sys.meta_path:
            sys.meta_path.remove(cls)
            from .runtime import gpu_build, startup
            try:
                startup.prepare_mxnet()  # nothing if the command's before_mxnet ran it
            except (ValueError, gpu_build.GPUBuildError) as e:
                main = getattr(sys.modules.get('__main__'), '__spec__', None)
                if main is None or not main.name.startswith(__name__ + '.'):
                    raise
                # python -m gluon_mgpu.<module> whose first import is MXNet's: one line.
                sys.stderr.write('python -m %s: error: %s\n'
                                 % (main.name.removesuffix('.__main__'), e))
                raise SystemExit(2)
        return None


try:
    configure_threads()
except ValueError:  # a bad GLUON_MGPU_CPU_DEVICES: raised again where MXNet is about to start
    pass
if 'mxnet' not in sys.modules:
    sys.meta_path.insert(0, _BeforeMXNet)
# The book's import order (d2lzh, so MXNet, first) leaves MXNet on half the cores: say so.
warn_if_imported_late()


def __getattr__(name):
    """The chapter's names (``gluon_mgpu.train``) and the package's modules
    (``gluon_mgpu.training``), imported when first used."""
    module = _WHERE.get(name)
    if module is not None:
        value = getattr(importlib.import_module('.' + module, __name__), name)
    elif not name.startswith('_') and importlib.util.find_spec(__name__ + '.' + name):
        value = importlib.import_module('.' + name, __name__)
    else:
        raise AttributeError('module %r has no attribute %r' % (__name__, name))
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_WHERE))
