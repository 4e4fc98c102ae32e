"""What one worker of a distributed (``dist_sync``) job needs to know and agree on: the job's
``DMLC_*`` variables, a seed shared by all workers, and its own file names (docs/distributed.md).
"""
import os

import numpy as np

from ..runtime.hosts import JOB_VARIABLES, job_problem

__all__ = ['DIST_KVSTORES', 'JOB_VARIABLES', 'job_env', 'shared_seed', 'rank_path']

DIST_KVSTORES = ('dist_sync', 'dist_device_sync')

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
        Naming the missing or malformed variable (a role, a host, a port outside 1 to 65535, a
        count below 1: ``hosts.job_problem``), and how to start a job.
    """
    environ = os.environ if environ is None else environ
    problem = job_problem(environ)
    if problem:
        raise ValueError(problem)
    return {'role': environ['DMLC_ROLE'], 'num_workers': int(environ['DMLC_NUM_WORKER']),
            'num_servers': int(environ['DMLC_NUM_SERVER']),
            'root': '%s:%d' % (environ['DMLC_PS_ROOT_URI'], int(environ['DMLC_PS_ROOT_PORT']))}


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
