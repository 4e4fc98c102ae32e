"""What one worker of a distributed (``dist_sync``) job needs to know and agree on: the job's
``DMLC_*`` variables, the run every worker trains (its settings and seed), and its own file
names (docs/distributed.md).
"""
import json
import os
import socket

import numpy as np

from ..runtime.choices import DIST_KVSTORES
from ..runtime.hosts import JOB_VARIABLES, job_problem

__all__ = ['DIST_KVSTORES', 'JOB_VARIABLES', 'job_env', 'shared_run', 'rank_path']

# kvstore key of the run's settings and seed; the Trainer uses keys 0, 1, ... (one per
# parameter). Their JSON takes some 500 bytes (--device-weights adds a few per device).
_RUN_KEY, _RUN_BYTES = 2 ** 30, 2 ** 14


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


def shared_run(kv, settings, seed=None):
    """Check that this worker of a job (``dist_sync`` or Horovod) trains rank 0's run, and
    return the run's seed: rank 0's ``seed``, or one rank 0 draws. Every worker calls this at
    the same point, before the Trainer's first step; ``kv.broadcast`` hands out rank 0's value
    (a dist kvstore's ``init`` keeps rank 0's only, ``pull`` gives it to everyone).

    Parameters
    ----------
    kv : KVStore or HorovodKVStore
        The job's kvstore.
    settings : dict
        The run's settings by the train command's names (``batch_size`` is ``--batch-size``),
        None for a flag not given.
    seed : int, optional
        This worker's seed; None (rank 0's): rank 0 draws one.

    Raises
    ------
    ValueError
        The first setting in which this worker differs from rank 0, with both values.
    """
    from mxnet import nd
    shown = {}
    for name, value in settings.items():  # as the message shows them: '--lr 0.1', 'no --seed'
        flag = '--' + name.replace('_', '-')
        shown[name] = (flag if value is True else 'no ' + flag if value is None or value is False
                       else '%s %s' % (flag, ','.join(map(str, value))
                                       if isinstance(value, (list, tuple)) else value))
    who = 'pid %d on %s' % (os.getpid(), socket.gethostname())  # the launcher names pids
    text = json.dumps([shown, np.random.randint(2 ** 31) if seed is None else int(seed), who])
    # A key has one shape for every worker: ASCII bytes as float32 (exact), padded with blanks.
    out = nd.zeros((_RUN_BYTES,))
    kv.broadcast(_RUN_KEY, nd.array(np.frombuffer(text.ljust(_RUN_BYTES)[:_RUN_BYTES].encode(),
                                                  np.uint8)), out=out)
    theirs, seed, first = json.loads(out.asnumpy().astype(np.uint8).tobytes())
    for name, mine in shown.items():
        if mine != theirs.get(name):
            raise ValueError('a worker (%s) trains with %s, rank 0 of the job (%s) with %s: every '
                             'worker of a job must train the same run; start them all with the '
                             'same flags' % (who, mine, first, theirs.get(name)))
    return seed


def rank_path(path, rank):
    """``path`` with ``.rank<rank>`` before its extension (``out.params``: ``out.rank1.params``)."""
    root, ext = os.path.splitext(path)
    return '%s.rank%d%s' % (root, rank, ext)
