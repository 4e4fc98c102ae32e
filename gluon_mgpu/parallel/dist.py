"""What one worker of a distributed (``dist_sync``) job needs to know and agree on: the job's
``DMLC_*`` variables, a seed shared by all workers, and its own file names (docs/distributed.md).
"""
import os

import numpy as np

from ..runtime.choices import DIST_KVSTORES
from ..runtime.hosts import JOB_VARIABLES, job_problem

__all__ = ['DIST_KVSTORES', 'JOB_VARIABLES', 'job_env', 'shared_seed', 'rank_path']

# kvstore key of the shared seed; the Trainer uses keys 0, 1, ... (one per parameter).
_SEED_KEY = 2 ** 30


def job_env(environ=None):
    """Return the job as the ``DMLC_*`` variables describe it, before joining it.

    Returns
    -------
    dict
        ``role``, ``num_workers``, ``num_servers``, ``root`` (the scheduler's ``host:port``).

    Raises
    ------
    ValueError
        ``hosts.job_problem``'s sentence: the missing or malformed variable, how to start a job.
    """
    environ = os.environ if environ is None else environ
    problem = job_problem(environ)
    if problem:
        raise ValueError(problem)
    return {'role': environ['DMLC_ROLE'], 'num_workers': int(environ['DMLC_NUM_WORKER']),
            'num_servers': int(environ['DMLC_NUM_SERVER']),
            'root': '%s:%d' % (environ['DMLC_PS_ROOT_URI'], int(environ['DMLC_PS_ROOT_PORT']))}


def shared_seed(kv, seed=None):
    """Return a seed every worker of the job agrees on (the same initial parameters and epoch
    orders): ``seed`` when given, else one rank 0 draws and ``kv`` broadcasts; then every
    worker must call this at the same point, before the Trainer's first step."""
    if seed is not None:
        return int(seed)
    from mxnet import nd
    out = nd.zeros((1,))
    # kvstore init keeps rank 0's value only; pull gives it to everyone. float32 holds every
    # whole number below 2**24 exactly.
    kv.broadcast(_SEED_KEY, nd.array([np.random.randint(2 ** 24)]), out=out)
    return int(out.asscalar())


def rank_path(path, rank):
    """``path`` with ``.rank<rank>`` before its extension (``out.params``: ``out.rank1.params``)."""
    root, ext = os.path.splitext(path)
    return '%s.rank%d%s' % (root, rank, ext)
