import os
import subprocess
import sys

import pytest

from gluon_mgpu.runtime import threads


def test_sets_one_thread_per_usable_core_when_nobody_chose():
    env = {}
    settings = threads.configure_threads(env, mxnet_imported=False)
    cores = len(os.sched_getaffinity(0))
    assert env == {'OMP_NUM_THREADS': str(cores), 'GLUON_MGPU_CHOSE': 'OMP_NUM_THREADS=%d' % cores}
    assert settings == {'omp_num_threads': cores, 'cores': cores, 'source': 'gluon_mgpu',
                        'devices': 1, 'cpu_temp_copy': None, 'temp_copy_source': 'mxnet'}
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
    cores = len(os.sched_getaffinity(0))
    in_force = threads.mxnet_default_threads(cores)
    assert settings == {'omp_num_threads': in_force, 'cores': cores,
                        'source': 'mxnet-imported-first', 'devices': 1, 'cpu_temp_copy': None,
                        'temp_copy_source': 'mxnet'}
    assert threads.format_thread_settings(settings) == (
        "threads: OMP_NUM_THREADS=%d of %d usable cores, MXNet's default (half the cores on x86), "
        "as MXNet was imported before gluon_mgpu; import gluon_mgpu first or set "
        "OMP_NUM_THREADS=%d" % (in_force, cores, cores))


def test_mxnets_own_default_is_half_the_cores_on_x86_only():
    assert [threads.mxnet_default_threads(n, 'x86_64') for n in (1, 2, 3, 8)] == [1, 1, 1, 4]
    assert threads.mxnet_default_threads(8, 'aarch64') == 8
    late = {'omp_num_threads': 4, 'cores': 8, 'source': 'mxnet-imported-first'}
    assert threads.imported_late_warning(late) == (
        'warning: MXNet was imported before gluon_mgpu, so it computes with 4 of the 8 cores (its '
        'default, fixed when it starts); import gluon_mgpu before d2lzh and mxnet (in a notebook: '
        'restart the kernel first), or set OMP_NUM_THREADS=8 before Python starts')
    assert threads.imported_late_warning(dict(late, omp_num_threads=8)) is None  # nothing lost
    assert threads.imported_late_warning(dict(late, source='user')) is None


def test_the_books_import_order_gives_one_warning_line_and_the_package_first_none():
    cores = len(os.sched_getaffinity(0))
    code = 'import %s, gluon_mgpu; print(gluon_mgpu.thread_settings()["omp_num_threads"])'
    late = _run_child(code % 'd2lzh')
    in_force = threads.mxnet_default_threads(cores)
    assert late.stdout == '%d\n' % in_force
    expected = threads.imported_late_warning({'omp_num_threads': in_force, 'cores': cores,
                                              'source': 'mxnet-imported-first'})
    assert late.stderr == ('' if expected is None else expected + '\n')
    first = _run_child('import gluon_mgpu, d2lzh; print(gluon_mgpu.thread_settings()["source"])')
    assert (first.stdout, first.stderr) == ('gluon_mgpu\n', '')


def _run_child(code, check=True, **env):
    full = {k: v for k, v in os.environ.items()
            if k not in ('OMP_NUM_THREADS', 'MXNET_OMP_MAX_THREADS', 'MXNET_CPU_TEMP_COPY',
                         threads.DEVICES_ENV, threads.CHOSEN_ENV)}
    full.update(env)
    return subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                          env=full, check=check, timeout=120)


def _child(code, **env):
    return _run_child(code, **env).stdout.strip()


def test_importing_the_package_sets_the_variable_before_mxnet_starts():
    cores = len(os.sched_getaffinity(0))
    out = _child('import os, sys; import gluon_mgpu; '
                 'print(os.environ["OMP_NUM_THREADS"], gluon_mgpu.thread_settings()["source"])')
    assert out == '%d gluon_mgpu' % cores
    assert _child('import gluon_mgpu; print(gluon_mgpu.thread_settings()["source"])',
                  OMP_NUM_THREADS='1') == 'user'
    assert _child('import mxnet, gluon_mgpu; print(gluon_mgpu.thread_settings()["source"])') \
        == 'mxnet-imported-first'


