import mxnet as mx
import pytest

from gluon_mgpu.parallel import dist

JOB = {'DMLC_ROLE': 'worker', 'DMLC_PS_ROOT_URI': '10.0.0.5', 'DMLC_PS_ROOT_PORT': '9100',
       'DMLC_NUM_SERVER': '1', 'DMLC_NUM_WORKER': '3'}


def test_job_env_reads_the_dmlc_variables():
    assert dist.job_env(JOB) == {'role': 'worker', 'num_workers': 3, 'num_servers': 1,
                                 'root': '10.0.0.5:9100'}


def test_job_env_names_what_is_missing_or_wrong():
    with pytest.raises(ValueError, match=r'needs the job variables DMLC_PS_ROOT_PORT, '
                                         r'DMLC_NUM_WORKER, which are not set; start the job '
                                         r'with python -m gluon_mgpu.launch'):
        dist.job_env({k: v for k, v in JOB.items()
                      if k not in ('DMLC_PS_ROOT_PORT', 'DMLC_NUM_WORKER')})
    with pytest.raises(ValueError, match=r"DMLC_NUM_WORKER='two' is not a whole number"):
        dist.job_env(dict(JOB, DMLC_NUM_WORKER='two'))


def test_rank_path():
    assert dist.rank_path('out/net.params', 1) == 'out/net.rank1.params'
    assert dist.rank_path('net', 0) == 'net.rank0'


class _Rank1:
    """Stands for a dist kvstore seen from rank 1: broadcast hands out rank 0's value."""

    def broadcast(self, key, value, out):
        self.key, self.mine = key, value.asscalar()
        out[:] = 4321


def test_without_a_seed_every_worker_takes_rank_0s():
    kv = _Rank1()
    assert dist.shared_seed(kv) == 4321
    assert 0 <= kv.mine < 2 ** 24 and kv.key == 2 ** 30
    # On a real (single-process) kvstore: its own draw, a whole number float32 holds exactly.
    seed = dist.shared_seed(mx.kv.create('local'))
    assert isinstance(seed, int) and 0 <= seed < 2 ** 24


def test_a_given_seed_is_used_as_it_is():
    assert dist.shared_seed(None, 7) == 7
