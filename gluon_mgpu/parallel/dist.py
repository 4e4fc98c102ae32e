"""What one worker of a distributed (``dist_sync``) job needs to know and agree on: the job's
``DMLC_*`` variables, a seed shared by all workers, and its own file names (docs/distributed.md).
"""
import os

import numpy as np

__all__ = ['DIST_KVSTORES', 'JOB_VARIABLES', 'job_env', 'shared_seed', 'rank_path']

DIST_KVSTORES = ('dist_sync', 'dist_device_sync')
JOB_VARIABLES = ('DMLC_ROLE', 'DMLC_PS_ROOT_URI', 'DMLC_PS_ROOT_PORT', 'DMLC_NUM_SERVER',
                 'DMLC_NUM_WORKER')

# kvstore key of the shared seed; the Trainer uses keys 0, 1, ... (one per parameter).
_SEED_KEY = 2 ** 30
# float32 holds every whole number below 2**24 exactly.
_SEED_RANGE = 2 ** 24


def job_env(environ=None):
    """Return the job as the ``DMLC_*`` variables describe it, before joining it.

    Returns
    -------
    dict
        ``role`` (``'worker'``, ``'server'`` or ``'scheduler'``), ``num_workers``,
        ``num_servers``, ``root`` (the scheduler's ``host:port``).

    Raises
    ------
    ValueError
        Naming the missing or malformed variables, and how to start a job.
    """
    environ = os.environ if environ is None else environ
    missing = [v for v in JOB_VARIABLES if not environ.get(v)]
    if missing:
        raise ValueError('a dist kvstore needs the job variables %s, which are not set; start '
                         'the job with python -m gluon_mgpu.launch -n WORKERS -s SERVERS -- '
                         'python -m gluon_mgpu.train ...' % ', '.join(missing))
    counts = {}
    for name in ('DMLC_NUM_WORKER', 'DMLC_NUM_SERVER', 'DMLC_PS_ROOT_PORT'):
        try:
            counts[name] = int(environ[name])
        except ValueError:
            raise ValueError('%s=%r is not a whole number' % (name, environ[name])) from None
    return {'role': environ['DMLC_ROLE'], 'num_workers': counts['DMLC_NUM_WORKER'],
            'num_servers': counts['DMLC_NUM_SERVER'],
            'root': '%s:%d' % (environ['DMLC_PS_ROOT_URI'], counts['DMLC_PS_ROOT_PORT'])}


def shared_seed(kv, seed=None):
    """Return a seed every worker of the job agrees on.

    The workers must draw the same initial parameters and the same epoch orders (each takes
    its own shard of the same order). A given ``seed`` is used as it is (every worker runs
    the same command). Without one, rank 0 draws a seed and the kvstore broadcasts it; every
    worker must call this at the same point, before the Trainer's first step.
    """
    if seed is not None:
        return int(seed)
    from mxnet import nd
    mine = np.random.randint(_SEED_RANGE)
    out = nd.zeros((1,))
    # kvstore init keeps rank 0's value only; pull gives it to everyone.
    kv.broadcast(_SEED_KEY, nd.array([mine]), out=out)
    return int(out.asscalar())


def rank_path(path, rank):
    """``path`` with ``.rank<rank>`` before its extension (``out.params``: ``out.rank1.params``)."""
    root, ext = os.path.splitext(path)
    return '%s.rank%d%s' % (root, rank, ext)
