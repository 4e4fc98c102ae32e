"""Choosing the devices (MXNet contexts) to train on: GPUs, or CPU contexts that simulate them
(docs/devices.md). MXNet is imported when a function is called, not before.
"""
import logging

from .runtime.checks import check_whole, is_whole
from .runtime.choices import DEVICES as DEVICE_CHOICES  # shared with the parsers
from .runtime.threads import check_cpu_device_count

__all__ = ['num_gpus', 'try_gpu', 'try_all_gpus', 'get_devices', 'DEVICE_CHOICES',
           'format_devices', 'plural', 'abbreviate_devices', 'simulated']

logger = logging.getLogger('gluon_mgpu')


def num_gpus():
    """Return the number of GPUs MXNet can use (0 with the CPU build of MXNet)."""
    import mxnet as mx
    try:
        return mx.context.num_gpus()
    except mx.base.MXNetError:  # a CUDA build of MXNet on a machine without a working driver
        return 0


def simulated(devices):
    """Whether ``devices`` (contexts, or their names) hold two or more CPU contexts: simulated
    devices, which share the machine's cores and MXNet's one pool of CPU scratch buffers, so
    each device's calls are issued from a thread of its own. ``[gpu(0), cpu(0), cpu(1)]`` holds
    two; ``[gpu(0), cpu(0)]`` and ``[cpu(0)]`` none."""
    return sum(str(d).partition('(')[0] == 'cpu' for d in devices) > 1


def try_gpu(i=0):
    """Return ``mx.gpu(i)`` if that GPU exists, otherwise ``mx.cpu()``; ``ValueError`` for an
    ``i`` that numbers no GPU (a whole number from 0)."""
    import mxnet as mx
    if not is_whole(i, 0):
        raise ValueError('i must be a whole number >= 0, got %r; for example try_gpu(0), the '
                         'first GPU' % (i,))
    return mx.gpu(i) if i < num_gpus() else mx.cpu()


def try_all_gpus():
    """Return all GPUs, ``[mx.gpu(0), ...]``, or ``[mx.cpu()]`` if there is no GPU."""
    import mxnet as mx
    return [mx.gpu(i) for i in range(num_gpus())] or [mx.cpu()]


def plural(n, word):
    """``plural(1, 'GPU')`` is ``1 GPU``, ``plural(2, 'GPU')`` is ``2 GPUs``."""
    return '%d %s%s' % (n, word, '' if n == 1 else 's')


def get_devices(num_gpus, device='auto', warn=True):
    """Resolve a device count to a list of MXNet contexts.

    Parameters
    ----------
    num_gpus : int
        How many devices (``--num-gpus``); at least 1.
    device : {'auto', 'gpu', 'cpu'}, default 'auto'
        ``'auto'``: GPUs when the machine has enough; with no GPU at all, ``[cpu(0), ...,
        cpu(n-1)]``, announced by one warning on the ``gluon_mgpu`` logger (unless not
        ``warn``). ``'gpu'``: GPUs or an error. ``'cpu'``: CPU contexts even when GPUs exist.

    Raises
    ------
    ValueError
        For a count below 1, an unknown ``device``, too few GPUs, or more CPU contexts than
        the machine can hold (``threads.check_cpu_device_count``).
    """
    import mxnet as mx
    n = num_gpus
    check_whole('num_gpus', n, 'pass 1 or more')
    if device not in DEVICE_CHOICES:
        raise ValueError('device must be one of %s, got %r; pass device=\'auto\' to use GPUs '
                         'when there are enough and CPU contexts otherwise'
                         % ('/'.join(DEVICE_CHOICES), device))
    found = 0 if device == 'cpu' else _count_gpus()
    if found >= n:
        return [mx.gpu(i) for i in range(n)]
    if device == 'gpu' or found > 0:
        fix = ('pass --num-gpus %d (num_gpus=%d)' % (found, found)) if found else \
            'install a CUDA build of MXNet (see the README)'
        raise ValueError('asked for %s but %s found; %s, or use CPU contexts with '
                         '--device cpu (device=\'cpu\')'
                         % (plural(n, 'GPU'), plural(found, 'GPU') if found else 'no GPU was',
                            fix))
    check_cpu_device_count(n)
    cpus = [mx.cpu(i) for i in range(n)]
    if warn and device == 'auto' and n == 1:
        logger.warning('warning: no GPU found, so training runs on the CPU as [cpu(0)]')
    elif warn and device == 'auto':
        logger.warning("warning: no GPU found, so %s are simulated devices sharing this "
                       "machine's CPU: the data parallelism is real, a speed-up is not expected",
                       abbreviate_devices(cpus))
    return cpus


def _count_gpus():
    # get_devices' argument num_gpus hides the function.
    return num_gpus()


def format_devices(devices):
    """Format contexts as the book prints them: ``[gpu(0), gpu(1)]``."""
    return '[%s]' % ', '.join(str(d) for d in devices)


def abbreviate_devices(devices, limit=8):
    """Format contexts as ``format_devices`` does, eliding the middle of a long list:
    ``[cpu(0), cpu(1), ..., cpu(999)]`` when there are more than ``limit``."""
    devices = list(devices)
    if len(devices) <= limit:
        return format_devices(devices)
    return '[%s, %s, ..., %s]' % tuple(str(d) for d in (devices[0], devices[1], devices[-1]))
