"""Environment values MXNet aborts or crashes on: one line naming the variable, the value and
the fix, exit code 2, from every command, before MXNet starts (gluon_mgpu/runtime/mxnet_env.py)."""
import os
import subprocess
import sys

import pytest

from gluon_mgpu.runtime import mxnet_env, threads

CORES = len(os.sched_getaffinity(0))
COMMANDS = ['train', 'env', 'compare', 'sweep', 'launch', 'replicas', 'handlers.metrics']
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
    # A command line each command takes: the flags are read first, then the environment.
    args = {'sweep': ['--num-gpus', '1'], 'launch': ['-n', '1', '--', 'true']}.get(command, [])
    run = _run(['-m', 'gluon_mgpu.%s' % command] + args, OMP_NUM_THREADS='abc')
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


def test_a_program_gets_the_same_message_as_an_exception_when_mxnet_starts():
    assert _run(['-c', 'import gluon_mgpu'], MXNET_OMP_MAX_THREADS='2,1').returncode == 0
    run = _run(['-c', 'import gluon_mgpu; import mxnet'], MXNET_OMP_MAX_THREADS='2,1')
    assert run.returncode == 1
    assert run.stderr.splitlines()[-1] == (
        "ValueError: MXNET_OMP_MAX_THREADS='2,1' is not a whole number, and MXNet aborts on it; "
        "set it to a whole number, for example MXNET_OMP_MAX_THREADS=%d, or unset it" % CORES)


def test_a_number_longer_than_int_reads_is_named_not_raised():
    # int() raised "Exceeds the limit (4300 digits)" from the check itself; MXNet reads a C int.
    for name in ('OMP_NUM_THREADS', 'MXNET_CPU_WORKER_NTHREADS'):
        message = _message(**{name: '1' * 5000})
        assert message.startswith("%s='%s' is not a whole number" % (name, '1' * 5000)), name
    mxnet_env.check_environment({'OMP_NUM_THREADS': '0' * 5000 + '2'}, 2)  # it is 2
    from gluon_mgpu.runtime import threads
    with pytest.raises(ValueError, match="^GLUON_MGPU_CPU_DEVICES='1{5000}' is not a whole "):
        threads.devices_from_environment({'GLUON_MGPU_CPU_DEVICES': '1' * 5000})


