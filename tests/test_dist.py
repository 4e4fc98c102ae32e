import os
import re
import socket

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


class _Worker:
    """Stands for a dist kvstore seen from ``rank``: ``broadcast`` hands out what rank 0 sent
    (``sent``, or its own value on rank 0), as MXNet's init and pull do."""

    def __init__(self, rank, sent=None):
        self.rank, self.sent = rank, sent

    def broadcast(self, key, value, out):
        self.key, self.mine = key, value
        out[:] = value if self.sent is None else self.sent


RUN = {'batch_size': 64, 'lr': 0.1, 'seed': None, 'hybridize': True, 'sync_bn': False,
       'device_weights': [3.0, 1.0], 'cut': ('stage2', 'stage3'), 'model': 'lenet'}
HERE = 'pid %d on %s' % (os.getpid(), socket.gethostname())


def test_without_a_seed_every_worker_takes_rank_0s():
    rank0 = _Worker(0)
    seed = dist.shared_run(rank0, RUN)
    assert 0 <= seed < 2 ** 31 and rank0.key == 2 ** 30 and rank0.mine.shape == (2 ** 14,)
    rank1 = _Worker(1, rank0.mine)
    assert dist.shared_run(rank1, RUN) == seed and rank1.mine.shape == (2 ** 14,)
    # On a real (single-process) kvstore: its own draw.
    seed = dist.shared_run(mx.kv.create('local'), RUN)
    assert isinstance(seed, int) and 0 <= seed < 2 ** 31


def test_a_given_seed_is_used_as_it_is():
    assert dist.shared_run(mx.kv.create('local'), dict(RUN, seed=7), 7) == 7
    rank0 = _Worker(0)
    assert dist.shared_run(rank0, RUN, 2 ** 31 - 1) == 2 ** 31 - 1  # beyond float32's 2**24
    assert dist.shared_run(_Worker(1, rank0.mine), RUN) == 2 ** 31 - 1


@pytest.mark.parametrize('change,mine,theirs', [
    ({'lr': 0.2}, '--lr 0.2', '--lr 0.1'),
    ({'batch_size': 32}, '--batch-size 32', '--batch-size 64'),
    ({'seed': 0}, '--seed 0', 'no --seed'),
    ({'hybridize': False}, 'no --hybridize', '--hybridize'),
    ({'sync_bn': True}, '--sync-bn', 'no --sync-bn'),
    ({'device_weights': [1.0, 1.0]}, '--device-weights 1.0,1.0', '--device-weights 3.0,1.0'),
    ({'cut': ('stage2',)}, '--cut stage2', '--cut stage2,stage3'),
    ({'model': 'resnet18'}, '--model resnet18', '--model lenet'),
])
def test_a_worker_started_for_another_run_names_the_flag_and_both_values(change, mine, theirs):
    rank0 = _Worker(0)
    dist.shared_run(rank0, RUN)
    with pytest.raises(ValueError) as e:
        dist.shared_run(_Worker(1, rank0.mine), dict(RUN, **change))
    assert str(e.value) == ('a worker (%s) trains with %s, rank 0 of the job (%s) with %s: every '
                            'worker of a job must train the same run; start them all with the '
                            'same flags' % (HERE, mine, HERE, theirs))


@pytest.mark.parametrize('change,message', [
    ({'DMLC_PS_ROOT_PORT': '99999'}, "DMLC_PS_ROOT_PORT='99999' is not a TCP port (1 to 65535), "
                                     "and MXNet would wait for the scheduler on it forever"),
    ({'DMLC_PS_ROOT_PORT': '0'}, "DMLC_PS_ROOT_PORT='0' is not a TCP port"),
    ({'DMLC_PS_ROOT_PORT': '9100 '}, "DMLC_PS_ROOT_PORT='9100 ' is not a TCP port"),
    ({'DMLC_PS_ROOT_PORT': '\u0669\u0661\u0660\u0660'}, 'DMLC_PS_ROOT_PORT=.* is not a TCP port'),
    ({'DMLC_ROLE': 'boss'}, "DMLC_ROLE='boss' is not one of worker, server, scheduler"),
    ({'DMLC_ROLE': ''}, "DMLC_ROLE='' is not one of worker, server, scheduler"),
    ({'DMLC_PS_ROOT_URI': 'a b'}, "DMLC_PS_ROOT_URI='a b' is not a host name or an IP address"),
    ({'DMLC_PS_ROOT_URI': '-oProxyCommand=x'}, "DMLC_PS_ROOT_URI='-oProxyCommand=x' is not a "
                                               "host name"),
    ({'DMLC_PS_ROOT_URI': '10.0.0.256'}, "DMLC_PS_ROOT_URI='10.0.0.256' is not an IPv4 address"),
    ({'DMLC_NODE_HOST': 'x;y'}, "DMLC_NODE_HOST='x;y' is not a host name"),
    ({'DMLC_NUM_WORKER': '0'}, "DMLC_NUM_WORKER='0' is not a whole number of 1 or more"),
    ({'DMLC_NUM_SERVER': '-1'}, "DMLC_NUM_SERVER='-1' is not a whole number of 1 or more"),
])
def test_job_env_refuses_ports_hosts_roles_and_counts_mxnet_would_wait_on(change, message):
    with pytest.raises(ValueError) as e:
        dist.job_env(dict(JOB, **change))
    assert re.match(message.replace('(', r'\(').replace(')', r'\)'), str(e.value)), str(e.value)
    assert str(e.value).endswith('; start the job with python -m gluon_mgpu.launch -n WORKERS '
                                 '-s SERVERS -- python -m gluon_mgpu.train ..., which sets them')


def test_job_env_takes_every_kind_of_host():
    for uri in ('node-1.example.com', 'node1.', 'fe80::1', '::1', '192.168.0.10', 'n_1'):
        assert dist.job_env(dict(JOB, DMLC_PS_ROOT_URI=uri))['root'] == '%s:9100' % uri
    assert dist.job_env(dict(JOB, DMLC_PS_ROOT_PORT='65535'))['root'] == '10.0.0.5:65535'


def test_host_and_port_forms():
    from gluon_mgpu.runtime.hosts import parse_host_port
    assert parse_host_port('node1', 22) == ('node1', 22)
    assert parse_host_port('node1:2222', 22) == ('node1', 2222)
    assert parse_host_port('[fe80::1]:2200', 22) == ('fe80::1', 2200)
    assert parse_host_port('[fe80::1]', 22) == ('fe80::1', 22)
    assert parse_host_port('fe80::1', 22) == ('fe80::1', 22)
    for text in ('a b', '-oProxyCommand=x', '-p', 'user@node', 'node:', 'node:0', 'node:65536',
                 '[10.0.0.1]:22', '[::1', '[::1]x', 'node:22:33', 'nöde', '-node', 'node-',
                 'a..b', '.', '', 'x' * 64):
        assert parse_host_port(text, 22) is None, text
