"""Environment values MXNet aborts or crashes on: one line naming the variable, the value and
the fix, exit code 2, from every command, before MXNet starts (gluon_mgpu/runtime/mxnet_env.py)."""
import os
import subprocess
import sys

import pytest

from gluon_mgpu.runtime import mxnet_env, threads

CORES = len(os.sched_getaffinity(0))
COMMANDS = ['train', 'env', 'compare', 'sweep', 'launch', 'replicas', 'metrics']
_OURS = ('OMP_NUM_THREADS', 'MXNET_', threads.DEVICES_ENV, threads.CHOSEN_ENV)


def _env(**values):
    env = {k: v for k, v in os.environ.items() if not k.startswith(_OURS)}
    env.update(values)
    return env


def _run(args, **values):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True,
                          env=_env(**values), timeout=300)


def _message(**environ):
    with pytest.raises(ValueError) as e:
        mxnet_env.check_environment(environ, 2)
    return str(e.value)


def test_the_premise_mxnet_alone_aborts_on_a_thread_count_it_cannot_parse():
    run = _run(['-c', 'import mxnet'], OMP_NUM_THREADS='abc')
    assert run.returncode == -6  # SIGABRT: no Python line, no chance to say anything
    assert "Invalid Parameter format for OMP_NUM_THREADS expect int but value='abc'" in run.stderr


@pytest.mark.parametrize('command', COMMANDS)
def test_every_command_refuses_a_value_mxnet_aborts_on_in_one_line(command):
    run = _run(['-m', 'gluon_mgpu.%s' % command], OMP_NUM_THREADS='abc')
    assert (run.returncode, run.stdout) == (2, '')
    assert run.stderr == (
        "python -m gluon_mgpu.%s: error: OMP_NUM_THREADS='abc' is not a whole number, and MXNet "
        "aborts on it; set it to a whole number, for example OMP_NUM_THREADS=%d, or unset it\n"
        % (command, CORES))


@pytest.mark.parametrize('name,value,line', [
    ('MXNET_CPU_WORKER_NTHREADS', '0', "MXNET_CPU_WORKER_NTHREADS='0' is below 1, and MXNet fails "
     "on it; set it to 1 or more, for example MXNET_CPU_WORKER_NTHREADS=%d, or unset it" % CORES),
    ('MXNET_CPU_TEMP_COPY', 'many', "MXNET_CPU_TEMP_COPY='many' is not a whole number, and MXNet "
     "aborts on it; set it to a whole number, for example MXNET_CPU_TEMP_COPY=1, or unset it"),
    ('MXNET_ENGINE_TYPE', 'Naive', "MXNET_ENGINE_TYPE='Naive' is not an engine of MXNet 1.9.1, "
     "and MXNet fails on it; set it to one of ThreadedEnginePerDevice, ThreadedEngine, "
     "ThreadedEnginePooled, NaiveEngine (names as written), or unset it for the default, "
     "ThreadedEnginePerDevice"),
])
def test_the_train_command_names_each_kind_of_bad_value(name, value, line):
    run = _run(['-m', 'gluon_mgpu.train', '--epochs', '1'], **{name: value})
    assert (run.returncode, run.stdout) == (2, '')
    assert run.stderr == 'python -m gluon_mgpu.train: error: %s\n' % line


def test_a_program_gets_the_same_message_as_an_exception_at_import():
    run = _run(['-c', 'import gluon_mgpu'], MXNET_OMP_MAX_THREADS='2,1')
    assert run.returncode == 1
    assert run.stderr.splitlines()[-1] == (
        "ValueError: MXNET_OMP_MAX_THREADS='2,1' is not a whole number, and MXNet aborts on it; "
        "set it to a whole number, for example MXNET_OMP_MAX_THREADS=%d, or unset it" % CORES)


@pytest.mark.parametrize('value', ['17', '1000', '100000'])
def test_absurd_thread_counts_are_refused_with_the_limit_and_why(value, monkeypatch):
    monkeypatch.setattr(mxnet_env, 'thread_limit', lambda: (32768, 'kernel.pid_max'))
    assert _message(OMP_NUM_THREADS=value) == (
        'OMP_NUM_THREADS=%s is more threads than MXNet can use here: at most 16, 8 per usable '
        'core (more spin waiting for each other: on 2 cores a step took 3.5x as long with 32, '
        'and never ended with 1000); set it to the number of cores, OMP_NUM_THREADS=2, or unset '
        'it' % value)
    mxnet_env.check_environment({'OMP_NUM_THREADS': '16'}, 2)  # 8 per core: still allowed
    # A tight limit on threads (ulimit -u, a container's pids.max) gives the bound instead.
    monkeypatch.setattr(mxnet_env, 'thread_limit', lambda: (20, 'ulimit -u'))
    assert _message(MXNET_CPU_WORKER_NTHREADS='11') == (
        'MXNET_CPU_WORKER_NTHREADS=11 is more threads than MXNet can use here: at most 10, half '
        'of the 20 threads ulimit -u allows; set it to the number of cores, '
        'MXNET_CPU_WORKER_NTHREADS=2, or unset it')


def test_what_mxnet_parses_is_accepted_and_what_it_aborts_on_is_not():
    # dmlc::GetEnv: surrounding blanks and a sign are fine for a whole number, any case of
    # true/false for a flag; an empty value is unset (all measured with MXNet 1.9.1).
    mxnet_env.check_environment({'OMP_NUM_THREADS': ' 2 ', 'MXNET_CPU_WORKER_NTHREADS': '+1',
                                 'MXNET_MKLDNN_ENABLED': 'TRUE', 'MXNET_ENGINE_INFO': '0',
                                 'MXNET_TUNING_WEIGHT_SCALE': '1.5e-3', 'MXNET_CPU_TEMP_COPY': '',
                                 'MXNET_ENGINE_TYPE': 'NaiveEngine', 'MXNET_PROFILER_MODE': '-1'},
                                2)
    assert _message(MXNET_MKLDNN_ENABLED='yes') == (
        "MXNET_MKLDNN_ENABLED='yes' is not a flag, and MXNet aborts on it; set it to 1 or 0, or "
        "unset it")
    assert _message(MXNET_TUNING_WEIGHT_SCALE='x') == (
        "MXNET_TUNING_WEIGHT_SCALE='x' is not a number, and MXNet aborts on it; set it to a "
        "number, for example MXNET_TUNING_WEIGHT_SCALE=1, or unset it")
    assert _message(MXNET_CPU_TEMP_COPY='0').startswith(
        "MXNET_CPU_TEMP_COPY='0' is below 1, and MXNet fails on it")  # SIGFPE, measured
    assert _message(OMP_NUM_THREADS='99999999999').startswith(
        "OMP_NUM_THREADS='99999999999' is not a whole number")  # beyond a C int


def test_an_empty_thread_count_is_unset_for_mxnet_so_the_package_chooses():
    env = {'OMP_NUM_THREADS': ''}
    settings = threads.configure_threads(env, mxnet_imported=False)
    assert (settings['source'], env['OMP_NUM_THREADS']) == ('gluon_mgpu', str(CORES))