@pytest.mark.parametrize('value', ['17', '1000', '100000'])
def test_absurd_thread_counts_are_refused_with_the_limit_and_why(value, monkeypatch):
    monkeypatch.setattr(mxnet_env, 'thread_limit', lambda: (32768, 'kernel.pid_max'))
    assert _message(OMP_NUM_THREADS=value) == (
        'OMP_NUM_THREADS=%s is more threads than MXNet can use here: at most 16, 8 per usable '
        'core (more spin waiting for each other: docs/devices.md); set it to the number of cores, OMP_NUM_THREADS=2, or unset '
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


# Hostile input, round four: what MXNet's own parsers take, and every variable they read.
def _mxnet_package():
    import importlib.util
    return os.path.dirname(importlib.util.find_spec('mxnet').origin)


@pytest.mark.parametrize('value,accepted', [
    ('2\xa0', False), ('2\u2003', False), ('\u20032', False), ('2\x1c', False), ('2\v', False),
    ('\u0662', False), ('2_0', False), ('\v2', True), (' \t2\n\r\f', True), ('+2', True),
])
def test_blanks_and_digits_are_ascii_as_dmlc_reads_them(value, accepted):
    # Python's \s and int() take a no-break space, U+2003, U+001C, Arabic digits and '2_0';
    # dmlc::GetEnv (std::istringstream, then dmlc::isspace) does not, nor a trailing \v.
    for name in ('OMP_NUM_THREADS', 'MXNET_CPU_WORKER_NTHREADS', 'MXNET_CPU_TEMP_COPY'):
        if accepted:
            mxnet_env.check_environment({name: value}, 2)
        else:
            assert _message(**{name: value}) == (
                '%s=%r is not a whole number, and MXNet aborts on it; set it to a whole number, '
                'for example %s=%d, or unset it' % (name, value, name,
                                                    2 if name.endswith('THREADS') else 1))


def test_a_unicode_blank_is_named_with_its_variable_by_the_command():
    run = _run(['-m', 'gluon_mgpu.env'], MXNET_CPU_WORKER_NTHREADS='2\x1c')
    assert (run.returncode, run.stdout) == (2, '')
    assert run.stderr == (
        "python -m gluon_mgpu.env: error: MXNET_CPU_WORKER_NTHREADS='2\\x1c' is not a whole "
        "number, and MXNet aborts on it; set it to a whole number, for example "
        "MXNET_CPU_WORKER_NTHREADS=%d, or unset it\n" % CORES)


def test_doubles_flags_and_zeros_are_read_as_mxnet_reads_them():
    # dmlc::stod: blanks before (not \v), none after, nothing beyond a double's normal range.
    mxnet_env.check_environment({'MXNET_TUNING_WEIGHT_SCALE': ' \t1.5'}, 2)
    for value in ('1 ', '\v1', '1\xa0', '1e-310', '2e308'):
        assert _message(MXNET_TUNING_WEIGHT_SCALE=value).startswith(
            'MXNET_TUNING_WEIGHT_SCALE=%r is %s, and MXNet aborts on it'
            % (value, 'out of the range of a double' if 'e' in value else 'not a number'))
    for value in (' 1', '1 ', '1\n', 'tru\u0435'):  # a blank, a Cyrillic e
        assert _message(MXNET_SAFE_ACCUMULATION=value) == (
            "MXNET_SAFE_ACCUMULATION=%r is not a flag, and MXNet aborts on it; set it to 1 or 0, "
            "or unset it" % value)
    assert _message(MXNET_KVSTORE_BIGARRAY_BOUND='0') == (
        "MXNET_KVSTORE_BIGARRAY_BOUND='0' ends MXNet with SIGFPE (it divides by it); set it to 1 "
        "or more, or unset it")
    mxnet_env.check_environment({'MXNET_KVSTORE_BIGARRAY_BOUND': '-1'}, 2)
    assert _message(MXNET_USE_NUM_CORES_OPERATOR_TUNING='-1').startswith(
        "MXNET_USE_NUM_CORES_OPERATOR_TUNING='-1' is below 0, and MXNet fails on it")
    assert _message(MXNET_KVSTORE_REDUCTION_NTHREADS='100000').startswith(
        'MXNET_KVSTORE_REDUCTION_NTHREADS=100000 is more threads than MXNet can use here')


def test_what_mxnets_python_code_reads_with_int_is_read_with_int():
    # An empty value is not unset there: os.getenv gives '' and int('') fails.
    for name in ('MXNET_UPDATE_ON_KVSTORE', 'MXNET_OPTIMIZER_AGGREGATION_SIZE',
                 'MXNET_ENABLE_CYTHON'):
        for value in ('', 'abc', '1.5'):
            assert _message(**{name: value}) == (
                "%s=%r is not a whole number, and MXNet's Python code fails on it (int()); set "
                "it to a whole number, for example %s=1, or unset it" % (name, value, name))
        mxnet_env.check_environment({name: ' 1\v'}, 2)  # int() takes what it takes
    assert _message(MXNET_UPDATE_AGGREGATION_SIZE='0').startswith(
        "MXNET_UPDATE_AGGREGATION_SIZE='0' is below 1")  # its loop would never end


def test_every_variable_libmxnet_names_has_its_type_here():
    import re
    data = open(os.path.join(_mxnet_package(), 'libmxnet.so'), 'rb').read()
    named = {m.decode() for m in re.findall(rb'MXNET_[A-Z0-9_]*[A-Z0-9]', data)}
    typed = (set(mxnet_env.THREAD_COUNTS) | set(mxnet_env.WHOLE_NUMBERS) |
             set(mxnet_env.FLAGS) | set(mxnet_env.NUMBERS) | set(mxnet_env.NOT_NUMBERS))
    assert named - typed == set()
    assert len(named) > 70


def test_every_int_of_mxnets_python_code_is_checked():
    import re
    found = set()
    for folder, _, names in os.walk(_mxnet_package()):
        for name in names:
            if name.endswith('.py'):
                text = open(os.path.join(folder, name), encoding='utf-8').read()
                found |= set(re.findall(r'int\(\s*_?os\.(?:getenv|environ\.get)\(\s*[\'"]'
                                        r'(MXNET_[A-Z0-9_]+)', text))
    assert found == set(mxnet_env.PYTHON_WHOLE_NUMBERS)


@pytest.mark.slow
@pytest.mark.parametrize('name,value', [
    ('OMP_NUM_THREADS', '2\xa0'), ('OMP_NUM_THREADS', '2\v'), ('OMP_NUM_THREADS', '\v2'),
    ('MXNET_CPU_WORKER_NTHREADS', '2\x1c'), ('MXNET_CPU_WORKER_NTHREADS', ' 2\t'),
    ('MXNET_MKLDNN_ENABLED', ' 1'), ('MXNET_TUNING_WEIGHT_SCALE', ' 1'),
    ('MXNET_TUNING_WEIGHT_SCALE', '1 '), ('MXNET_ENABLE_CYTHON', ''),
])
def test_mxnet_itself_fails_on_exactly_what_the_check_refuses(name, value):
    run = _run(['-c', 'import mxnet as mx; mx.nd.Convolution(mx.nd.ones((1, 1, 3, 3)), '
                      'mx.nd.ones((1, 1, 3, 3)), kernel=(3, 3), num_filter=1, '
                      'no_bias=True).wait_to_read()'], **{name: value})
    try:
        mxnet_env.check_environment({name: value}, CORES)
        refused = False
    except ValueError:
        refused = True
    assert (run.returncode != 0) == refused, run.stderr[-500:]
    if refused and name != 'MXNET_ENABLE_CYTHON':
        assert run.returncode == -6  # SIGABRT


@pytest.mark.parametrize('value,what', [('/nonexistent/libmxnet.so', 'an existing file'),
                                        ('libmxnet.so', 'an absolute path')])
def test_45_9_a_library_path_mxnet_would_ignore_is_refused_so_no_root_logger_is_made(value,
                                                                                    what):
    # MXNet logs "MXNET_LIBRARY_PATH ... doesn't exist" through the root logger, which made
    # every later warning read "WARNING:gluon_mgpu:warning: ...", and loads another library.
    with pytest.raises(ValueError) as e:
        mxnet_env.check_environment({'MXNET_LIBRARY_PATH': value}, 2)
    assert str(e.value) == ('MXNET_LIBRARY_PATH=%r is not %s, so MXNet would load its own '
                            'library instead of it; point it at a libmxnet.so by its absolute '
                            'path, or unset it' % (value, what))
    done = subprocess.run([sys.executable, '-m', 'gluon_mgpu.replicas'], capture_output=True,
                          text=True, timeout=300, env=dict(os.environ, MXNET_LIBRARY_PATH=value))
    assert (done.returncode, done.stdout) == (2, '')
    assert done.stderr == 'python -m gluon_mgpu.replicas: error: %s\n' % e.value