def test_simulated_devices_get_a_share_of_the_cores_and_mxnets_scratch_pool():
    env = {}
    settings = threads.configure_threads(env, mxnet_imported=False, devices=2)
    cores = len(os.sched_getaffinity(0))
    per_device = max(1, cores // 2)
    # The pool is not enlarged: every device issues from its own thread (gluon_mgpu.runtime.dispatch)
    # and so has MXNet's 4 buffers of its own.
    assert env == {'OMP_NUM_THREADS': str(per_device),
                   'GLUON_MGPU_CHOSE': 'OMP_NUM_THREADS=%d' % per_device}
    assert settings == {'omp_num_threads': per_device, 'cores': cores, 'source': 'gluon_mgpu',
                        'devices': 2, 'cpu_temp_copy': None, 'temp_copy_source': 'mxnet'}
    assert threads.format_thread_settings(settings) == (
        'threads: OMP_NUM_THREADS=%d per simulated device, 2 devices on %d usable cores (set by '
        'gluon_mgpu)' % (per_device, cores))
    # More devices than cores: one thread each, never 0.
    env = {}
    assert threads.configure_threads(env, mxnet_imported=False, devices=8 * cores)[
        'omp_num_threads'] == 1
    # A pool a parent process's gluon_mgpu chose (an earlier version did) is not kept.
    env = {'MXNET_CPU_TEMP_COPY': '256', 'GLUON_MGPU_CHOSE': 'MXNET_CPU_TEMP_COPY=256'}
    assert threads.configure_threads(env, mxnet_imported=False, devices=2)[
        'temp_copy_source'] == 'mxnet' and 'MXNET_CPU_TEMP_COPY' not in env


def test_a_child_chooses_again_what_its_parents_package_chose_but_keeps_the_users():
    parent = {}
    threads.configure_threads(parent, mxnet_imported=False)   # a notebook: 1 device
    child = dict(parent)
    settings = threads.configure_threads(child, mxnet_imported=False, devices=2)
    assert (settings['source'], settings['omp_num_threads']) == (
        'gluon_mgpu', max(1, len(os.sched_getaffinity(0)) // 2))
    child = dict(parent, OMP_NUM_THREADS='5')                # changed by the user since
    assert threads.configure_threads(child, mxnet_imported=False, devices=2)['source'] == 'user'


def test_simulated_devices_respect_each_variable_the_user_set():
    env = {'OMP_NUM_THREADS': '3'}
    settings = threads.configure_threads(env, mxnet_imported=False, devices=2)
    assert env == {'OMP_NUM_THREADS': '3'}
    assert (settings['source'], settings['temp_copy_source']) == ('user', 'mxnet')
    env = {'MXNET_CPU_TEMP_COPY': '8'}
    settings = threads.configure_threads(env, mxnet_imported=False, devices=2)
    assert env['MXNET_CPU_TEMP_COPY'] == '8' and 'MXNET_CPU_TEMP_COPY' not in env[
        'GLUON_MGPU_CHOSE']
    assert settings['cpu_temp_copy'] == 8 and settings['temp_copy_source'] == 'user'
    assert threads.format_thread_settings(settings).endswith(
        '; scratch buffers: MXNET_CPU_TEMP_COPY=8 (set by you)')
    # Too late once MXNet runs: nothing is changed, and the pool is MXNet's.
    env = {}
    settings = threads.configure_threads(env, mxnet_imported=True, devices=2)
    assert env == {} and settings['temp_copy_source'] == 'mxnet'


# python -m gluon_mgpu.train, in a process where os.execve fails: the command starts once.
TRAIN_WITHOUT_EXECVE = (
    'import os, runpy, sys\n'
    'def execve(*args):\n'
    '    raise SystemExit("os.execve was called")\n'
    'os.execve = execve\n'
    'runpy.run_module("gluon_mgpu.train", run_name="__main__", alter_sys=True)\n')


def _train_threads(tmp_path, *argv, **env):
    """The thread settings a train command ran with, from its --metrics-json."""
    import json
    out = tmp_path / ('m%d.json' % len(os.listdir(tmp_path)))
    done = subprocess.run([sys.executable, '-c', TRAIN_WITHOUT_EXECVE, '--model', 'lenet',
                           '--train-limit', '16', '--test-limit', '8', '--batch-size', '8',
                           '--epochs', '1', '--quiet', '--device', 'cpu', '--metrics-json',
                           str(out)] + list(argv),
                          capture_output=True, text=True, timeout=300,
                          env=dict({k: v for k, v in os.environ.items() if k not in (
                              'OMP_NUM_THREADS', 'GLUON_MGPU_CHOSE', threads.DEVICES_ENV)}, **env))
    assert done.returncode == 0, done.stderr
    with open(out) as f:
        found = json.load(f)['threads']
    return found['devices'], found['omp_num_threads'], found['source']


def test_the_train_command_reads_its_flags_before_mxnet_starts_and_chooses_the_threads(
        tmp_path):
    cores = len(os.sched_getaffinity(0))
    assert _train_threads(tmp_path) == (1, cores, 'gluon_mgpu')
    assert _train_threads(tmp_path, '--num-gpus', '2') == (2, max(1, cores // 2), 'gluon_mgpu')
    assert _train_threads(tmp_path, '--num-gpus', '2', OMP_NUM_THREADS='2')[1:] == (2, 'user')
    assert _train_threads(tmp_path, GLUON_MGPU_CPU_DEVICES='2') == (2, max(1, cores // 2),
                                                                     'gluon_mgpu')
    # A run resumed without --num-gpus reads its devices from its checkpoint before MXNet
    # starts, and computes with their threads as it did before the stop.
    folder = str(tmp_path / 'ck')
    assert _train_threads(tmp_path, '--num-gpus', '2', '--checkpoint-dir', folder)[0] == 2
    assert _train_threads(tmp_path, '--checkpoint-dir', folder, '--resume', '--epochs',
                          '2') == (2, max(1, cores // 2), 'gluon_mgpu')


def test_a_resume_reads_the_runs_devices_from_its_checkpoint_without_mxnet(tmp_path):
    import json
    from gluon_mgpu.commands import train
    folder = tmp_path / 'ck'
    folder.mkdir()

    class Started(Exception):
        pass

    def start(flags):
        raise Started(flags.num_gpus, flags.device)

    def run_flags(record, *given):
        (folder / 'epoch-0002.json').write_text(json.dumps(record))
        with pytest.raises(Started) as started:
            train.resolve(['--resume', '--checkpoint-dir', str(folder)] + list(given), start)
        return started.value.args

    (folder / 'epoch-0001.json').write_text('{"argv": ["--num-gpus=3"]}')  # not the latest
    assert run_flags({'argv': ['--num-gpus=2', '--device=cpu', '--seed=5']}) == (2, 'cpu')
    assert run_flags({'argv': ['--num-gpus=2']}, '--num-gpus', '4') == (4, 'auto')  # given wins
    # What cannot be read falls through to the flags given: the checks after MXNet say why.
    for record in ({'argv': ['--num-gpus=2', '--help']}, {'argv': ['--num-gpus=0']},
                   {'argv': ['--num-g=2']}, {'argv': '--num-gpus=2'}, ['--num-gpus=2'], {}):
        assert run_flags(record) == (1, 'auto'), record
    (folder / 'epoch-0002.json').write_text('{"argv": ["--num-gpus=2"]')
    with pytest.raises(Started) as started:
        train.resolve(['--resume', '--checkpoint-dir', str(folder)], start)
    assert started.value.args == (1, 'auto')
    (folder / 'epoch-0002.json').write_text('{"argv": ["--num-gpus=2"]}')
    out = _child('import sys\n'
                 'from gluon_mgpu.commands import train\n'
                 'def start(flags):\n'
                 '    print(flags.num_gpus, "mxnet" in sys.modules)\n'
                 '    sys.exit()\n'
                 'train.resolve(["--resume", "--checkpoint-dir", %r], start)' % str(folder))
    assert out == '2 False'


@pytest.mark.parametrize('command, flag', [
    ('train', '--num-gpus 0'), ('sweep', '--num-gpus 0'), ('compare', '--device tpu'),
    ('replicas', '--num-gpus x'), ('env', '--verbose'), ('launch', '-n 0 -- true')])
def test_every_command_refuses_a_bad_flag_before_mxnet_starts(command, flag):
    """The entry file as ``python -m`` runs it: a bad flag is one line and exit 2, and MXNet
    (seconds to load) never started."""
    module = 'gluon_mgpu.%s' % ('replicas.__main__' if command == 'replicas' else command)
    done = _run_child(
        'import runpy, sys\n'
        'sys.argv = ["x"] + %r\n'
        'try:\n'
        '    runpy.run_module(%r, run_name="__main__", alter_sys=True)\n'
        'except SystemExit as e:\n'
        '    print(e.code, "mxnet" in sys.modules)\n' % (flag.split(), module), check=False)
    assert done.stdout == '2 False\n', done
    [line] = done.stderr.splitlines()
    assert line.startswith('python -m gluon_mgpu.%s: error: ' % command), line
    assert flag.split()[0] in line and line.endswith('(see --help)'), line


def test_importing_the_package_starts_no_mxnet_and_changes_no_signal_handler():
    out = _child('import signal, sys\n'
                 'names = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGPIPE")\n'
                 'before = [signal.getsignal(getattr(signal, n)) for n in names]\n'
                 'import gluon_mgpu\n'
                 'after = [signal.getsignal(getattr(signal, n)) for n in names]\n'
                 'print(before == after, "mxnet" in sys.modules, callable(gluon_mgpu.train),\n'
                 '      "mxnet" in sys.modules)')
    assert out == 'True False True True'


def test_the_environment_variable_chooses_for_programs_and_a_bad_one_is_refused():
    assert threads.configure_threads({threads.DEVICES_ENV: '2'}, mxnet_imported=False)[
        'devices'] == 2
    # Odd values the user set are reported as they are, never a crash.
    assert threads.configure_threads({'OMP_NUM_THREADS': '\u00b2', 'MXNET_CPU_TEMP_COPY': 'x'},
                                     mxnet_imported=False, devices=2)['omp_num_threads'] == '\u00b2'
    for bad in ('two', '\u00b2', '0', '-1'):
        with pytest.raises(ValueError, match='GLUON_MGPU_CPU_DEVICES=%r is not a whole number'
                           % bad):
            threads.configure_threads({threads.DEVICES_ENV: bad}, mxnet_imported=False)
    with pytest.raises(ValueError) as e:
        threads.configure_threads({threads.DEVICES_ENV: 'two'}, mxnet_imported=False)
    assert str(e.value) == ("GLUON_MGPU_CPU_DEVICES='two' is not a whole number >= 1; set it to "
                            "the number of simulated CPU devices (for example "
                            "GLUON_MGPU_CPU_DEVICES=2) or unset it")
    cores = len(os.sched_getaffinity(0))
    out = _child('import os, gluon_mgpu; print(os.environ["OMP_NUM_THREADS"], '
                 'os.environ.get("MXNET_CPU_TEMP_COPY"))', GLUON_MGPU_CPU_DEVICES='2')
    assert out == '%d None' % max(1, cores // 2)
    bad = subprocess.run([sys.executable, '-m', 'gluon_mgpu.train', '--num-gpus', '2'],
                         capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, GLUON_MGPU_CPU_DEVICES='0'))
    assert (bad.returncode, bad.stdout) == (2, '')
    assert bad.stderr == ("python -m gluon_mgpu.train: error: GLUON_MGPU_CPU_DEVICES='0' is not "
                          "a whole number >= 1; set it to the number of simulated CPU devices "
                          "(for example GLUON_MGPU_CPU_DEVICES=2) or unset it\n")


DOT_ON_TWO_DEVICES = (
    'import os, gluon_mgpu, mxnet as mx; from mxnet import nd\n'
    'for i in range(50):\n'
    '    outs = [nd.dot(a, a) for a in (nd.ones((512, 512), ctx=mx.cpu(d)) for d in (0, 1))]\n'
    '    nd.waitall()\n'
    'print(outs[0][0, 0].asscalar(), outs[1][0, 0].asscalar(), os.environ["OMP_NUM_THREADS"])')


def test_nd_dot_on_two_simulated_devices_at_once_finishes_with_the_packages_choice():
    # OpenBLAS 0.3.13 (MXNet 1.9.1's) hangs when two engine workers with OpenMP teams of 2 or
    # more call it at once; with at least as many simulated devices as cores the package gives
    # each one thread, which never enters that path (on this 2-core machine: 2 devices).
    devices = max(2, len(os.sched_getaffinity(0)))
    out = _child(DOT_ON_TWO_DEVICES, GLUON_MGPU_CPU_DEVICES=str(devices))
    assert out == '512.0 512.0 1'


def test_the_processes_of_a_horovod_job_share_the_cores():
    # horovodrun starts HOROVOD_LOCAL_SIZE processes on this machine: each takes its share.
    from gluon_mgpu.runtime import threads
    cores = threads.usable_cores()
    alone = threads.configure_threads({}, mxnet_imported=False, devices=1)
    shared = threads.configure_threads({'HOROVOD_LOCAL_SIZE': '2'}, mxnet_imported=False,
                                       devices=1)
    bad = threads.configure_threads({'HOROVOD_LOCAL_SIZE': 'x'}, mxnet_imported=False,
                                    devices=1)
    assert alone['omp_num_threads'] == bad['omp_num_threads'] == cores
    assert shared['omp_num_threads'] == max(1, cores // 2)


def test_is_digits_accepts_only_what_int_reads_as_a_plain_number():
    assert [threads.is_digits(t) for t in ('0', '12', '007')] == [True] * 3
    # '\u00b2' and '\u0663' are digits to str.isdigit(); int() refuses the first.
    for text in ('', ' 1', '1 ', '-1', '+1', '1.0', '1_0', '\u00b2', '\u0663', '12\n'):
        assert not threads.is_digits(text), repr(text)
    # int() reads 4300 digits at most (sys.get_int_max_str_digits()).
    assert threads.is_digits('1' * 4300) and not threads.is_digits('1' * 4301)
    int('1' * 4300)
    with pytest.raises(ValueError, match='Exceeds the limit'):
        int('1' * 4301)
