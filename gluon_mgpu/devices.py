"""Choosing the devices (MXNet contexts) to train on.

This is the only module that asks the machine which GPUs it has, and it asks only when
one of its functions is called, never at import time.
"""
import logging

import mxnet as mx

__all__ = ['num_gpus', 'try_gpu', 'try_all_gpus', 'get_devices', 'DEVICE_CHOICES',
           'format_devices', 'plural']

DEVICE_CHOICES = ('auto', 'gpu', 'cpu')

logger = logging.getLogger('gluon_mgpu')


def num_gpus():
    """Return the number of GPUs MXNet can use (0 with the CPU build of MXNet)."""
    try:
        return mx.context.num_gpus()
    except mx.base.MXNetError:
        # A CUDA build of MXNet on a machine without a working driver.
        return 0


def try_gpu(i=0):
    """Return ``mx.gpu(i)`` if that GPU exists, otherwise ``mx.cpu()``."""
    return mx.gpu(i) if i < num_gpus() else mx.cpu()


def try_all_gpus():
    """Return all GPUs, ``[mx.gpu(0), ...]``, or ``[mx.cpu()]`` if there is no GPU."""
    n = num_gpus()
    return [mx.gpu(i) for i in range(n)] if n else [mx.cpu()]


def plural(n, word):
    """``plural(1, 'GPU')`` is ``1 GPU``, ``plural(2, 'GPU')`` is ``2 GPUs``."""
    return '%d %s%s' % (n, word, '' if n == 1 else 's')


def get_devices(num_gpus, device='auto', warn=True):
    """Resolve a device count to a list of MXNet contexts.

    Parameters
    ----------
    num_gpus : int
        How many devices to train on (``--num-gpus``); at least 1.
    device : {'auto', 'gpu', 'cpu'}, default 'auto'
        ``'auto'``: GPUs when the machine has enough of them; on a machine with no GPU at all,
        ``[cpu(0), ..., cpu(n-1)]``: simulated devices that share the CPU, announced by one
        warning line on the ``gluon_mgpu`` logger. ``'gpu'``: GPUs or an error, never a
        fallback. ``'cpu'``: CPU contexts even when GPUs exist.
    warn : bool, default True
        Log the warning about simulated devices. A caller that resolves several counts in a
        row (the sweep) passes False for all but one, so the warning appears once.

    Returns
    -------
    list of mxnet.Context

    Raises
    ------
    ValueError
        For a count below 1, an unknown ``device``, or fewer GPUs than asked for when the
        machine has GPUs (``'auto'``) or when GPUs were required (``'gpu'``). The message names
        both numbers and the fix.
    """
    n = num_gpus
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError('num_gpus must be a whole number >= 1, got %r; pass 1 or more' % (n,))
    if device not in DEVICE_CHOICES:
        raise ValueError('device must be one of %s, got %r; pass device=\'auto\' to use GPUs '
                         'when there are enough and CPU contexts otherwise'
                         % ('/'.join(DEVICE_CHOICES), device))
    cpus = [mx.cpu(i) for i in range(n)]
    if device == 'cpu':
        return cpus
    found = _count_gpus()
    if found >= n:
        return [mx.gpu(i) for i in range(n)]
    if device == 'gpu' or found > 0:
        fix = ('pass --num-gpus %d (num_gpus=%d)' % (found, found)) if found else \
            'install a CUDA build of MXNet (see the README)'
        raise ValueError('asked for %s but %s found; %s, or use CPU contexts with '
                         '--device cpu (device=\'cpu\')'
                         % (plural(n, 'GPU'), plural(found, 'GPU') if found else 'no GPU was',
                            fix))
    if warn and n == 1:
        logger.warning('warning: no GPU found, so training runs on the CPU as [cpu(0)]')
    elif warn:
        logger.warning("warning: no GPU found, so %s are simulated devices sharing this "
                       "machine's CPU: the data parallelism is real, a speed-up is not expected",
                       format_devices(cpus))
    return cpus


def _count_gpus():
    # get_devices' argument is called num_gpus (the public signature), hiding the function.
    return num_gpus()


def format_devices(devices):
    """Format contexts as the book prints them: ``[gpu(0), gpu(1)]``."""
    return '[%s]' % ', '.join(str(d) for d in devices)
