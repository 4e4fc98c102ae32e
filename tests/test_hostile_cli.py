"""Hostile but fair input to the command line, family by family (see also test_hostile_library).

Every case checks the exit code, that stderr is one line (no traceback) naming what was wrong,
and the state of every file involved afterwards.
"""
import hashlib
import json
import os
import pickle
import re
import resource
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time

import mxnet as mx
import pytest

from gluon_mgpu.assembly import runs
from gluon_mgpu.handlers import checkpoint
from gluon_mgpu.commands.train import build_parser, main
from gluon_mgpu.runtime import files

PROG = 'python -m gluon_mgpu.train'
TINY = ['--num-gpus', '2', '--device', 'cpu', '--model', 'lenet', '--batch-size', '8',
        '--train-limit', '16', '--test-limit', '8', '--seed', '0']


def _one_line(err):
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert 'Traceback' not in err
    return lines[0]


def _refused(argv, capsys, code=2):
    assert main(argv) == code
    out, err = capsys.readouterr()
    return _one_line(err)


def _cli(*args, **kwargs):
    return subprocess.Popen([sys.executable, '-m', 'gluon_mgpu.train', *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


def _snapshot(directory):
    return {n: hashlib.sha256(open(os.path.join(directory, n), 'rb').read()).hexdigest()
            for n in sorted(os.listdir(directory)) if not n.startswith('.')}


# A. A failed run never exits 0.

@pytest.mark.parametrize('lr', ['1e39', '1e-320', '3.5e38'])
def test_a_learning_rate_float32_cannot_hold_is_bad_input(lr, capsys, data_dir):
    line = _refused(TINY + ['--data-dir', data_dir, '--lr', lr], capsys)
    assert line == ("%s: error: argument --lr: --lr %s is outside what MXNet's float32 optimizer "
                    "can use (1.1754944e-38 to 3.4028235e+38); for example --lr 0.1 (see --help)"
                    % (PROG, lr))


def test_an_optimizer_failure_stops_the_run_and_keeps_the_finished_epoch(tmp_path, capsys,
                                                                        monkeypatch, data_dir):
    directory = str(tmp_path / 'ck')
    step, update, steps = mx.gluon.Trainer.step, mx.optimizer.SGD.update_multi_precision, [0]

    def counting(self, *args, **kwargs):
        steps[0] += 1
        return step(self, *args, **kwargs)

    def failing(self, *args, **kwargs):
        if steps[0] >= 3:  # epoch 2, step 1 (2 steps per epoch)
            raise RuntimeError('simulated optimizer failure')
        return update(self, *args, **kwargs)

    monkeypatch.setattr(mx.gluon.Trainer, 'step', counting)
    monkeypatch.setattr(mx.optimizer.SGD, 'update_multi_precision', failing)
    metrics = str(tmp_path / 'run.json')
    line = _refused(TINY + ['--data-dir', data_dir, '--epochs', '3', '--checkpoint-dir',
                            directory, '--metrics-json', metrics], capsys, code=1)
    assert re.fullmatch(
        r"%s: error: the optimizer failed inside trainer.step: RuntimeError: "
        r"simulated optimizer failure; the step was not completed, so training stops "
        r"\(--lr 0\.2\); the checkpoint of epoch 1 in %s is complete; to resume: %s "
        r"--checkpoint-dir %s --resume" % (PROG, re.escape(directory), PROG,
                                            re.escape(directory)), line), line
    assert checkpoint.list_checkpoints(directory) == [1]
    assert json.load(open(metrics))['status'] == 'running'


def test_labels_outside_0_to_9_are_bad_input_naming_the_file(tmp_path, capsys, data_dir):
    import gzip
    for name in os.listdir(data_dir):
        os.symlink(os.path.join(data_dir, name), tmp_path / name)
    labels = tmp_path / 'train-labels-idx1-ubyte.gz'
    with gzip.open(os.path.join(data_dir, labels.name)) as f:
        raw = bytearray(f.read())
    raw[8 + 3] = 12
    os.remove(labels)
    with gzip.open(labels, 'wb') as f:
        f.write(bytes(raw))
    line = _refused(['--data-dir', str(tmp_path), '--device', 'cpu'], capsys)
    assert line.startswith('%s: error: --data-dir %s: %s' % (PROG, tmp_path, labels)), line
    assert '12' in line


# B. Never write over what is not ours.

def test_a_device_file_is_never_replaced(capsys, data_dir):
    line = _refused(TINY + ['--data-dir', data_dir, '--metrics-json', '/dev/null'], capsys)
    assert line == ('%s: error: argument --metrics-json: --metrics-json /dev/null: it is a '
                    'character device, not a regular file, and is left as it is; name a regular '
                    'file or a new path (see --help)' % PROG)
    assert stat.S_ISCHR(os.stat('/dev/null').st_mode)


def test_a_fifo_is_never_replaced(tmp_path, capsys, data_dir):
    fifo = str(tmp_path / 'pipe.png')
    os.mkfifo(fifo)
    line = _refused(TINY + ['--data-dir', data_dir, '--plot', fifo], capsys)
    assert 'it is a FIFO (named pipe), not a regular file' in line
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and os.listdir(tmp_path) == ['pipe.png']


def test_the_png_beside_an_svg_plot_is_checked_before_training(tmp_path, capsys, data_dir):
    (tmp_path / 'c.png').mkdir()
    line = _refused(TINY + ['--data-dir', data_dir, '--plot', str(tmp_path / 'c.svg')], capsys)
    assert line == ('%s: error: --plot %s also writes %s: it is a folder; name a file in it'
                    % (PROG, tmp_path / 'c.svg', tmp_path / 'c.png'))
    assert os.listdir(tmp_path) == ['c.png']


@pytest.mark.parametrize('flags,first,second', [
    (['--metrics-json', 'x', '--plot', 'x.png'], None, None),
    (['--metrics-json', 'X.png', '--plot', 'X.png'], '--metrics-json X.png', '--plot X.png'),
    (['--metrics-json', 's.png', '--plot', 's.svg'], '--metrics-json s.png', '--plot s.svg'),
    (['--plot', 'c.png', '--save-params', 'c.png'], '--plot c.png', '--save-params c.png'),
    (['--metrics-json', 'F', '--save-params', 'F'], '--metrics-json F', '--save-params F'),
    (['--metrics-json', 'sub/../F', '--save-params', 'F'], '--metrics-json sub/../F',
     '--save-params F'),
])
def test_outputs_that_collide_are_refused_before_training(flags, first, second, tmp_path,
                                                          capsys, monkeypatch, data_dir):
    monkeypatch.chdir(tmp_path)
    os.mkdir('sub')
    if first is None:  # different files: no refusal from this check (the run itself works)
        assert main(TINY + ['--data-dir', data_dir, '--epochs', '1', '--quiet'] + flags) == 0
        assert sorted(os.listdir('.')) == ['sub', 'x', 'x.png']
        return
    line = _refused(TINY + ['--data-dir', data_dir] + flags, capsys)
    assert line.startswith('%s: error: %s and %s would write the same file %s/'
                           % (PROG, first, second, tmp_path)), line
    assert line.endswith('; give each output its own path')
    assert os.listdir('.') == ['sub']


@pytest.mark.parametrize('name', ['epoch-0001.json', 'epoch-0002.params', '.lock'])
def test_an_output_with_a_checkpoints_name_in_the_checkpoint_folder_is_refused(
        name, tmp_path, capsys, data_dir):
    directory = tmp_path / 'ck'
    directory.mkdir()
    line = _refused(TINY + ['--data-dir', data_dir, '--checkpoint-dir', str(directory),
                            '--metrics-json', str(directory / name)], capsys)
    assert line == ('%s: error: --metrics-json %s would write over a file of --checkpoint-dir '
                    '%s; name it otherwise or put it in another folder'
                    % (PROG, directory / name, directory))
    assert os.listdir(directory) == []


@pytest.mark.parametrize('flag,name,other', [
    ('--save-params', 'epoch-0001.params', []), ('--metrics-json', 'epoch-0001.json', []),
    ('--metrics-json', '.lock', []), ('--metrics-json', '.epoch-0002.params.a1b2c3d4.tmp', []),
    ('--save-params', '.run.json.lock', ['--metrics-json', 'run.json'])])
def test_65_1_an_output_named_as_another_runs_checkpoint_or_lock_is_refused(
        flag, name, other, tmp_path, capsys, data_dir, monkeypatch):
    # Run A's checkpoint folder (or an output's lock beside it): what A keeps, or will resume
    # from, may not be replaced by run B, whose own --checkpoint-dir is elsewhere or none.
    folder = tmp_path / 'A'
    folder.mkdir()
    (folder / 'epoch-0001.json').write_text('{"kept": 1}')
    (folder / '.lock').write_text('4242\n')
    monkeypatch.chdir(folder)
    before = {n: (folder / n).read_bytes() for n in os.listdir(folder)}
    line = _refused(TINY + ['--data-dir', data_dir, '--checkpoint-dir', str(tmp_path / 'B')] +
                    other + [flag, str(folder / name)], capsys)
    assert line == ('%s: error: %s %s: %s is a name runs keep for themselves (a checkpoint\'s '
                    'epoch-NNNN.*, a lock .lock or .NAME.lock) and another run may hold it; name '
                    'the file otherwise' % (PROG, flag, folder / name, name)), line
    assert {n: (folder / n).read_bytes() for n in os.listdir(folder)} == before
    assert not (tmp_path / 'B').exists()


def test_a_second_run_into_the_same_checkpoint_folder_is_refused(tmp_path, capsys, data_dir):
    directory = str(tmp_path / 'ck')
    with checkpoint.lock_dir(directory):  # as a run in progress holds it
        line = _refused(TINY + ['--data-dir', data_dir, '--checkpoint-dir', directory], capsys)
    assert line == ('%s: error: --checkpoint-dir %s: %s is in use by another run (pid %d); wait '
                    'for it to end, or pass another --checkpoint-dir'
                    % (PROG, directory, directory, os.getpid()))
    assert checkpoint.list_checkpoints(directory) == []
    # Once the lock is given up, the folder can be used.
    assert main(TINY + ['--data-dir', data_dir, '--checkpoint-dir', directory, '--epochs', '1',
                        '--quiet']) == 0
    assert checkpoint.list_checkpoints(directory) == [1]


def test_two_real_runs_into_one_folder_the_second_is_refused(tmp_path, data_dir):
    directory = str(tmp_path / 'ck')
    first = _cli(*TINY, '--data-dir', data_dir, '--checkpoint-dir', directory, '--epochs', '500',
                 '--train-limit', '256')
    lock = os.path.join(directory, checkpoint.LOCK_NAME)
    deadline = time.time() + 120
    while not os.path.exists(lock) and time.time() < deadline:
        time.sleep(0.05)
    second = _cli(*TINY, '--data-dir', data_dir, '--checkpoint-dir', directory, '--epochs', '3')
    out, err = second.communicate(timeout=300)
    first.send_signal(signal.SIGTERM)
    first.communicate(timeout=120)
    assert second.returncode == 2 and first.returncode == 143
    assert re.fullmatch(r'%s: error: --checkpoint-dir %s: %s is in use by another run \(pid %d\); '
                        r'wait for it to end, or pass another --checkpoint-dir'
                        % (PROG, re.escape(directory), re.escape(directory), first.pid),
                        _one_line(err))
    # The first run's epochs are all its own.
    record = checkpoint.read_checkpoint(directory)
    assert {'--epochs=500', '--train-limit=256'} <= set(record['argv'])
    assert [h['epoch'] for h in record['history']] == list(range(1, record['epoch'] + 1))
    assert os.path.exists(lock)  # the file stays; the lock went with the first run


# C. Trust only what can be trusted.

def _edit_json(directory, change):
    path = checkpoint.checkpoint_path(directory, 1, 'json')
    record = json.load(open(path))
    change(record)
    with open(path, 'w') as f:
        json.dump(record, f)
    return path


def _argv(flag):
    """A change of the record: its command line with ``flag`` at the end."""
    return lambda r: r['argv'].append(flag)


@pytest.mark.parametrize('change,says', [
    (_argv('--lr=-1'), r'records the command line .*--lr=-1, which the command refuses '
                       r'\(argument --lr: '),
    (_argv('--epochs=5.0'), r"refuses \(argument --epochs: --epochs expects a whole number, got "
                            r"'5.0'"),
    (_argv('--lr=1e39'), r'refuses \(argument --lr: --lr 1e39 is outside what MXNet'),
    (_argv('--kvstore=dist_sync'), r'refuses \(--checkpoint-dir with --kvstore dist_sync'),
    (_argv('--metrics-json=/dev/null'), r'refuses \(argument --metrics-json: --metrics-json '
                                        r'/dev/null: it is a character device'),
    (lambda r: r.update(argv=[1, 2]), r': argv is \[1, 2\], not a command line'),
    # argparse would print the help and exit 0, or read another folder: only settings pass.
    (_argv('--help'), r': argv holds "--help", which is not a setting a run records; the file '
                      r'was not written by this version'),
    (_argv('-h'), r': argv holds "-h", which is not a setting a run records'),
    (_argv('--resume'), r': argv holds "--resume", which is not a setting a run records'),
    (_argv('--checkpoint-dir=/tmp'), r': argv holds "--checkpoint-dir=/tmp", which is not'),
    (_argv('--he'), r': argv holds "--he", which is not a setting a run records'),
    (_argv('--seed'), r': argv holds "--seed", which is not a setting a run records'),
    (_argv('--quiet=1'), r': argv holds "--quiet=1", which is not a setting a run records'),
    (_argv('extra'), r': argv holds "extra", which is not a setting a run records'),
    (_argv('--frobnicate'), r': argv holds "--frobnicate", which is not a setting a run records'),
    (lambda r: r.pop('argv'), r': argv is null, not a command line'),
    (lambda r: r.update(argv=[a for a in r['argv'] if not a.startswith('--seed=')]),
     r': argv holds no --seed=N, the seed of every run; the file was not written by this'),
    (lambda r: r.update(history='oops'), r': history is not a list of 1 epoch records'),
    (lambda r: r.update(cwd='one'), r': cwd is "one", not an absolute path; the file was not'),
    # Finite, but its sum over epochs was not: the summary failed to write at the run's end.
    (lambda r: r['history'][0].update(images_per_sec=1e308),
     r'images_per_sec is 1e\+308, not number \(> 0, <= 1000000000000.0\)'),
    (lambda r: r.update(network='vgg(10)'), r': network is "vgg\(10\)", but its command line '
                                            r'trains resnet18\(10\)'),
])
def test_values_read_from_a_checkpoint_are_checked_like_flags(change, says, cli_dir, capsys):
    path = _edit_json(cli_dir, change)
    before = _snapshot(cli_dir)
    line = _refused(['--checkpoint-dir', cli_dir, '--resume', '--epochs', '2'], capsys)
    assert line.startswith('%s: error: --resume: %s' % (PROG, path)), line
    assert re.search(says, line), line
    assert _snapshot(cli_dir) == before


def test_a_forged_pickle_with_a_matching_sha256_runs_no_code(cli_dir, tmp_path, capsys):
    marker = str(tmp_path / 'ran')

    class Evil:
        def __reduce__(self):
            return (os.system, ('touch %s' % marker,))

    replicas = checkpoint.checkpoint_path(cli_dir, 1, 'replicas')
    evil = pickle.dumps(Evil())
    with open(replicas, 'wb') as f:
        f.write(evil)
    _edit_json(cli_dir, lambda r: r['files']['replicas'].update(
        bytes=len(evil), sha256=hashlib.sha256(evil).hexdigest()))
    line = _refused(['--checkpoint-dir', cli_dir, '--resume', '--epochs', '2'], capsys)
    # Nothing unpickles it: MXNet's array loader finds no arrays in it.
    assert re.fullmatch(r'%s: error: --resume: %s is not an MXNet array file \([^()]*\); start a '
                        r'new run in an empty --checkpoint-dir'
                        % (re.escape(PROG), re.escape(replicas)), line), line
    assert not os.path.exists(marker)


# D. The environment failing is not a bug in us.

def test_a_file_size_limit_while_checkpointing_is_named_and_leaves_no_half_file(tmp_path,
                                                                                data_dir):
    directory = str(tmp_path / 'ck')

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past the limit a write is EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (100000, resource.RLIM_INFINITY))

    # ResNet-18's parameters (45 MB) do not fit under 100 kB; LeNet's metrics file does.
    run = _cli('--num-gpus', '2', '--device', 'cpu', '--batch-size', '8', '--train-limit', '8',
               '--test-limit', '4', '--epochs', '1', '--data-dir', data_dir, '--checkpoint-dir',
               directory, preexec_fn=limit)
    out, err = run.communicate(timeout=600)
    assert run.returncode == 1, err
    line = _one_line(err)
    assert line == ('%s: error: cannot write %s (File too large); raise the file size limit '
                    '(ulimit -f) or write somewhere else; %s holds no checkpoint yet; run the '
                    'same command again to start over'
                    % (PROG, checkpoint.checkpoint_path(directory, 1, 'params'), directory))
    assert sorted(os.listdir(directory)) == ['.lock']  # no half file; the lock's file stays


# E. Signals and start-up.

def _default_signals():
    # What a terminal gives a command, whatever this test run inherited (nohup, `&` in a script).
    for signum in (signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(signum, signal.SIG_DFL)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # SIGQUIT's default action: no core file


def _after_first_checkpoint(directory, data_dir):
    run = _cli(*TINY, '--data-dir', data_dir, '--checkpoint-dir', directory, '--epochs', '50',
               '--train-limit', '64', preexec_fn=_default_signals)
    first = checkpoint.checkpoint_path(directory, 1, 'json')
    deadline = time.time() + 300
    while not os.path.exists(first) and time.time() < deadline:
        time.sleep(0.05)
    return run


@pytest.mark.parametrize('signum', [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_and_sighup_end_the_run_like_ctrl_c(signum, tmp_path, data_dir):
    # SIGHUP: the terminal or the ssh connection of an unattended run closed.
    directory = str(tmp_path / 'ck')
    run = _after_first_checkpoint(directory, data_dir)
    run.send_signal(signum)
    out, err = run.communicate(timeout=120)
    assert run.returncode == 128 + signum  # 143, 129
    line = _one_line(err)
    done = checkpoint.list_checkpoints(directory)
    assert line == ("%s: terminated (%s); the checkpoint of epoch %d in %s is complete; to "
                    "resume: %s --checkpoint-dir %s --resume" % (
                        PROG, signal.Signals(signum).name, done[-1], directory, PROG,
                        directory))
    assert checkpoint.read_checkpoint(directory)['epoch'] == done[-1]


def test_sigquit_quits_at_once_with_every_threads_stack_and_keeps_the_checkpoints(tmp_path,
                                                                                  data_dir):
    # Deliberately not deferred like the others: SIGQUIT (Ctrl-\) is what stops a run stuck
    # inside MXNet, and the stacks say where it was stuck (docs/checkpoints.md).
    directory = str(tmp_path / 'ck')
    run = _after_first_checkpoint(directory, data_dir)
    run.send_signal(signal.SIGQUIT)
    out, err = run.communicate(timeout=120)
    assert run.returncode == -signal.SIGQUIT  # killed by it: a shell shows 131
    assert 'most recent call first' in err and 'gluon_mgpu/training.py' in err, err
    done = checkpoint.list_checkpoints(directory)
    assert done and checkpoint.read_checkpoint(directory)['epoch'] == done[-1]


def _wait_for_mxnet(run):
    """Until ``run`` maps libmxnet.so: past the interpreter's own start (site, runpy), where a
    signal ends any Python program before its code runs, and into MXNet's loading."""
    deadline = time.time() + 120
    while time.time() < deadline and run.poll() is None:
        try:
            with open('/proc/%d/maps' % run.pid) as f:
                if 'libmxnet' in f.read():
                    return
        except OSError:
            pass
        time.sleep(0.005)
    raise AssertionError('the command never loaded MXNet: %s' % (run.communicate()[1],))


@pytest.mark.parametrize('signum', [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_signal_while_mxnet_loads_is_one_line(signum):
    run = _cli('--epochs', '1', preexec_fn=_default_signals)
    _wait_for_mxnet(run)
    run.send_signal(signum)
    out, err = run.communicate(timeout=120)
    assert run.returncode == 128 + signum
    name = 'interrupted (Ctrl-C)' if signum == signal.SIGINT else 'terminated (%s)' % (
        signal.Signals(signum).name)
    line = _one_line(err.split('\n')[-2] + '\n')
    # Still loading (the usual case), or already training on the CPU when the machine is fast.
    assert line in ('%s: %s while starting; nothing was done' % (PROG, name),
                    '%s: %s; nothing was saved (pass --checkpoint-dir DIR to keep every finished '
                    'epoch)' % (PROG, name)), err
    assert 'Traceback' not in err


def _stopped(command, signum, doing):
    what = 'interrupted (Ctrl-C)' if signum == signal.SIGINT else 'terminated (%s)' % (
        signal.Signals(signum).name)
    return 'python -m gluon_mgpu.%s: %s %s; it writes no file, so nothing was lost' % (
        command, what, doing)


def _started(command, *args):
    # -u: a line printed reaches the pipe at once.
    return subprocess.Popen([sys.executable, '-u', '-m', 'gluon_mgpu.' + command, *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_default_signals)


@pytest.mark.parametrize('signum', [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_signal_once_replicas_runs_is_one_line(signum):
    # Before issue 53, SIGTERM and SIGHUP killed it silently.
    run = _started('replicas', '--num-gpus', '2', '--device', 'cpu')
    assert run.stdout.readline() == 'running on: [cpu(0), cpu(1)]\n'  # ResNet-18 comes next
    run.send_signal(signum)
    out, err = run.communicate(timeout=120)
    assert run.returncode == 128 + signum
    assert _one_line(err) == _stopped('replicas', signum, 'before the report was complete')


def _children(pid):
    with open('/proc/%d/task/%d/children' % (pid, pid)) as f:
        return [int(child) for child in f.read().split()]


@pytest.mark.parametrize('signum, during', [
    (signal.SIGINT, 'cells'), (signal.SIGTERM, 'cells'), (signal.SIGHUP, 'cells'),
    (signal.SIGTERM, 'step')])
def test_a_signal_once_compare_runs_is_one_line_and_ends_its_child(signum, during, data_dir):
    # 'cells': the chapter's cells run in a child process, which must end too; 'step': the
    # book's Trainer updates inside MXNet's optimizer callback, where Python defers a signal.
    run = _started('compare', '--device', 'cpu', '--data-dir', data_dir)
    deadline, child = time.time() + 300, None
    while time.time() < deadline and run.poll() is None:
        children = _children(run.pid)
        if during == 'cells' and children:
            with open('/proc/%d/maps' % children[0]) as f:  # past its exec: it loads MXNet
                if 'libmxnet' in f.read():
                    child = children[0]
                    break
        if during == 'step' and child and not children:
            time.sleep(2)
            break
        child = child or (children and children[0])
        time.sleep(0.01)
    run.send_signal(signum)
    out, err = run.communicate(timeout=120)
    assert (run.returncode, out) == (128 + signum, '')
    assert _one_line(err) == _stopped('compare', signum, 'before the table was printed')
    assert child and _ended(child)


def _ended(pid, seconds=5):
    """Whether process ``pid`` ends within ``seconds``: gone, or a zombie not reaped yet."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            with open('/proc/%d/stat' % pid) as f:
                if f.read().rsplit(')', 1)[1].split()[0] == 'Z':
                    return True
        except OSError:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize('signum', [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_signal_while_env_collects_is_one_line(signum):
    # The window after MXNet's import is short: the signal comes from inside collect().
    code = ('import os, sys, time\n'
            'from gluon_mgpu.commands import env\n'
            'def collect():\n'
            '    os.kill(os.getpid(), %d)\n'
            '    time.sleep(60)\n'
            'env.collect = collect\n'
            'sys.exit(env.main([]))\n' % signum)
    run = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                         timeout=120, preexec_fn=_default_signals)
    assert (run.returncode, run.stdout) == (128 + signum, '')
    assert _one_line(run.stderr) == _stopped('env', signum, 'before the report was printed')


def test_a_signal_python_defers_inside_a_del_still_ends_env_within_a_second():
    # DeferredInterrupt cannot raise inside a __del__ (nor MXNet's optimizer callback), and env
    # has no step after which to raise it: startup.interruptible ends the command.
    code = ('import os, signal, sys, time\n'
            'from gluon_mgpu.commands import env\n'
            'class Freed:\n'
            '    def __del__(self):\n'
            '        os.kill(os.getpid(), signal.SIGTERM)\n'
            'def collect():\n'
            '    Freed()\n'
            '    time.sleep(600)\n'
            'env.collect = collect\n'
            'sys.exit(env.main([]))\n')
    run = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                         timeout=120, preexec_fn=_default_signals)
    assert (run.returncode, run.stdout) == (143, '')
    assert _one_line(run.stderr) == _stopped('env', signal.SIGTERM, 'before the report was '
                                                                    'printed')


# F. Absurd sizes.

def test_a_million_devices_are_refused_at_once_in_one_short_line(capsys, data_dir):
    start = time.time()
    line = _refused(['--num-gpus', '1000000', '--batch-size', '1000000', '--device', 'cpu',
                     '--data-dir', data_dir], capsys)
    assert time.time() - start < 60
    assert line.startswith('%s: error: --num-gpus 1000000 --device cpu: num_gpus=1000000 '
                           'simulated CPU devices are more than this machine can hold' % PROG)
    assert len(line) < 500


def test_more_replicas_than_memory_are_refused_before_any_is_made(data_dir):
    from gluon_mgpu.runtime.threads import memory_bytes
    n = memory_bytes() // runs.REPLICA_BYTES['resnet18'] + 1

    def limit_memory():  # were the check gone, the replicas would fail here, not fill the machine
        resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))
    run = subprocess.run([sys.executable, '-m', 'gluon_mgpu.train', '--num-gpus', str(n),
                          '--batch-size', str(n), '--device', 'cpu', '--data-dir', data_dir],
                         capture_output=True, text=True, timeout=300, preexec_fn=limit_memory)
    assert (run.returncode, run.stdout) == (2, ''), run.stderr
    line = run.stderr.splitlines()[-1]
    assert line == ("%s: error: --num-gpus %d --device cpu: %d simulated devices would each hold "
                    "a replica of resnet18 with its gradients (85.3 MiB), %.1f GiB in all, more "
                    "than this machine's %.1f GiB of memory; pass --num-gpus %d or fewer"
                    % (PROG, n, n, n * runs.REPLICA_BYTES['resnet18'] / 2 ** 30,
                       memory_bytes() / 2 ** 30, n - 1))


@pytest.mark.parametrize('command, flags, line', [
    ('train', ['--batch-size', '4000'],
     'out of memory (Failed to allocate CPU Memory) with --batch-size 4000 over 1 device(s); '
     'pass a smaller --batch-size, for example --batch-size 2000; nothing was saved (pass '
     '--checkpoint-dir DIR to keep every finished epoch)'),
    pytest.param(  # make test-slow
        'sweep', ['--num-gpus', '1', '--batch-size-per-device', '4000', '--output-dir', '{tmp}'],
        'out of memory (Failed to allocate CPU Memory) in the 1-device setting with '
        '--batch-size-per-device 4000; pass a smaller --batch-size-per-device, for example '
        '--batch-size-per-device 2000; no setting had finished, so nothing was written',
        marks=pytest.mark.slow)])
def test_running_out_of_memory_is_one_line_naming_the_batch_size(command, flags, line, tmp_path,
                                                                 data_dir):
    # 4000 images of ResNet-18 need more than the 4 GB of address space the run may take.
    def limit_memory():
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
    run = subprocess.run([sys.executable, '-m', 'gluon_mgpu.' + command, '--device', 'cpu',
                          '--train-limit', '4000', '--test-limit', '100', '--epochs', '1',
                          '--data-dir', data_dir] + [f.format(tmp=tmp_path) for f in flags],
                         capture_output=True, text=True, timeout=600, preexec_fn=limit_memory)
    assert run.returncode == 1, run.stderr
    assert run.stderr.splitlines()[-1] == 'python -m gluon_mgpu.%s: error: %s' % (command, line)
    assert 'Traceback' not in run.stderr and 'bug report' not in run.stderr


# G. One line.

def test_a_newline_in_a_path_stays_one_line(capsys, tmp_path, data_dir):
    line = _refused(TINY + ['--data-dir', data_dir, '--metrics-json',
                            '%s/no\nsuch/run.json' % tmp_path], capsys)
    assert line == ('%s: error: argument --metrics-json: --metrics-json %s/no\\nsuch/run.json: '
                    'folder %s/no\\nsuch does not exist; create it first (see --help)'
                    % (PROG, tmp_path, tmp_path))


def test_a_params_file_of_random_bytes_is_one_line_without_mxnets_trace(cli_dir, capsys):
    params = checkpoint.checkpoint_path(cli_dir, 1, 'params')
    junk = os.urandom(os.path.getsize(params))
    with open(params, 'wb') as f:
        f.write(junk)
    _edit_json(cli_dir, lambda r: r['files']['params'].update(
        sha256=hashlib.sha256(junk).hexdigest()))
    line = _refused(['--checkpoint-dir', cli_dir, '--resume', '--epochs', '2'], capsys)
    assert line.startswith('%s: error: --resume: %s is not an MXNet array file ('
                           % (PROG, params)), line
    assert 'Traceback' not in line and line.endswith('; start a new run in an empty '
                                                     '--checkpoint-dir'), line


# H. Nothing waits forever (round four).

def _job_env(role, port):
    env = {k: v for k, v in os.environ.items() if not k.startswith('DMLC_')}
    env.update(DMLC_ROLE=role, DMLC_PS_ROOT_URI='127.0.0.1', DMLC_PS_ROOT_PORT=str(port),
               DMLC_NUM_SERVER='1', DMLC_NUM_WORKER='1', OMP_NUM_THREADS='1')
    return env


@pytest.mark.parametrize('role', ['worker', 'server', 'scheduler'])
def test_a_dist_port_out_of_range_is_refused_before_mxnet_waits_on_it(role, data_dir):
    # MXNet's ps-lite waited forever for port 99999, deaf to Ctrl-C; a server or scheduler
    # already inside `import mxnet`.
    run = subprocess.run([sys.executable, '-m', 'gluon_mgpu.train', *TINY, '--data-dir',
                          data_dir, '--num-gpus', '1', '--kvstore', 'dist_sync'],
                         capture_output=True, text=True, timeout=120, env=_job_env(role, 99999))
    assert (run.returncode, run.stdout) == (2, '')
    assert run.stderr.splitlines()[-1] == (
        "%s: error: %sDMLC_PS_ROOT_PORT='99999' is not a TCP port (1 to 65535), and MXNet would "
        "wait for the scheduler on it forever; start the job with python -m gluon_mgpu.launch "
        "-n WORKERS -s SERVERS -- python -m gluon_mgpu.train ..., which sets them"
        % (PROG, '--kvstore dist_sync: ' if role == 'worker' else ''))
    assert 'Traceback' not in run.stderr


@pytest.mark.parametrize('signum', [signal.SIGINT, signal.SIGTERM])
def test_a_worker_waiting_for_a_scheduler_that_never_answers_stops_on_a_signal(signum,
                                                                              data_dir):
    import socket
    with socket.socket() as scheduler:  # takes the connection, never says a word
        scheduler.bind(('127.0.0.1', 0))
        scheduler.listen()
        scheduler.settimeout(240)
        port = scheduler.getsockname()[1]
        run = subprocess.Popen([sys.executable, '-m', 'gluon_mgpu.train', *TINY, '--data-dir',
                                data_dir, '--num-gpus', '1', '--kvstore', 'dist_sync'],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=_job_env('worker', port), preexec_fn=_default_signals)
        try:
            connection, _ = scheduler.accept()  # the worker is inside MXNet, joining the job
            time.sleep(1)
            run.send_signal(signum)
            out, err = run.communicate(timeout=60)
            connection.close()
        finally:
            run.kill()
            run.wait()
    assert run.returncode == 128 + signum
    what = 'interrupted (Ctrl-C)' if signum == signal.SIGINT else 'terminated (SIGTERM)'
    assert _one_line(err) == ('%s: %s while waiting for the other processes of the dist_sync job '
                              '(its scheduler at 127.0.0.1:%d); nothing was trained'
                              % (PROG, what, port))


def test_a_server_whose_job_never_comes_stops_on_ctrl_c():
    import socket
    with socket.socket() as scheduler:  # takes the connection, never says a word
        scheduler.bind(('127.0.0.1', 0))
        scheduler.listen()
        scheduler.settimeout(240)
        run = subprocess.Popen([sys.executable, '-m', 'gluon_mgpu.train', '--kvstore',
                                'dist_sync'], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=_job_env('server', scheduler.getsockname()[1]),
                               preexec_fn=_default_signals)
        try:
            connection, _ = scheduler.accept()  # inside `import mxnet`, serving the job
            time.sleep(1)
            run.send_signal(signal.SIGINT)
            out, err = run.communicate(timeout=60)
            connection.close()
        finally:
            run.kill()
            run.wait()
    assert (run.returncode, out) == (130, '')
    assert _one_line(err) == ('%s: interrupted (Ctrl-C) while running as the server of a dist '
                              'job (DMLC_ROLE=server)' % PROG)


# I. Output that cannot be written (round four): as a Unix tool, never a traceback.

# compare's page takes minutes (it reruns the book's step): its --help stands for it.
COMMANDS = [('train', TINY + ['--epochs', '2']), ('env', []), ('replicas', ['--num-gpus', '2']),
            ('sweep', ['--num-gpus', '1', '--epochs', '1', '--device', 'cpu',
                       '--batch-size-per-device', '8', '--train-limit', '16',
                       '--test-limit', '8']),
            ('compare', ['--help']), ('launch', ['--help'])]


def _command(name, args, data_dir, tmp_path, stdout):
    extra = ['--data-dir', data_dir] if name in ('train', 'sweep') else []
    if name == 'sweep':
        extra += ['--output-dir', str(tmp_path)]
    return subprocess.run([sys.executable, '-m', 'gluon_mgpu.%s' % name, *args, *extra],
                          stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=600,
                          cwd=str(tmp_path))


@pytest.mark.parametrize('name,args', COMMANDS, ids=[c[0] for c in COMMANDS])
def test_stdout_on_a_full_disk_is_one_line_naming_stdout(name, args, data_dir, tmp_path):
    with open('/dev/full', 'w') as full:
        run = _command(name, args, data_dir, tmp_path, full)
    assert run.returncode == 1
    assert run.stderr.splitlines()[-1] == (
        'python -m gluon_mgpu.%s: error: cannot write to stdout (No space left on device); free '
        'some space on that disk or write somewhere else' % name), run.stderr
    assert 'Traceback' not in run.stderr and 'unexpected' not in run.stderr


@pytest.mark.parametrize('name,args', COMMANDS, ids=[c[0] for c in COMMANDS])
def test_stdout_whose_reader_is_gone_ends_quietly_with_141(name, args, data_dir, tmp_path):
    read, write = os.pipe()
    os.close(read)  # `| head -1` after its line: every write is EPIPE
    try:
        run = _command(name, args, data_dir, tmp_path, write)
    finally:
        os.close(write)
    assert run.returncode == 141  # 128 + SIGPIPE, as a shell shows for a Unix tool
    assert 'Traceback' not in run.stderr and 'error' not in run.stderr, run.stderr


# Round four (issue 33): no traceback for bad input, whatever its size or shape; refused before
# training means before training; NaN is reported wherever it enters.

_BIG = '1' + '0' * 400


@pytest.mark.parametrize('flag', ['--warmup-steps', '--num-gpus', '--batch-size', '--epochs',
                                  '--micro-batches', '--check-replicas', '--train-limit'])
def test_a_number_of_400_digits_is_one_line(flag, capsys, data_dir):
    line = _refused(['--data-dir', data_dir, flag, _BIG], capsys)
    assert line == ('%s: error: argument %s: %s must be at most 2147483647, got a number of 401 '
                    'digits; for example %s 2 (see --help)' % (PROG, flag, flag, flag))


@pytest.mark.parametrize('text,says', [
    # Python's int() refuses more than 4300 digits: it said "expects a whole number".
    ('7' * 5000, 'must be at most 2147483647, got a number of 5000 digits'),
    ('-' + '7' * 5000, 'must be at least 1, got a number of 5000 digits'),
    ('0' * 5000 + '3', None),
    # What int() reads besides ASCII digits: underscores, other scripts' digits.
    ('1' + '_000' * 7, 'must be at most 2147483647, got a number of 22 digits'),
    ('0_0' + '9' * 30, 'must be at most 2147483647, got a number of 30 digits'),
    ('\u0663' * 24, 'must be at most 2147483647, got a number of 24 digits'),
])
def test_a_number_longer_than_int_reads_is_one_line(text, says, capsys, data_dir):
    if says is None:  # leading zeros: the number is 3
        assert build_parser().parse_args(['--epochs', text]).epochs == 3
        return
    line = _refused(['--data-dir', data_dir, '--epochs', text], capsys)
    assert line == ('%s: error: argument --epochs: --epochs %s; for example --epochs 2 (see '
                    '--help)' % (PROG, says))


def test_fewer_training_images_than_devices_is_bad_input(capsys, data_dir):
    line = _refused(['--data-dir', data_dir, '--num-gpus', '2', '--batch-size', '2',
                     '--train-limit', '1', '--device', 'cpu'], capsys)
    assert line == ('%s: error: --train-limit 1 gives fewer training images than the 2 devices, '
                    'so some device would get no data; pass --train-limit 2 or more' % PROG)


def test_device_weights_given_on_resume_are_checked_against_the_runs_devices(cli_dir, capsys):
    line = _refused(['--checkpoint-dir', cli_dir, '--resume', '--epochs', '2',
                     '--device-weights', '1,1,1'], capsys)
    assert line == ('%s: error: --device-weights 1,1,1 gives 3 weights but --num-gpus is 2; give '
                    'one weight per device, e.g. --device-weights 1,1' % PROG)


@pytest.mark.parametrize('change,what', [
    (lambda r: r.update(epoch=1.0), 'is not a gluon_mgpu checkpoint 4 file for epoch 1'),
    (lambda r: r['history'][0].update(epoch=1.0), 'history[0]: epoch is 1.0, not integer'),
    (lambda r: r['optimizer'].update(num_update=10 ** 400), 'optimizer is {"lr": 0.2, '
                                                            '"num_update": 1000000'),
])
def test_a_float_or_huge_number_where_a_checkpoint_counts_is_one_line(cli_dir, capsys, change,
                                                                      what):
    path = _edit_json(cli_dir, change)
    line = _refused(['--checkpoint-dir', cli_dir, '--resume', '--epochs', '2'], capsys)
    assert line.startswith('%s: error: --resume: %s' % (PROG, path)) and what in line, line


def test_a_checkpoint_nested_100000_deep_is_one_line_also_before_mxnet_starts(cli_dir):
    path = checkpoint.checkpoint_path(cli_dir, 1, 'json')
    with open(path, 'w') as f:
        f.write('[' * 100000 + ']' * 100000)
    done = subprocess.run([sys.executable, '-m', 'gluon_mgpu.train', '--checkpoint-dir', cli_dir,
                           '--resume', '--epochs', '2'], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 2
    assert _one_line(done.stderr) == ('%s: error: --resume: %s cannot be read (it is nested too '
                                      'deeply); start a new run with an empty --checkpoint-dir'
                                      % (PROG, path))


@pytest.mark.parametrize('make,what', [(os.mkdir, 'a folder'),
                                       (lambda p: os.symlink('/etc/passwd', p),
                                        'a symbolic link')])
@pytest.mark.parametrize('name', ['epoch-0002.params', '.epoch-0002.params.k3x9q2ab.tmp'])
def test_a_folder_or_link_where_a_later_checkpoint_goes_is_refused_before_training(
        tmp_path, capsys, data_dir, make, what, name):
    # A temporary's name too (issue 65 family 9: a folder there was 'Is a directory', unnamed).
    directory = tmp_path / 'ck'
    directory.mkdir()
    make(str(directory / name))
    line = _refused(TINY + ['--data-dir', data_dir, '--epochs', '3', '--checkpoint-dir',
                            str(directory)], capsys)
    assert line == ('%s: error: --checkpoint-dir %s: %s holds %s, which is %s '
                    'where a checkpoint file goes; remove it or pass another folder'
                    % (PROG, directory, directory, name, what))
    assert checkpoint.list_checkpoints(str(directory)) == []


def test_nan_weights_with_a_matching_sha256_are_refused_on_resume(cli_dir, capsys):
    from mxnet import nd
    params = checkpoint.checkpoint_path(cli_dir, 1, 'params')
    arrays = nd.load(params)
    name = sorted(arrays)[0]
    arrays[name][:] = float('nan')
    nd.save(params, arrays)
    with open(params, 'rb') as f:
        content = f.read()
    path = _edit_json(cli_dir, lambda r: r['files']['params'].update(
        bytes=len(content), sha256=hashlib.sha256(content).hexdigest()))
    assert path
    line = _refused(['--checkpoint-dir', cli_dir, '--resume', '--epochs', '2'], capsys)
    assert line == ('%s: error: --resume: %s: %s holds NaN or infinite values (the run diverged '
                    'before it was saved, or the file was changed), so training cannot go on from '
                    'it; start a new run with an empty --checkpoint-dir' % (PROG, params, name))


# Issue 45, family by family.

T45 = ['--model', 'lenet', '--epochs', '1', '--quiet', '--train-limit', '256', '--test-limit',
       '128', '--batch-size', '64', '--device', 'cpu']


def test_45_3_a_copied_run_resumed_never_writes_over_the_originals_outputs(tmp_path, capsys,
                                                                          data_dir):
    first, outputs = str(tmp_path / 'A'), [str(tmp_path / n) for n in ('A.json', 'A.params')]
    assert main(T45 + ['--data-dir', data_dir, '--checkpoint-dir', first, '--metrics-json',
                       outputs[0], '--save-params', outputs[1]]) == 0
    capsys.readouterr()
    copy = str(tmp_path / 'B')
    shutil.copytree(first, copy)
    before = {p: open(p, 'rb').read() for p in outputs}
    line = _refused(['--checkpoint-dir', copy, '--resume', '--epochs', '2'], capsys)
    assert line == ("%s: error: --resume: the run was saved in %s, not in %s (a copy of it, or "
                    "moved to another disk): continuing it would write over the first run's "
                    "--metrics-json %s, --save-params %s; give --metrics-json, --save-params "
                    "again with new paths (or the same ones, to replace them)"
                    % (PROG, first, copy, outputs[0], outputs[1]))
    assert {p: open(p, 'rb').read() for p in outputs} == before
    assert checkpoint.list_checkpoints(copy) == [1]
    # Given again, the copy goes on and writes where it is told; a moved folder keeps its outputs.
    mine = [str(tmp_path / n) for n in ('B.json', 'B.params')]
    assert main(['--checkpoint-dir', copy, '--resume', '--epochs', '2', '--metrics-json',
                 mine[0], '--save-params', mine[1]]) == 0
    assert {p: open(p, 'rb').read() for p in outputs} == before
    assert all(os.path.getsize(p) > 0 for p in mine)
    moved = str(tmp_path / 'C')
    os.rename(first, moved)
    assert main(['--checkpoint-dir', moved, '--resume', '--epochs', '2']) == 0
    assert all(open(p, 'rb').read() != before[p] for p in outputs)


@pytest.mark.parametrize('flag,example', [('--checkpoint-dir', 'runs/a'),
                                          ('--metrics-json', 'run.json'),
                                          ('--plot', 'curves.png'),
                                          ('--save-params', 'net.params')])
@pytest.mark.parametrize('value', ['', ' '])
def test_45_1_an_empty_path_is_refused_before_anything_is_written(flag, example, value, tmp_path,
                                                                 monkeypatch, capsys, data_dir):
    monkeypatch.chdir(tmp_path)
    line = _refused(T45 + ['--data-dir', data_dir, flag, value], capsys)
    assert line == ('%s: error: argument %s: %s is empty (%r; an unset variable?); for example '
                    '%s %s (see --help)' % (PROG, flag, flag, value, flag, example))
    assert os.listdir(tmp_path) == []


_MXNET_PATH = ('MXNet writes there and encodes a path as UTF-8, but this path is not UTF-8 (file '
               'names are %s here), so MXNet would open another file or none; use a name of '
               'ASCII characters, or a UTF-8 locale (LC_ALL=C.UTF-8) and a UTF-8 name (see --help)')


@pytest.mark.parametrize('flag,name', [('--save-params', b'r\xe9sultat.params'),
                                       ('--checkpoint-dir', b'ck\xff')])
def test_45_2_a_name_mxnet_would_open_otherwise_is_refused_before_training(flag, name, tmp_path,
                                                                         data_dir):
    done = subprocess.run([sys.executable, '-m', 'gluon_mgpu.train'] + T45 + [
        '--data-dir', data_dir, flag, name], cwd=tmp_path, capture_output=True, timeout=300,
        env=dict(os.environ, LC_ALL='C.UTF-8'))
    assert done.returncode == 2
    assert _one_line(done.stderr.decode()) == '%s: error: argument %s: %s %s: %s' % (
        PROG, flag, flag, name.decode('ascii', 'backslashreplace'), _MXNET_PATH % 'utf-8')
    assert os.listdir(tmp_path) == []


def test_45_2_in_a_locale_whose_names_are_not_utf8_a_non_ascii_name_is_refused(tmp_path,
                                                                              data_dir):
    # No Latin-1 locale here: the C locale without UTF-8 mode names files in ASCII, and a name
    # of UTF-8 bytes is as foreign to MXNet's UTF-8 as a Latin-1 one would be.
    done = subprocess.run([sys.executable, '-m', 'gluon_mgpu.train'] + T45 + [
        '--data-dir', data_dir, '--save-params', 'résultat.params'], cwd=tmp_path,
        capture_output=True, timeout=300,
        env=dict(os.environ, LC_ALL='C', PYTHONUTF8='0', PYTHONCOERCECLOCALE='0'))
    assert done.returncode == 2
    assert _one_line(done.stderr.decode()) == (
        '%s: error: argument --save-params: --save-params r\\xc3\\xa9sultat.params: %s'
        % (PROG, _MXNET_PATH % 'ascii'))
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize('flag,suffix', [('--save-params', '.params'), ('--plot', '.png'),
                                         ('--metrics-json', '.json')])
def test_45_5_a_name_whose_temporary_file_cannot_exist_is_refused_before_training(
        flag, suffix, tmp_path, capsys, data_dir):
    name = str(tmp_path / ('a' * (244 - len(suffix)) + suffix))
    line = _refused(T45 + ['--data-dir', data_dir, flag, name], capsys)
    assert line == ('%s: error: argument %s: %s %s: its name is 244 bytes long, and the temporary '
                    'file written beside it first (.NAME.XXXXXXXX.tmp) would be 258, more than '
                    'the 255 its folder allows; use a name of at most 241 bytes (see --help)'
                    % (PROG, flag, flag, name))
    assert os.listdir(tmp_path) == []


def test_45_5_fewer_training_images_in_the_folder_than_devices_is_bad_input(tmp_path, capsys):
    from test_hostile_library import _dataset
    folder = _dataset(tmp_path / 'd', train=1, test=2)
    line = _refused(['--num-gpus', '2', '--device', 'cpu', '--model', 'lenet', '--batch-size',
                     '2', '--data-dir', folder], capsys)
    assert line == ('%s: error: --data-dir %s: the training data holds 1 image, fewer than the 2 '
                    'devices, so some device would get no data; pass --num-gpus 1 or fewer, or a '
                    'data folder with more images' % (PROG, folder))


def test_45_5_a_sweep_whose_largest_setting_lacks_images_trains_nothing(tmp_path, capsys,
                                                                        data_dir):
    from gluon_mgpu.commands import sweep
    out = str(tmp_path / 'out')
    assert sweep.main(['--num-gpus', '1', '2', '--train-limit', '1', '--device', 'cpu',
                       '--data-dir', data_dir, '--output-dir', out]) == 2
    printed, err = capsys.readouterr()
    assert _one_line(err) == ('python -m gluon_mgpu.sweep: error: --train-limit 1 gives fewer '
                              'training images than the 2 devices of the largest setting, so '
                              'some device would get no data; pass --train-limit 2 or more')
    assert 'running on' not in printed and not os.path.exists(out)
    folder = __import__('test_hostile_library')._dataset(tmp_path / 'd', train=1, test=2)
    assert sweep.main(['--num-gpus', '1', '2', '--device', 'cpu', '--data-dir', folder,
                       '--output-dir', out]) == 2
    printed, err = capsys.readouterr()
    assert _one_line(err) == ('python -m gluon_mgpu.sweep: error: --data-dir %s: the training '
                              'data holds 1 image, fewer than the 2 devices, so some device '
                              'would get no data; pass --num-gpus 1 or fewer, or a data folder '
                              'with more images' % folder)
    assert 'running on' not in printed


# Root without its capabilities (setpriv, util-linux): root's override of file modes is gone, as
# for any user, while the checkout and the virtualenv stay readable wherever they lie (a clone
# under a mode-0700 folder too, which the user nobody could not read).
_WITHOUT_OVERRIDE = ['setpriv', '--inh-caps=-all', '--bounding-set=-all']
_TRAIN = 'import sys; from gluon_mgpu.commands import train; sys.exit(train.main(sys.argv[1:]))'


@pytest.mark.parametrize('flag,name', [('--metrics-json', 'run.json'), ('--plot', 'run.png'),
                                       ('--save-params', 'net.params')])
def test_45_7_a_write_protected_output_is_left_as_it_is(flag, name, data_dir):
    # Another user's file, mode 0444, in a shared folder (1777): a rename would replace it, as
    # the folder allows; cp and > refuse, and so must we.
    folder = tempfile.mkdtemp(prefix='gluon-mgpu-45-')
    try:
        os.chmod(folder, 0o1777)
        path = os.path.join(folder, name)
        with open(path, 'w') as f:
            f.write('the first run\n')
        os.chown(path, 65534, 65534)
        os.chmod(path, 0o444)
        done = subprocess.run(_WITHOUT_OVERRIDE + [sys.executable, '-c', _TRAIN] + T45 + [
            '--data-dir', data_dir, flag, path], cwd='/', capture_output=True, text=True,
            timeout=300)
        assert done.returncode == 2, done.stderr
        assert _one_line(done.stderr) == (
            '%s: error: argument %s: %s %s: it is write-protected (mode 0444) and is left as it '
            'is; make it writable (chmod u+w) or name another file (see --help)'
            % (PROG, flag, flag, path))
        assert open(path).read() == 'the first run\n' and os.stat(path).st_mode & 0o777 == 0o444
        assert os.listdir(folder) == [name]
    finally:
        shutil.rmtree(folder)


_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize('command', ['train', 'env', 'replicas', 'compare', 'sweep'])
@pytest.mark.parametrize('cause', ['no mxnet', 'warnings as errors', 'a library not MXNet'])
def test_45_6_mxnet_that_cannot_be_imported_is_one_line_from_every_command(command, cause):
    python, env = [sys.executable], dict(os.environ, PYTHONPATH=_ROOT)
    if cause == 'no mxnet':
        python.append('-S')  # no site-packages: this Python has no MXNet
    elif cause == 'warnings as errors':
        env['PYTHONWARNINGS'] = 'error'
    else:
        env['MXNET_LIBRARY_PATH'] = '/etc/passwd'
    flags = ['--num-gpus', '1'] if command == 'sweep' else []
    done = subprocess.run(python + ['-m', 'gluon_mgpu.' + command] + flags, env=env, cwd='/',
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and done.stdout == ''
    start = 'python -m gluon_mgpu.%s: error: cannot import MXNet' % command
    assert _one_line(done.stderr) == start + {
        # compare's module needs numpy, as MXNet does: the first module missing is named.
        'no mxnet': " (ModuleNotFoundError: No module named '%s') with this Python, %s; run "
                    "the command with the virtualenv's Python (.venv/bin/python -m ...), or "
                    "install the requirements into this one (pip install -r requirements.txt)"
                    % ('numpy' if command == 'compare' else 'mxnet', sys.executable),
        'warnings as errors': ': a warning inside MXNet 1.9.1 was turned into an error '
                              '(DeprecationWarning: distutils Version classes are deprecated; '
                              'PYTHONWARNINGS or -W is error); let warnings be '
                              "warnings (unset PYTHONWARNINGS, or add 'ignore::DeprecationWarning')",
        'a library not MXNet': ': MXNET_LIBRARY_PATH=/etc/passwd cannot be loaded (OSError: '
                               '/etc/passwd: invalid ELF header); unset MXNET_LIBRARY_PATH, or '
                               'point it at a libmxnet.so of MXNet 1.9.1'}[cause]


def _address_limit(limit):
    def set_limit():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    return set_limit


def _train_under_ulimit_v(kbytes, data_dir, *flags):
    """One quiet epoch of the train command on CPU devices with ``flags``, its address space
    limited to ``kbytes`` KiB (as ``ulimit -v kbytes``)."""
    return subprocess.run([sys.executable, '-m', 'gluon_mgpu.train', '--device', 'cpu',
                           '--epochs', '1', '--quiet', '--data-dir', data_dir] + list(flags),
                          capture_output=True, text=True, timeout=300,
                          preexec_fn=_address_limit(kbytes * 1024))


def test_45_4_devices_beyond_the_processs_memory_limit_are_refused_before_training(data_dir):
    # 16 replicas of ResNet-18 fit this machine's memory but not 4 GB of address space: the
    # run crashed in MXNet's exit handlers (134) after the out-of-memory line.
    run = _train_under_ulimit_v(4000000, data_dir, '--num-gpus', '16', '--batch-size', '16',
                                '--train-limit', '256', '--test-limit', '128')
    assert (run.returncode, run.stdout) == (2, ''), run.stderr
    line = run.stderr.splitlines()[-1]
    # The cost of a device is an estimate (runs.DEVICE_COST), and the line says so; what the
    # process holds already is measured on the machine that runs the test.
    fixed, times = runs.DEVICE_COST['address']
    each = fixed + times * runs.REPLICA_BYTES['resnet18']
    found = re.fullmatch(
        r"%s: error: --num-gpus 16 --device cpu: 16 simulated devices would need about %s GiB "
        r"more address space \(estimated: about %d MiB each for a replica of resnet18, its "
        r"gradients and buffers, its threads, as measured with MXNet 1\.9\.1 on a 2-core "
        r"machine\), but this process may use 3\.8 GiB \(ulimit -v 4000000\) and needs "
        r"(\d+\.\d) GiB besides; pass --num-gpus (\d+) or fewer, or raise the limit"
        % (PROG, re.escape('%.1f' % (16 * each / 2 ** 30)), each // 2 ** 20), line)
    assert found, line
    room = 4000000 * 1024 - float(found.group(1)) * 2 ** 30  # what is left, to 0.05 GiB
    assert abs(int(found.group(2)) - room / each) <= 1 + 2 ** 30 / 20 / each, line
    assert 'Traceback' not in run.stderr


def test_45_4_memory_running_out_over_simulated_devices_advises_fewer_and_exits_1(data_dir):
    run = _train_under_ulimit_v(2500000, data_dir, '--num-gpus', '2', '--batch-size', '1000',
                                '--train-limit', '1000', '--test-limit', '32')
    assert (run.returncode, run.stdout) == (1, ''), run.stderr
    assert _one_line(run.stderr.split('\n', 1)[1] if run.stderr.startswith('warning') else
                     run.stderr) == (
        '%s: error: out of memory (Failed to allocate CPU Memory) with --batch-size 1000 over 2 '
        'device(s); each simulated device holds a replica of the network: pass fewer devices, for '
        'example --num-gpus 1, or a smaller --batch-size, for example --batch-size 500; nothing '
        'was saved (pass --checkpoint-dir DIR to keep every finished epoch)' % PROG)


def test_45_1_an_empty_sweep_output_folder_is_refused_before_anything(tmp_path, monkeypatch,
                                                                      capsys):
    from gluon_mgpu.commands import sweep
    monkeypatch.chdir(tmp_path)
    assert sweep.main(['--num-gpus', '1', '--output-dir', '']) == 2
    out, err = capsys.readouterr()
    assert out == '' and _one_line(err) == (
        "python -m gluon_mgpu.sweep: error: argument --output-dir: --output-dir is empty (''; an "
        "unset variable?); for example --output-dir sweep-results (see --help)")
    assert os.listdir(tmp_path) == []


# Issue 53: before training, every output is checked against every input, and has one writer.

def _long_folder(root, size):
    """A path under ``root`` of ``size`` bytes, of names of 200 bytes (none is made)."""
    path = str(root)
    while len(path) < size - 201:
        path = os.path.join(path, 'd' * 200)
    return os.path.join(path, 'e' * (size - len(path) - 1))


def test_53_4_a_checkpoint_folder_whose_files_cannot_exist_is_refused_before_training(
        tmp_path, capsys, data_dir):
    directory = _long_folder(tmp_path, 4070)  # epoch-0002.replicas' temporary file: 4104 bytes
    line = _refused(T45 + ['--data-dir', data_dir, '--epochs', '2', '--checkpoint-dir',
                           directory], capsys)
    assert line == ('%s: error: --checkpoint-dir %s: its file epoch-0002.replicas: the path of the '
                    'temporary file written beside it first is 4104 bytes long, more than the '
                    '4095 the system allows; use a shorter path' % (PROG, directory))
    assert os.listdir(tmp_path) == []


def _data_copy(folder, link_labels_to=None):
    """The four data files in ``folder``; the training labels a link to ``link_labels_to``."""
    import gluon_mgpu
    os.makedirs(folder)
    for name in os.listdir(gluon_mgpu.find_data_dir()):
        shutil.copy(os.path.join(gluon_mgpu.find_data_dir(), name), folder)
    if link_labels_to:
        os.replace(os.path.join(folder, 'train-labels-idx1-ubyte.gz'), link_labels_to)
        os.symlink(link_labels_to, os.path.join(folder, 'train-labels-idx1-ubyte.gz'))
    return str(folder)


@pytest.mark.parametrize('flag,name', [('--save-params', 'train-images-idx3-ubyte.gz'),
                                       ('--metrics-json', 't10k-images-idx3-ubyte.gz'),
                                       ('--plot', 'labels.png')])
@pytest.mark.parametrize('given', [True, False])
def test_53_4_an_output_onto_a_file_of_the_data_folder_is_refused(flag, name, given, tmp_path,
                                                                   capsys, monkeypatch):
    store = str(tmp_path / 'store')
    os.mkdir(store)
    folder = _data_copy(tmp_path / 'mx' / 'datasets' / 'fashion-mnist',
                        os.path.join(store, 'labels.png'))  # a link: what it points to counts
    monkeypatch.setenv('MXNET_HOME', str(tmp_path / 'mx'))  # the folder the run finds first
    path = os.path.join(store if name == 'labels.png' else folder, name)
    before = _snapshot(folder), _snapshot(store)
    line = _refused(T45 + (['--data-dir', folder] if given else []) + [flag, path], capsys)
    assert line == ('%s: error: %s %s would write over a file of %s %s; name it otherwise or put '
                    'it in another folder' % (PROG, flag, path, '--data-dir' if given else
                                              'the data folder', folder))
    assert (_snapshot(folder), _snapshot(store)) == before


def test_53_8_an_output_another_run_writes_is_refused_and_a_killed_ones_lock_is_not(
        tmp_path, capsys, data_dir):
    path = str(tmp_path / 'run.json')
    with files.lock_file(str(tmp_path / '.run.json.lock'), 'x'):  # as a run writing it holds
        line = _refused(T45 + ['--data-dir', data_dir, '--metrics-json', path], capsys)
    assert line == ('%s: error: --metrics-json %s: %s is in use by another run (pid %d); wait '
                    'for it to end, or write elsewhere' % (PROG, path, path, os.getpid()))
    assert os.listdir(tmp_path) == []  # nothing written, the lock file gone with the lock
    code = ('import sys, time; from gluon_mgpu.runtime import files\n'
            'lock = files.lock_file(sys.argv[1], "x"); print("held", flush=True)\n'
            'time.sleep(120)\n')
    child = subprocess.Popen([sys.executable, '-c', code, str(tmp_path / '.run.json.lock')],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == 'held\n'
        line = _refused(T45 + ['--data-dir', data_dir, '--save-params', path], capsys)
        assert line.endswith(': %s is in use by another run (pid %d); wait for it to end, or '
                             'write elsewhere' % (path, child.pid)), line
    finally:
        child.kill()
        child.wait()
    assert os.listdir(tmp_path) == ['.run.json.lock']  # SIGKILL left the file, not the lock
    assert main(T45 + ['--data-dir', data_dir, '--metrics-json', path]) == 0
    assert os.listdir(tmp_path) == ['run.json']


def test_53_5_a_resume_from_another_folder_reads_the_recorded_paths_where_the_run_started(
        tmp_path, capsys, monkeypatch, data_dir):
    one, two = (os.path.realpath(tmp_path / n) for n in ('one', 'two'))
    os.makedirs(os.path.join(two, 'data'))  # no data here: reading it would fail
    os.mkdir(one)
    os.symlink(data_dir, os.path.join(one, 'data'))
    monkeypatch.chdir(one)
    assert main(T45 + ['--checkpoint-dir', 'ck', '--data-dir', 'data', '--metrics-json',
                       'm.json', '--plot', 'p.png']) == 0
    assert checkpoint.read_checkpoint('ck')['cwd'] == one
    monkeypatch.chdir(two)
    # A checkpoint without "cwd" (an older one) reads its relative paths here, as before.
    path = _edit_json(os.path.join(one, 'ck'), lambda r: r.pop('cwd'))
    line = _refused(['--checkpoint-dir', '../one/ck', '--resume', '--epochs', '2'], capsys)
    assert line.startswith('%s: error: --data-dir data: Fashion-MNIST not found: searched data '
                           'for ' % PROG), line
    _edit_json(os.path.join(one, 'ck'), lambda r: r.update(cwd=one))
    assert main(['--checkpoint-dir', '../one/ck', '--resume', '--epochs', '2']) == 0
    assert sorted(os.listdir(one)) == ['ck', 'data', 'm.json', 'p.png']
    assert sorted(os.listdir(two)) == ['data'] and os.listdir('data') == []
    assert len(json.load(open(os.path.join(one, 'm.json')))['history']) == 2
    # A flag given again is read from the folder it is given in; the others still from one/.
    assert main(['--checkpoint-dir', '../one/ck', '--resume', '--epochs', '3', '--metrics-json',
                 'm.json']) == 0
    assert sorted(os.listdir(two)) == ['data', 'm.json']
    assert len(json.load(open('m.json'))['history']) == 3
    assert len(json.load(open(os.path.join(one, 'm.json')))['history']) == 2
    record = json.load(open(path.replace('0001', '0003')))
    assert record['cwd'] == two and '--data-dir=%s/data' % one in record['argv']


def test_53_a_recorded_output_now_unwritable_is_no_refusal_once_given_anew(tmp_path, capsys,
                                                                          data_dir):
    old, ck, new = str(tmp_path / 'old' / 'm.json'), str(tmp_path / 'ck'), str(tmp_path / 'n.json')
    os.mkdir(os.path.dirname(old))
    assert main(T45 + ['--data-dir', data_dir, '--checkpoint-dir', ck, '--metrics-json', old]) == 0
    os.remove(old)
    os.mkdir(old)  # the recorded output is a folder now
    line = _refused(['--checkpoint-dir', ck, '--resume', '--epochs', '2'], capsys)
    assert line.startswith('%s: error: --resume: %s records the command line ' % (
        PROG, checkpoint.checkpoint_path(ck, 1, 'json'))), line
    assert line.endswith('which the command refuses (argument --metrics-json: --metrics-json %s: '
                         'it is a folder; name a file in it); start a new run in an empty '
                         '--checkpoint-dir' % old), line
    assert main(['--checkpoint-dir', ck, '--resume', '--epochs', '2', '--metrics-json', new]) == 0
    assert len(json.load(open(new))['history']) == 2 and os.listdir(old) == []


def test_53_7_a_copy_whose_recorded_folder_names_it_is_told_apart_by_device_and_inode(
        cli_dir, capsys, monkeypatch, tmp_path):
    # A folder moved to another disk, its recorded path fixed by hand (with a trailing slash):
    # the paths are the same, what differs is named.
    output = str(tmp_path / 'm.json')
    _edit_json(cli_dir, lambda r: (r['argv'].append('--metrics-json=' + output),
                                   r['folder'].update(path=cli_dir + '/')))
    was, here = checkpoint.read_checkpoint(cli_dir)['folder'], checkpoint.folder_identity(cli_dir)
    monkeypatch.chdir(tmp_path)
    line = _refused(['--checkpoint-dir', 'ck', '--resume', '--epochs', '2'], capsys)
    assert line == ("%s: error: --resume: the run was saved in %s/ (device %d, inode %d), not in "
                    "%s (device %d, inode %d) (a copy of it, or moved to another disk): continuing "
                    "it would write over the first run's --metrics-json %s; give --metrics-json "
                    "again with new paths (or the same ones, to replace them)"
                    % (PROG, cli_dir, was['device'], was['inode'], here['path'], here['device'],
                       here['inode'], output))


@pytest.mark.parametrize('flags', [['--checkpoint-dir', 'ck'], ['--metrics-json', 'm.json'],
                                   ['--plot', 'p.png'], ['--checkpoint-dir', '{tmp}/ck']])
def test_53_7_a_deleted_working_folder_is_one_line_naming_it(flags, tmp_path, capsys, monkeypatch,
                                                             data_dir):
    gone = tmp_path / 'gone'
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    argv = T45 + ['--data-dir', data_dir] + [f.replace('{tmp}', str(tmp_path)) for f in flags]
    if flags[1].startswith('{'):  # absolute paths only: the run trains, its checkpoint has no cwd
        assert main(argv) == 0
        assert 'cwd' not in checkpoint.read_checkpoint(str(tmp_path / 'ck'))
        return
    line = _refused(argv, capsys)
    assert line == ('%s: error: the folder this command runs in was deleted, so no relative path '
                    'names a file; cd into a folder that exists and run the command again' % PROG)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize('command', ['train', 'env', 'replicas', 'compare', 'sweep', 'launch'])
@pytest.mark.parametrize('closed', [1, 2], ids=['stdout', 'stderr'])
def test_65_6_a_command_started_with_a_stream_closed_says_what_it_can_and_exits_as_ever(
        command, closed):
    # `cmd >&-` or `cmd 2>&-`: Python starts with that stream None. As print() does then, what
    # would be written there goes nowhere; the refused flag is still one line (when stderr is
    # open) and exit code 2, never a traceback and 1.
    done = subprocess.run([sys.executable, '-m', 'gluon_mgpu.' + command, '--bogus'],
                          preexec_fn=lambda: os.close(closed),
                          stdout=None if closed == 1 else subprocess.PIPE,
                          stderr=None if closed == 2 else subprocess.PIPE, text=True,
                          env=dict(os.environ, PYTHONPATH=_ROOT), cwd='/', timeout=120)
    assert done.returncode == 2
    if closed == 1:
        assert _one_line(done.stderr).startswith('python -m gluon_mgpu.%s: error: ' % command)
        assert 'Traceback' not in done.stderr
    else:
        assert done.stdout == ''


def test_65_6_a_run_started_with_stdout_closed_trains_and_writes_its_outputs(tmp_path, data_dir):
    done = subprocess.run([sys.executable, '-m', 'gluon_mgpu.train'] + T45 + [
        '--data-dir', data_dir, '--metrics-json', str(tmp_path / 'run.json')],
        preexec_fn=lambda: os.close(1), stderr=subprocess.PIPE, text=True,
        env=dict(os.environ, PYTHONPATH=_ROOT), cwd='/', timeout=300)
    assert done.returncode == 0 and 'Traceback' not in done.stderr, done.stderr
    with open(tmp_path / 'run.json') as f:
        record = json.load(f)
    assert record['status'] == 'finished' and len(record['history']) == 1


def test_65_9_an_address_space_too_small_for_mxnet_is_named_not_called_an_installation_fault():
    limit = 300 * 2 ** 20  # Python and numpy start within it; libmxnet.so's segments do not map
    done = subprocess.run([sys.executable, '-m', 'gluon_mgpu.env'], capture_output=True,
                          text=True, env=dict(os.environ, PYTHONPATH=_ROOT), cwd='/', timeout=120,
                          preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS,
                                                                (limit, limit)))
    assert done.returncode == 2
    line = _one_line(done.stderr)
    assert line.startswith("python -m gluon_mgpu.env: error: cannot import MXNet: this process's "
                           'address space (ulimit -v 307200 KiB) is too small to load '
                           'libmxnet.so (OSError: '), line
    assert line.endswith('failed to map segment from shared object); raise the limit (ulimit -v '
                         'unlimited) or run where it is larger')


def test_65_9_an_output_whose_lock_cannot_be_written_is_named_and_leaves_no_lock(tmp_path,
                                                                                 data_dir):
    # A full disk (here a file size limit of 0 bytes: the same refusal of the first byte): the
    # lock's pid cannot be written. Before, a raw "[Errno 28]" line, and the empty lock stayed.
    def limited():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # then writing past the limit is EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (0, resource.RLIM_INFINITY))
    path = tmp_path / 'run.json'
    done = subprocess.run([sys.executable, '-m', 'gluon_mgpu.train'] + T45 + [
        '--data-dir', data_dir, '--metrics-json', str(path)], capture_output=True, text=True,
        preexec_fn=limited, env=dict(os.environ, PYTHONPATH=_ROOT, PYTHONDONTWRITEBYTECODE='1'),
        cwd='/', timeout=300)
    assert done.returncode == 2
    assert _one_line(done.stderr) == (
        '%s: error: --metrics-json %s: cannot write %s (File too large); raise the file size '
        'limit (ulimit -f) or write somewhere else' % (PROG, path, tmp_path / '.run.json.lock'))
    assert os.listdir(tmp_path) == []


def test_65_a_tampered_records_paths_are_named_and_followed_onto_a_runs_files_only(
        tmp_path, capsys, monkeypatch, data_dir):
    # The second limit of issue 65: a record's argv and cwd choose where a resume writes the
    # outputs not given again. Before: written over whatever file lay there, unsaid.
    one, victim = (os.path.realpath(tmp_path / n) for n in ('one', 'victim'))
    os.mkdir(one)
    os.mkdir(victim)
    with open(os.path.join(victim, 'm.json'), 'w') as f:
        f.write('a file of the user\n')
    monkeypatch.chdir(one)
    assert main([a for a in T45 if a != '--quiet'] + [
        '--checkpoint-dir', 'ck', '--data-dir', data_dir, '--metrics-json', 'm.json', '--plot',
        'p.png', '--save-params', 'n.params']) == 0
    capsys.readouterr()
    _edit_json(os.path.join(one, 'ck'), lambda r: r.update(cwd=victim))
    line = _refused(['--checkpoint-dir', 'ck', '--resume', '--epochs', '2'], capsys)
    assert line == ("%s: error: --resume: the run's record names --metrics-json %s/m.json (from "
                    "its working folder %s), where a file lies that no run wrote; give "
                    "--metrics-json again with the path to write (a record's paths are followed "
                    "onto a run's own files only)" % (PROG, victim, victim)), line
    assert open(os.path.join(victim, 'm.json')).read() == 'a file of the user\n'
    _edit_json(os.path.join(one, 'ck'), lambda r: r.update(cwd=one))
    assert main(['--checkpoint-dir', 'ck', '--resume', '--epochs', '2']) == 0
    assert capsys.readouterr().out.splitlines()[2] == (
        "writing --metrics-json %s/m.json, --plot %s/p.png, --save-params %s/n.params, as the "
        "run's record says" % (one, one, one))
