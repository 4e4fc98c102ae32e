import os
import subprocess
import sys

from gluon_mgpu import threads


def test_sets_one_thread_per_usable_core_when_nobody_chose():
    env = {}
    settings = threads.configure_threads(env, mxnet_imported=False)
    cores = len(os.sched_getaffinity(0))
    assert env == {'OMP_NUM_THREADS': str(cores)}
    assert settings == {'omp_num_threads': cores, 'cores': cores, 'source': 'gluon_mgpu'}
    assert threads.format_thread_settings(settings) == (
        'threads: OMP_NUM_THREADS=%d, one per usable core (set by gluon_mgpu)' % cores)


def test_respects_what_the_user_set():
    for env in ({'OMP_NUM_THREADS': '1'}, {'MXNET_OMP_MAX_THREADS': '1'}):
        before = dict(env)
        settings = threads.configure_threads(env, mxnet_imported=False)
        assert env == before
        assert settings['source'] == 'user' and settings['omp_num_threads'] == 1


def test_says_when_mxnet_was_imported_first():
    env = {}
    settings = threads.configure_threads(env, mxnet_imported=True)
    assert env == {}
    assert settings == {'omp_num_threads': None, 'cores': len(os.sched_getaffinity(0)),
                        'source': 'mxnet-imported-first'}
    assert 'import gluon_mgpu first or set OMP_NUM_THREADS=' in \
        threads.format_thread_settings(settings)


def _child(code, **env):
    full = {k: v for k, v in os.environ.items() if k not in ('OMP_NUM_THREADS',
                                                              'MXNET_OMP_MAX_THREADS')}
    full.update(env)
    return subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                          env=full, check=True).stdout.strip()


def test_importing_the_package_sets_the_variable_before_mxnet_starts():
    cores = len(os.sched_getaffinity(0))
    out = _child('import os, sys; import gluon_mgpu; '
                 'print(os.environ["OMP_NUM_THREADS"], gluon_mgpu.thread_settings()["source"])')
    assert out == '%d gluon_mgpu' % cores
    assert _child('import gluon_mgpu; print(gluon_mgpu.thread_settings()["source"])',
                  OMP_NUM_THREADS='1') == 'user'
    assert _child('import mxnet, gluon_mgpu; print(gluon_mgpu.thread_settings()["source"])') \
        == 'mxnet-imported-first'
