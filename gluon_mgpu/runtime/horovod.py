"""Horovod's ring allreduce as the kvstore of the chapter's Trainer: gradients summed across
the processes of a ``horovodrun`` job, parameters broadcast from rank 0 (docs/distributed.md)."""
import importlib.util
import os

from mxnet import nd
from mxnet.kvstore import KVStoreBase

from .checks import is_digits

__all__ = ['HorovodKVStore', 'INSTALL', 'import_horovod', 'job_env', 'worker_rank']

INSTALL = 'make horovod-install'
_NOT_STARTED = ('so this process was not started by horovodrun; start the job with horovodrun '
                '-np 2 -H localhost:2 --gloo python -m gluon_mgpu.train --kvstore horovod ...')
# What Horovod (and Gloo under it) raise in the other processes once one of them has stopped.
PEER_GONE = ('Horovod has been shut down', 'Connection reset by peer',
             'Connection closed by peer')


def import_horovod():
    """``horovod.mxnet``, initialized; ``ImportError`` naming the install command without it."""
    try:
        import horovod.mxnet as hvd
    except ImportError as e:
        raise ImportError('Horovod is not installed in this environment (%s); build it with %s'
                          % (e, INSTALL)) from None
    hvd.init()
    return hvd


@KVStoreBase.register
class HorovodKVStore(KVStoreBase):
    """A kvstore for ``gluon.Trainer(..., kvstore=HorovodKVStore())`` in every process of a job:
    ``pushpull`` sums over this process's devices, then over all processes; ``broadcast`` gives
    every device rank 0's value; the Trainer keeps the optimizer (docs/distributed.md).
    """

    def __init__(self):
        self._hvd = import_horovod()

    def broadcast(self, key, value, out, priority=0):
        root = value.copy()
        self._hvd.broadcast_(root, root_rank=0, name='gluon_mgpu.%s' % (key,), priority=priority)
        for o in out if isinstance(out, list) else [out]:
            root.copyto(o)

    def pushpull(self, key, value, out=None, priority=0):
        values = value if isinstance(value, list) else [value]
        total = values[0].copy() if len(values) == 1 else \
            nd.add_n(*[v.as_in_context(values[0].context) for v in values])
        self._hvd.allreduce_(total, average=False, name='gluon_mgpu.%s' % (key,),
                             priority=priority)
        targets = values if out is None else (out if isinstance(out, list) else [out])
        for t in targets:
            total.copyto(t)

    @staticmethod
    def is_capable(capability):
        if capability.lower() == KVStoreBase.OPTIMIZER:
            return False
        raise ValueError('unknown capability %r' % (capability,))

    @property
    def type(self):
        return 'horovod'

    @property
    def rank(self):
        return self._hvd.rank()

    @property
    def num_workers(self):
        return self._hvd.size()


def job_env(environ=None):
    """This process's place in a ``horovodrun`` job, read before joining it: ``{'rank': r,
    'size': n}``; ``ValueError`` naming what is missing (Horovod, or the job)."""
    environ = os.environ if environ is None else environ
    if importlib.util.find_spec('horovod') is None:
        raise ValueError('Horovod is not installed in this environment; build it with %s'
                         % INSTALL)
    for name in ('HOROVOD_RANK', 'HOROVOD_SIZE'):
        value = environ.get(name, '')
        if not is_digits(value):
            raise ValueError('%s is %s, %s' % (name, repr(value) if value else 'not set',
                                               _NOT_STARTED))
    rank, size = int(environ['HOROVOD_RANK']), int(environ['HOROVOD_SIZE'])
    if not rank < size:  # horovodrun sets a rank below a size of 1 or more
        raise ValueError('HOROVOD_RANK=%d and HOROVOD_SIZE=%d: a rank must be below the job\'s '
                         'size, %s' % (rank, size, _NOT_STARTED))
    return {'rank': rank, 'size': size}


def worker_rank(environ=None):
    """This process's rank in a ``horovodrun`` job, or None outside one."""
    value = (os.environ if environ is None else environ).get('HOROVOD_RANK', '')
    return int(value) if is_digits(value) else None
