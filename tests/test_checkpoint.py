import hashlib
import json
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import time
import types

import mxnet as mx
import numpy as np
import pytest
from mxnet import nd
from mxnet.gluon import nn

import gluon_mgpu
from gluon_mgpu.handlers import checkpoint
from gluon_mgpu import training
from gluon_mgpu.commands.train import main

TINY = ['--num-gpus', '2', '--batch-size', '16', '--train-limit', '48', '--test-limit', '16',
        '--seed', '0']


def _bn_cnn():
    """Small, with BatchNorm: each device keeps its own running statistics."""
    net = nn.HybridSequential()
    net.add(nn.Conv2D(4, kernel_size=3), nn.BatchNorm(), nn.Activation('relu'),
            nn.MaxPool2D(2), nn.Dense(10))
    return net


def _saver(directory, resume=None):
    return checkpoint.CheckpointHandler(directory, {'args': {'epochs': 3}}, resume=resume)


def _load(path):
    return {k: v.asnumpy() for k, v in (nd.load(path) or {}).items()}


def _assert_bit_equal(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].tobytes() == b[k].tobytes(), k


@pytest.fixture(scope='module')
def small_data(data_dir):
    return gluon_mgpu.load_data_fashion_mnist(8, data_dir=data_dir, train_limit=24,
                                              test_limit=8, seed=4)


def _first_run(directory, small_data, devices):
    net = _bn_cnn()
    trainer = training.init_training(net, devices, 0.5, seed=1)
    history = gluon_mgpu.train(net, *small_data, devices, num_epochs=3, trainer=trainer,
                               event_handlers=[_saver(directory)])
    return net, history


def _resume(directory, small_data, devices, epoch):
    net = _bn_cnn()
    trainer = training.init_training(net, devices, 0.5, seed=99)
    record = checkpoint.read_checkpoint(directory, epoch)
    checkpoint.restore(directory, record, net, trainer, devices)
    return net, trainer, record


def test_a_resumed_run_ends_bit_equal_to_an_uninterrupted_one(tmp_path, small_data, two_cpus):
    full, resumed = tmp_path / 'full', tmp_path / 'resumed'
    os.mkdir(full)
    _, history = _first_run(str(full), small_data, two_cpus)
    assert checkpoint.list_checkpoints(str(full)) == [1, 2, 3]
    os.mkdir(resumed)
    for kind in ('json',) + checkpoint.KINDS:
        shutil.copy(checkpoint.checkpoint_path(str(full), 1, kind), resumed)
    net, trainer, record = _resume(str(resumed), small_data, two_cpus, None)
    assert record['epoch'] == 1 and record['history'] == history[:1]
    resumed_history = gluon_mgpu.train(
        net, *small_data, two_cpus, num_epochs=3, trainer=trainer,
        event_handlers=[_saver(str(resumed), resume=record)])
    assert [h['epoch'] for h in resumed_history] == [1, 2, 3]
    for key in ('train_loss', 'train_acc', 'test_acc'):
        assert [h[key] for h in resumed_history] == [h[key] for h in history]
    for kind in checkpoint.KINDS:
        with open(checkpoint.checkpoint_path(str(full), 3, kind), 'rb') as a, \
                open(checkpoint.checkpoint_path(str(resumed), 3, kind), 'rb') as b:
            assert a.read() == b.read(), kind


def test_the_replicas_file_holds_each_devices_batchnorm_statistics(tmp_path, small_data,
                                                                   two_cpus):
    net, _ = _first_run(str(tmp_path), small_data, two_cpus)
    replicas = _load(checkpoint.checkpoint_path(str(tmp_path), 3, 'replicas'))
    # Conv, Dense weights and biases, BatchNorm gamma/beta are the same on both devices;
    # only BatchNorm's running statistics differ, and they are all kept, per device.
    assert sorted(replicas) == ['1.running_mean@0', '1.running_mean@1', '1.running_var@0',
                                '1.running_var@1']
    assert not np.array_equal(replicas['1.running_var@0'], replicas['1.running_var@1'])
    averaged = _load(checkpoint.checkpoint_path(str(tmp_path), 3, 'params'))
    bn = net[1]
    for i, d in enumerate(two_cpus):
        assert np.array_equal(replicas['1.running_var@%d' % i], bn.running_var.data(d).asnumpy())
    # What save_parameters alone keeps: the average, which a resumed run could not split again.
    assert np.allclose(averaged['1.running_var'],
                       (replicas['1.running_var@0'] + replicas['1.running_var@1']) / 2)
    assert not np.array_equal(averaged['1.running_var'], replicas['1.running_var@0'])


def test_one_device_needs_no_replicas(tmp_path, small_data):
    devices = [mx.cpu(0)]
    net = _bn_cnn()
    trainer = training.init_training(net, devices, 0.5, seed=1)
    gluon_mgpu.train(net, *small_data, devices, num_epochs=1, trainer=trainer,
                     event_handlers=[_saver(str(tmp_path))])
    assert _load(checkpoint.checkpoint_path(str(tmp_path), 1, 'replicas')) == {}
    net2, _, _ = _resume(str(tmp_path), small_data, devices, 1)
    for p, q in zip(net.collect_params().values(), net2.collect_params().values()):
        assert p.data().asnumpy().tobytes() == q.data().asnumpy().tobytes()


SETTINGS = {'batch_size': 8, 'lr': 0.5, 'train_limit': 24, 'test_limit': 8}


def _notebook_cell(directory, data_dir, devices, init_seed, settings=SETTINGS):
    """What the notebook's training cell does with GLUON_MGPU_CHECKPOINTS set: the data order
    drawn anew (no seed given), the network initialized, ``resumable`` before ``train``."""
    net = _bn_cnn()
    train_iter, test_iter = gluon_mgpu.load_data_fashion_mnist(8, data_dir=data_dir,
                                                               train_limit=24, test_limit=8)
    trainer = training.init_training(net, devices, 0.5, seed=init_seed)
    handlers, done = gluon_mgpu.resumable(directory, net, trainer, devices, train_iter, settings)
    return done, gluon_mgpu.train(net, train_iter, test_iter, devices, 3, trainer, handlers)


def test_a_notebook_cell_executed_again_goes_on_after_its_last_epoch(tmp_path, data_dir,
                                                                    two_cpus, capsys):
    full, cut = str(tmp_path / 'full'), str(tmp_path / 'cut')
    done, history = _notebook_cell(full, data_dir, two_cpus, 1)
    assert done == [] and checkpoint.list_checkpoints(full) == [1, 2, 3]
    assert len(re.findall(r'^epoch \d', capsys.readouterr().out, re.M)) == 3
    # Stopped after epoch 1; executed again with another initialization and another data seed
    # drawn, both replaced by the checkpoint's.
    os.mkdir(cut)
    for kind in ('json',) + checkpoint.KINDS:
        shutil.copy(checkpoint.checkpoint_path(full, 1, kind), cut)
    done, resumed = _notebook_cell(cut, data_dir, two_cpus, 99)
    assert done == history[:1] and [h['epoch'] for h in resumed] == [1, 2, 3]
    assert capsys.readouterr().out == ''.join(
        gluon_mgpu.format_epoch(h) + '\n' for h in resumed[1:])
    for key in ('train_loss', 'train_acc', 'test_acc'):
        assert [h[key] for h in resumed] == [h[key] for h in history]
    for kind in checkpoint.KINDS:
        with open(checkpoint.checkpoint_path(full, 3, kind), 'rb') as a, \
                open(checkpoint.checkpoint_path(cut, 3, kind), 'rb') as b:
            assert a.read() == b.read(), kind
    # A finished run trains nothing more; a run of other settings is refused before loading.
    assert _notebook_cell(cut, data_dir, two_cpus, 5)[1] == resumed
    with pytest.raises(checkpoint.CheckpointError, match=re.escape(
            '%s holds a run with the settings {"batch_size": 8, "lr": 0.5, "train_limit": 24, '
            '"test_limit": 8}, not {"batch_size": 16}; delete the folder to start again, or use '
            'another one' % cut)):
        _notebook_cell(cut, data_dir, two_cpus, 5, {'batch_size': 16})


@pytest.mark.parametrize('directory,settings,line', [
    ('', SETTINGS, "directory is empty; pass the folder for the run's checkpoints, for example "
                   "'checkpoints/train-2'"),
    ('ck', {'lr': np.float32(0.5)}, 'settings cannot be kept in a checkpoint (Object of type '
                                    'float32 is not JSON serializable); pass numbers, strings, '
                                    'lists and dicts, for example {"batch_size": 256, "lr": 0.1}'),
    ('ck', {'lr': float('nan')}, 'settings cannot be kept in a checkpoint (Out of range float '
                                 'values are not JSON compliant'),
])
def test_65_5_resumable_refuses_what_it_cannot_keep_before_training(directory, settings, line,
                                                                  tmp_path, monkeypatch,
                                                                  two_cpus):
    # Before: an epoch trained, then a TypeError and files left behind; '' a FileNotFoundError.
    monkeypatch.chdir(tmp_path)
    net = _bn_cnn()
    trainer = training.init_training(net, two_cpus, 0.5)
    with pytest.raises(ValueError) as e:
        gluon_mgpu.resumable(directory, net, trainer, two_cpus, None, settings)
    assert str(e.value).startswith(line)
    assert os.listdir(tmp_path) == []


def test_65_5_a_run_with_tuples_in_its_settings_and_a_schedule_resumes(tmp_path, data_dir,
                                                                       two_cpus):
    # Tuples come back from JSON as lists, and a trainer with an lr_scheduler made every
    # resume raise MXNet's UserWarning from set_learning_rate; its rate now follows the count.
    def cell(directory, epochs):
        net = _bn_cnn()
        train_iter, test_iter = gluon_mgpu.load_data_fashion_mnist(
            8, data_dir=data_dir, train_limit=24, test_limit=8, seed=3)
        mx.random.seed(1)
        net.initialize(mx.init.Normal(0.01), ctx=two_cpus)
        trainer = mx.gluon.Trainer(net.collect_params(), 'sgd', {
            'learning_rate': 0.5, 'lr_scheduler': mx.lr_scheduler.FactorScheduler(2, 0.5)},
            update_on_kvstore=False)
        handlers, _ = gluon_mgpu.resumable(directory, net, trainer, two_cpus, train_iter,
                                           {'sizes': (8, 24)})
        gluon_mgpu.train(net, train_iter, test_iter, two_cpus, epochs, trainer, handlers[2:])
        return checkpoint.read_checkpoint(directory)
    full = cell(str(tmp_path / 'full'), 2)
    cell(str(tmp_path / 'cut'), 1)
    resumed = cell(str(tmp_path / 'cut'), 2)
    assert resumed['optimizer'] == full['optimizer'] == {'lr': 0.125, 'num_update': 6}
    assert [h['train_loss'] for h in resumed['history']] == [
        h['train_loss'] for h in full['history']]


def test_65_5_resumable_holds_its_folder_against_other_processes_until_train_ends(
        tmp_path, data_dir, two_cpus):
    # Before: two kernels with one GLUON_MGPU_CHECKPOINTS both trained, mixing their epochs.
    directory = str(tmp_path / 'ck')
    other = [sys.executable, '-c', 'import sys; from gluon_mgpu.handlers.checkpoint import '
             'lock_dir; held = lock_dir(sys.argv[1])', directory]
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(
        __file__))))

    def cell():
        net = _bn_cnn()
        train_iter, _ = gluon_mgpu.load_data_fashion_mnist(8, data_dir=data_dir, train_limit=16,
                                                           test_limit=8)
        return gluon_mgpu.resumable(directory, net, training.init_training(net, two_cpus, 0.5),
                                    two_cpus, train_iter, SETTINGS)[0]
    cell()
    done = subprocess.run(other, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 1 and '%s is in use by another run (pid %d)' % (
        directory, os.getpid()) in done.stderr, done.stderr
    handlers = cell()  # the same process again, as a cell executed anew: its earlier lock goes
    handlers[-1].train_end(None)  # what train() calls once the epochs are done
    holder = subprocess.Popen(other[:2] + [other[2] + '; print("held", flush=True); '
                                           'sys.stdin.read()', directory], env=env,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == 'held\n'
        with pytest.raises(checkpoint.CheckpointError) as e:
            cell()
        assert str(e.value) == ('%s is in use by another run (pid %d); wait for it to end, or '
                                'pass another directory' % (directory, holder.pid))
    finally:
        holder.communicate('', timeout=120)
    assert holder.returncode == 0


@pytest.fixture(scope='module')
def saved_run(tmp_path_factory, data_dir):
    """Two epochs of the small network on two devices, checkpointed."""
    directory = str(tmp_path_factory.mktemp('saved'))
    devices = [mx.cpu(0), mx.cpu(1)]
    train_iter, test_iter = gluon_mgpu.load_data_fashion_mnist(
        8, data_dir=data_dir, train_limit=16, test_limit=8, seed=4)
    net = _bn_cnn()
    trainer = training.init_training(net, devices, 0.5, seed=1)
    gluon_mgpu.train(net, train_iter, test_iter, devices, num_epochs=2, trainer=trainer,
                     event_handlers=[_saver(directory)])
    return directory


@pytest.fixture
def run_dir(saved_run, tmp_path):
    directory = str(tmp_path / 'run')
    shutil.copytree(saved_run, directory)
    return directory


def test_the_json_records_every_file_with_its_size_and_sha256(run_dir):
    record = checkpoint.read_checkpoint(run_dir)
    assert record['epoch'] == 2 and record['format'] == checkpoint.FORMAT
    assert [h['epoch'] for h in record['history']] == [1, 2]
    for kind in checkpoint.KINDS:
        entry = record['files'][kind]
        path = checkpoint.checkpoint_path(run_dir, 2, kind)
        assert entry['name'] == os.path.basename(path)
        assert entry['bytes'] == os.path.getsize(path)
        with open(path, 'rb') as f:
            assert entry['sha256'] == hashlib.sha256(f.read()).hexdigest()
    assert sorted(os.listdir(run_dir)) == ['epoch-%04d.%s' % (e, k) for e in (1, 2)
                                           for k in ('json', 'params', 'replicas')]


def test_the_json_records_the_optimizers_learning_rate_and_update_count(run_dir):
    # Two epochs of two steps; the book's SGD has no momentum, so no state to keep.
    assert checkpoint.read_checkpoint(run_dir)['optimizer'] == {'lr': 0.5, 'num_update': 4}


def test_an_optimizer_with_state_is_refused_before_anything_is_written(tmp_path, small_data,
                                                                        two_cpus):
    net = _bn_cnn()
    training.init_training(net, two_cpus, 0.5, seed=1)
    trainer = mx.gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.5,
                                                             'momentum': 0.9},
                               update_on_kvstore=False)
    with pytest.raises(checkpoint.CheckpointError, match=r'^the optimizer SGD keeps state '
                       r'\(momentum or the like\), which a checkpoint does not hold; train with '
                       r'SGD without momentum, as the chapter does$'):
        gluon_mgpu.train(net, *small_data, two_cpus, num_epochs=1, trainer=trainer,
                         event_handlers=[_saver(str(tmp_path))])
    assert os.listdir(tmp_path) == []


def test_a_failed_save_leaves_the_previous_checkpoint_and_no_temporary_file(run_dir, two_cpus,
                                                                           monkeypatch):
    net, trainer, _ = _resume(run_dir, None, two_cpus, 2)

    def disk_full(path, arrays):
        with open(path, 'wb') as f:
            f.write(b'half')
        raise OSError(28, 'No space left on device')
    monkeypatch.setattr(checkpoint, 'nd', types.SimpleNamespace(
        load=nd.load, load_frombuffer=nd.load_frombuffer, save=disk_full))
    with pytest.raises(OSError, match='No space left'):
        checkpoint.save_checkpoint(run_dir, 3, net, trainer, {'history': []})
    assert checkpoint.list_checkpoints(run_dir) == [1, 2]
    assert not any(n.startswith('.') for n in os.listdir(run_dir))
    assert not os.path.exists(checkpoint.checkpoint_path(run_dir, 3, 'replicas'))
    assert checkpoint.read_checkpoint(run_dir)['epoch'] == 2


def test_temporary_files_of_a_killed_run_are_ignored_then_deleted(run_dir):
    leftover = os.path.join(run_dir, '.epoch-0003.params.4242.tmp')
    with open(leftover, 'wb') as f:
        f.write(b'cut short')
    assert checkpoint.list_checkpoints(run_dir) == [1, 2]
    checkpoint.lock_dir(run_dir).release()  # the next run to hold the folder deletes them
    assert not os.path.exists(leftover)


class _Marker:
    """Unpickling this creates a file: proof that a pickle was loaded."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, 'w'))


@pytest.mark.parametrize('change', ['pickle', 'same size', 'truncated'])
def test_a_replaced_replicas_file_is_refused_before_it_is_loaded(run_dir, tmp_path, change,
                                                                 two_cpus):
    states = checkpoint.checkpoint_path(run_dir, 2, 'replicas')
    marker = str(tmp_path / 'unpickled')
    size = os.path.getsize(states)
    content = open(states, 'rb').read()
    content = {'pickle': pickle.dumps(_Marker(marker)),
               'same size': content[:-1] + bytes([content[-1] ^ 1]),
               'truncated': content[:size // 2]}[change]
    with open(states, 'wb') as f:
        f.write(content)
    expected = (r'epoch-0002\.replicas has sha256 [0-9a-f]{12}\.\.\., but the run recorded '
                r'[0-9a-f]{12}\.\.\.: it was changed' if change == 'same size' else
                r'epoch-0002\.replicas is %s: %d bytes, but the run wrote %d bytes'
                % ('truncated' if len(content) < size else 'changed', len(content), size))
    with pytest.raises(checkpoint.CheckpointError, match=expected + r'.*; delete .*epoch-0002\.\* '
                       r'to resume from epoch 1 instead'):
        checkpoint.read_checkpoint(run_dir)
    assert not os.path.exists(marker)
    if change == 'pickle':
        # The file really is a working pickle: loading it without the check would have run it.
        with open(states, 'rb') as f:
            pickle.load(f)
        assert os.path.exists(marker)


def test_a_truncated_params_file_is_named(run_dir):
    params = checkpoint.checkpoint_path(run_dir, 2, 'params')
    size = os.path.getsize(params)
    with open(params, 'r+b') as f:
        f.truncate(size // 2)
    with pytest.raises(checkpoint.CheckpointError,
                       match=r'epoch-0002\.params is truncated: %d bytes, but the run wrote %d '
                             r'bytes' % (size // 2, size)):
        checkpoint.read_checkpoint(run_dir)


@pytest.mark.parametrize('edit,says', [
    (lambda t: b'\xef\xbb\xbf' + t, None),  # an editor's byte-order mark: read as it is
    (lambda t: t.rstrip()[:-1].rstrip() + b',\n}', 'it is not valid JSON at line {lines} column '
                                                  '1: a trailing comma before }}); remove that '
                                                  'comma'),
    (lambda t: t.replace(b'"history"', b'"caf\xe9"', 1),
     'it is not UTF-8 (byte 0xe9 at offset {offset})); save it as UTF-8'),
])
def test_a_json_one_edit_broke_names_that_edit(run_dir, edit, says):
    """Issue 53 (7): the arrays are intact; the cause and its one-character fix are named."""
    path = checkpoint.checkpoint_path(run_dir, 2, 'json')
    with open(path, 'rb') as f:
        changed = edit(f.read())
    with open(path, 'wb') as f:
        f.write(changed)
    if says is None:
        assert checkpoint.read_checkpoint(run_dir)['epoch'] == 2
        return
    with pytest.raises(checkpoint.CheckpointError) as e:
        checkpoint.read_checkpoint(run_dir)
    assert str(e.value) == '%s cannot be read (%s' % (path, says.format(
        lines=changed.count(b'\n') + 1, offset=changed.find(b'\xe9')))


def test_a_broken_json_or_a_missing_file_is_named(run_dir):
    path = checkpoint.checkpoint_path(run_dir, 2, 'json')
    text = open(path).read()
    with open(path, 'w') as f:
        f.write(text[:len(text) // 2])
    with pytest.raises(checkpoint.CheckpointError,
                       match=r'epoch-0002\.json cannot be read \(.*\); delete .*epoch-0002\.\* '
                             r'to resume from epoch 1 instead'):
        checkpoint.read_checkpoint(run_dir)
    os.remove(checkpoint.checkpoint_path(run_dir, 1, 'replicas'))
    with pytest.raises(checkpoint.CheckpointError,
                       match=r'epoch-0001\.replicas is missing, but epoch-0001\.json lists it; '
                             r'start a new run with an empty --checkpoint-dir'):
        checkpoint.read_checkpoint(run_dir, 1)


def test_no_checkpoint_is_named(tmp_path):
    with pytest.raises(checkpoint.CheckpointError,
                       match=r'%s holds no checkpoint \(no epoch-NNNN\.json file\), so there is '
                             r'nothing to resume' % re.escape(str(tmp_path))):
        checkpoint.read_checkpoint(str(tmp_path))
    with pytest.raises(checkpoint.CheckpointError, match=r'/nope does not exist'):
        checkpoint.read_checkpoint(str(tmp_path / 'nope'))


def test_parameters_of_another_network_do_not_fit(run_dir, two_cpus):
    net = nn.HybridSequential()
    net.add(nn.Dense(3))
    trainer = training.init_training(net, two_cpus, 0.1)
    record = checkpoint.read_checkpoint(run_dir)
    with pytest.raises(checkpoint.CheckpointError,
                       match=r'epoch-0002\.params does not fit this network'):
        checkpoint.restore(run_dir, record, net, trainer, two_cpus)


def test_lock_dir_refuses_a_path_under_a_file(tmp_path):
    (tmp_path / 'file').write_text('')
    with pytest.raises(ValueError, match=r'cannot write checkpoints to %s \(Not a directory\); '
                                         r'pass a folder you can write to'
                                         % re.escape(str(tmp_path / 'file' / 'ck'))):
        checkpoint.lock_dir(str(tmp_path / 'file' / 'ck'))
    os.symlink(str(tmp_path / 'nowhere'), str(tmp_path / 'dangling'))
    os.mkfifo(str(tmp_path / 'fifo'))
    for name, kind in (('file', 'a regular file'), ('dangling', 'a symbolic link'),
                       ('fifo', 'a FIFO (named pipe)')):
        with pytest.raises(ValueError) as e:
            checkpoint.lock_dir(str(tmp_path / name))
        assert str(e.value) == ('cannot write checkpoints to %s (it is %s, not a folder); pass '
                                'a folder you can write to' % (tmp_path / name, kind))
    assert os.path.islink(str(tmp_path / 'dangling')) and not os.path.exists(
        str(tmp_path / 'nowhere'))


@pytest.mark.parametrize('flags', [
    [],
    ['--num-gpus', '2', '--device-weights', '3,1', '--no-hybridize', '--quiet', '--loader',
     'gluon', '--seed', '7'],
    ['--balance', 'auto', '--warmup-steps', '5', '--kvstore', 'local', '--check-replicas', '2'],
    ['--sync-bn', '--num-gpus', '2', '--lr', '0.05', '--epochs', '7', '--device', 'cpu'],
    ['--model', 'lenet', '--dtype', 'bfloat16', '--train-limit', '10', '--test-limit', '5',
     '--data-dir', '-odd dir', '--batch-size', '3'],
    ['--metrics-json', '{tmp}/m.json', '--plot', '{tmp}/c.svg', '--save-params', '{tmp}/n.params'],
])
def test_the_recorded_command_line_parses_back_to_the_same_settings(tmp_path, flags):
    from gluon_mgpu.commands import train
    args = train.resolve([f.replace('{tmp}', str(tmp_path)) for f in flags] +
                          ['--checkpoint-dir', str(tmp_path / 'ck')])
    assert isinstance(args.seed, int)  # given, or chosen by a new run with --checkpoint-dir
    recorded = json.loads(json.dumps(train.recorded_argv(args)))  # as the JSON gives it back
    again = train.resolve(recorded)
    for key, value in vars(args).items():
        if key not in ('given', 'now', 'argv', 'checkpoint_dir'):
            assert getattr(again, key) == value, key
    assert '--checkpoint-dir' not in ' '.join(recorded)


# The command line: real processes, real signals.

def _cli(*args):
    return [sys.executable, '-m', 'gluon_mgpu.train', *args]


def _start(directory, *extra):
    return subprocess.Popen(_cli(*TINY, '--epochs', '3', '--checkpoint-dir', directory, *extra),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(path, proc, timeout=300):
    deadline = time.time() + timeout
    while not os.path.exists(path):
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline, 'no %s after %d s' % (path, timeout)
        time.sleep(0.02)


def test_a_run_killed_mid_epoch_resumes_to_bit_equal_parameters(tmp_path, data_dir):
    full, killed = str(tmp_path / 'full'), str(tmp_path / 'killed')
    proc = _start(killed, '--data-dir', data_dir)
    _wait_for(checkpoint.checkpoint_path(killed, 1, 'json'), proc)
    time.sleep(0.05)  # into epoch 2 (the assertion below checks it was not over)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    assert checkpoint.list_checkpoints(killed) == [1], 'the kill came after epoch 2 finished'

    resumed = subprocess.run(_cli('--checkpoint-dir', killed, '--resume'), capture_output=True,
                             text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    uninterrupted = subprocess.run(_cli(*TINY, '--epochs', '3', '--checkpoint-dir', full,
                                        '--data-dir', data_dir),
                                   capture_output=True, text=True, timeout=600)
    assert uninterrupted.returncode == 0, uninterrupted.stderr

    lines = resumed.stdout.splitlines()
    assert lines[:2] == ['running on: [cpu(0), cpu(1)]', 'resuming after epoch 1 of 3 from %s'
                         % checkpoint.checkpoint_path(killed, 1, 'json')]
    # Everything but the timings (the epoch lines' seconds, the summary's sec/epoch) is equal.
    untimed = lambda l: re.sub(r'(?<=time: )[\d.]+|[\d.]+(?= sec/epoch)', 'T', l)
    assert [untimed(l) for l in lines[2:]] == [
        untimed(l) for l in uninterrupted.stdout.splitlines()[2:]]
    for kind in checkpoint.KINDS:
        with open(checkpoint.checkpoint_path(full, 3, kind), 'rb') as a, \
                open(checkpoint.checkpoint_path(killed, 3, kind), 'rb') as b:
            assert a.read() == b.read(), kind
    a, b = (checkpoint.read_checkpoint(d) for d in (full, killed))
    for key in ('train_loss', 'train_acc', 'test_acc'):
        assert [h[key] for h in a['history']] == [h[key] for h in b['history']]
    assert a['argv'] == b['argv'] and '--seed=0' in a['argv']


def test_ctrl_c_stops_keeps_the_checkpoint_and_prints_the_resume_command(tmp_path, data_dir):
    directory = str(tmp_path / 'ck dir')
    proc = subprocess.Popen(_cli(*TINY, '--epochs', '1000', '--checkpoint-dir', directory,
                                 '--data-dir', data_dir),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for(checkpoint.checkpoint_path(directory, 1, 'json'), proc)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert 'Traceback' not in err
    done = checkpoint.list_checkpoints(directory)
    assert done == list(range(1, done[-1] + 1))
    assert err.splitlines()[-1] == (
        "python -m gluon_mgpu.train: interrupted (Ctrl-C); the checkpoint of epoch %d in %s is "
        "complete; to resume: python -m gluon_mgpu.train --checkpoint-dir '%s' --resume"
        % (done[-1], directory, directory))
    assert checkpoint.read_checkpoint(directory)['history'][0]['epoch'] == 1
    assert [n for n in os.listdir(directory) if n.startswith('.')] == ['.lock']  # kept


def test_a_diverging_run_stops_and_keeps_the_last_good_checkpoint(tmp_path, data_dir):
    directory = str(tmp_path / 'ck')
    result = subprocess.run(_cli(*TINY, '--epochs', '3', '--lr', '1000', '--checkpoint-dir',
                                 directory, '--data-dir', data_dir),
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 1
    assert 'Traceback' not in result.stderr
    message = result.stderr.splitlines()[-1]
    head = (r"python -m gluon_mgpu.train: error: the training loss became (nan|inf) at epoch "
            r"(\d), step (\d) with learning rate 1000: training diverged; start again with a "
            r"smaller learning rate, for example --lr 100, in a new --checkpoint-dir")
    match = re.fullmatch(head + (
        r", or continue from epoch (\d), the last checkpoint with a finite loss: "
        r"python -m gluon_mgpu.train --checkpoint-dir (\S+) --resume --lr 100"), message)
    # A checkpoint with a finite loss may already hold infinite running statistics: then no
    # resume is offered, since it would be refused.
    broken = re.fullmatch(head + (
        r" \(the checkpoint of epoch (\d) holds NaN or infinite values\)"), message)
    assert match or broken, message
    epoch, step = int((match or broken).group(2)), int((match or broken).group(3))
    kept = int((match or broken).group(4))
    assert epoch >= 2 and kept == epoch - 1 and 1 <= step <= 3
    assert checkpoint.list_checkpoints(directory) == list(range(1, epoch))
    record = checkpoint.read_checkpoint(directory)
    assert [h['epoch'] for h in record['history']] == list(range(1, epoch))
    assert all(np.isfinite(h['train_loss']) for h in record['history'])
    assert len(result.stdout.splitlines()) == epoch  # running on, then one line per good epoch
    assert (checkpoint.nonfinite(directory, record) is None) == bool(match)
    if match:
        assert match.group(5) == directory
        again = subprocess.run(_cli('--checkpoint-dir', directory, '--resume', '--lr', '100',
                                    '--data-dir', data_dir),
                               capture_output=True, text=True, timeout=600)
        assert again.returncode in (0, 1) and 'Traceback' not in again.stderr, again.stderr
    # Resuming the broken one anyway: the refusal says why and what to do.
    if broken:
        line = subprocess.run(_cli('--checkpoint-dir', directory, '--resume', '--lr', '100',
                                   '--data-dir', data_dir),
                              capture_output=True, text=True, timeout=600).stderr.splitlines()[-1]
        path, name = checkpoint.nonfinite(directory, record)
        assert line == (
            'python -m gluon_mgpu.train: error: --resume: %s: %s holds NaN or infinite values (the '
            'run diverged before it was saved, or the file was changed), so training cannot go on '
            'from it; %s' % (path, name, 'delete %s to resume from epoch %d instead' % (
                checkpoint.checkpoint_path(directory, kept, '*'), kept - 1) if kept > 1 else
                'start a new run with an empty --checkpoint-dir'))


def _refused(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and 'Traceback' not in err, err
    return err.strip()


def test_cli_records_the_run(cli_dir):
    record = checkpoint.read_checkpoint(cli_dir)
    assert record['network'] == 'resnet18(10)' and record['devices'] == ['cpu(0)', 'cpu(1)']
    assert record['argv'] == ['--num-gpus=2', '--batch-size=8', '--epochs=1', '--data-dir=%s'
                              % record['argv'][3].split('=', 1)[1], '--train-limit=16',
                              '--test-limit=8', '--seed=5']
    assert record['step'] == 'trainer.step(batch_size)'


def test_cli_chooses_and_records_a_seed_when_none_is_given(tmp_path, data_dir):
    directory = str(tmp_path / 'ck')
    assert main(['--batch-size', '8', '--train-limit', '8', '--test-limit', '8', '--epochs', '1',
                 '--data-dir', data_dir, '--checkpoint-dir', directory]) == 0
    seed = checkpoint.read_checkpoint(directory)['argv'][-1]
    assert re.fullmatch(r'--seed=\d+', seed) and 0 <= int(seed[7:]) < 2 ** 31


def test_cli_refuses_a_finished_run_and_other_settings(cli_dir, capsys):
    assert _refused(['--checkpoint-dir', cli_dir, '--resume'], capsys) == (
        'python -m gluon_mgpu.train: error: --resume: the run already finished all its 1 '
        'epochs; pass --epochs 2 or more to train it further')
    assert _refused(['--checkpoint-dir', cli_dir, '--resume', '--epochs', '2', '--batch-size',
                     '16', '--num-gpus', '1'], capsys) == (
        "python -m gluon_mgpu.train: error: --resume: cannot continue the run with other "
        "settings: --num-gpus 1 (the run used 2), --batch-size 16 (the run used 8); leave "
        "these flags out (the run's values are used) or start a new run in another "
        "--checkpoint-dir")
    assert _refused(['--checkpoint-dir', cli_dir], capsys) == (
        'python -m gluon_mgpu.train: error: --checkpoint-dir %s already holds the checkpoints '
        'of a run (up to epoch 1); add --resume to continue it, or pass another folder to '
        'start a new run' % cli_dir)


def test_cli_refuses_a_changed_replicas_file(cli_dir, capsys):
    states = checkpoint.checkpoint_path(cli_dir, 1, 'replicas')
    with open(states, 'r+b') as f:
        f.seek(-1, os.SEEK_END)
        last = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([last[0] ^ 1]))
    err = _refused(['--checkpoint-dir', cli_dir, '--resume', '--epochs', '2'], capsys)
    assert re.fullmatch(r'python -m gluon_mgpu.train: error: --resume: %s has sha256 \w{12}\.\.\., '
                        r'but the run recorded \w{12}\.\.\.: it was changed after the run wrote '
                        r'it, and only files the run wrote are loaded; start a new run with an '
                        r'empty --checkpoint-dir' % re.escape(states), err), err


def test_cli_refuses_another_network(cli_dir, capsys, monkeypatch):
    monkeypatch.setattr(gluon_mgpu.training, 'resnet18',
                        lambda num_classes, **kwargs: gluon_mgpu.resnet18(5))
    assert main(['--checkpoint-dir', cli_dir, '--resume', '--epochs', '2']) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1
    assert err.startswith('python -m gluon_mgpu.train: error: --resume: %s does not fit this '
                          'network (' % checkpoint.checkpoint_path(cli_dir, 1, 'params'))
    assert re.search(r'\(\S+\.weight has shape \(10, 512\) \(float32\) in the file but \(5, 0\) '
                     r'\(float32\) in the network\): the checkpoint was written for another '
                     r'network \(resnet18\(10\)\)$', err), err


def _tamper(cli_dir, **changes):
    path = checkpoint.checkpoint_path(cli_dir, 1, 'json')
    with open(path) as f:
        record = json.load(f)
    record.update(changes)
    with open(path, 'w') as f:
        json.dump(record, f)
    return path


def test_cli_refuses_a_checkpoint_of_another_program(cli_dir, capsys):
    path = _tamper(cli_dir, network='resnet50(1000)')
    assert _refused(['--checkpoint-dir', cli_dir, '--resume', '--epochs', '2'], capsys) == (
        'python -m gluon_mgpu.train: error: --resume: %s: network is "resnet50(1000)", but its '
        'command line trains resnet18(10); start a new run in an empty --checkpoint-dir' % path)


@pytest.mark.parametrize('argv,reason', [
    (['--num-gpus=2', '--lr=-1'], "argument --lr: --lr must be a finite number above 0, got "
                                  "'-1'"),
    (['--num-gpus=2', '--epochs=1.0'], "argument --epochs: --epochs expects a whole number, got "
                                       "'1.0'"),
    (['--num-gpus=%d' % 10 ** 400], 'argument --num-gpus: --num-gpus'),
    (['--model=vgg'], "argument --model: invalid choice: 'vgg'"),
])
def test_cli_refuses_a_recorded_command_line_the_command_refuses(cli_dir, capsys, argv, reason):
    path = _tamper(cli_dir, argv=argv)
    err = _refused(['--checkpoint-dir', cli_dir, '--resume', '--epochs', '2'], capsys)
    assert err.startswith('python -m gluon_mgpu.train: error: --resume: %s records the command '
                          'line ' % path), err
    assert reason in err and err.endswith('; start a new run in an empty --checkpoint-dir'), err


@pytest.mark.parametrize('argv', ['--num-gpus=2', ['x' * 5000], [1, 2], ['a\0b'], None])
def test_cli_refuses_a_recorded_command_line_that_is_none(cli_dir, capsys, argv):
    path = _tamper(cli_dir, argv=argv)
    err = _refused(['--checkpoint-dir', cli_dir, '--resume', '--epochs', '2'], capsys)
    assert err.startswith('python -m gluon_mgpu.train: error: --resume: %s: argv is ' % path)
    assert err.endswith(', not a command line; the file was not written by this version of '
                        'gluon_mgpu or was changed: start a new run in an empty --checkpoint-dir')


@pytest.mark.parametrize('fmt,what,commit', [
    (1, 'format 1, whose optimizer state is a pickle', '84e04e4'),
    (2, 'format 2, trained with the old step trainer.step(X.shape[0])', '03b47ec'),
    (3, 'format 3, with an optimizer state file', '452e568'),
])
def test_cli_refuses_an_older_format_naming_how_to_resume_it(cli_dir, capsys, fmt, what, commit):
    path = _tamper(cli_dir, format='gluon_mgpu checkpoint %d' % fmt)
    assert _refused(['--checkpoint-dir', cli_dir, '--resume', '--epochs', '2'], capsys) == (
        'python -m gluon_mgpu.train: error: --resume: %s was written by an older gluon_mgpu '
        '(%s); start a new run with another --checkpoint-dir, or resume it with gluon_mgpu at '
        'commit %s' % (path, what, commit))


def test_cli_refuses_to_resume_a_run_with_another_network_flag(cli_dir, capsys):
    assert _refused(['--checkpoint-dir', cli_dir, '--resume', '--epochs', '2', '--model',
                     'lenet'], capsys) == (
        'python -m gluon_mgpu.train: error: --resume: the run in %s trained resnet18(10), these '
        'flags train lenet(10); start a new run in another --checkpoint-dir' % cli_dir)


def test_cli_resumes_with_a_new_learning_rate_and_records_it(cli_dir, capsys, two_cpus):
    assert main(['--checkpoint-dir', cli_dir, '--resume', '--epochs', '2', '--lr', '0.05']) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1] == 'resuming after epoch 1 of 2 from %s' % checkpoint.checkpoint_path(
        cli_dir, 1, 'json')
    assert re.fullmatch(r'epoch 2, training time: \d+\.\d sec, test_acc \d\.\d\d', out[2])
    record = checkpoint.read_checkpoint(cli_dir)
    assert record['epoch'] == 2 and '--lr=0.05' in record['argv']
    assert {'--batch-size=8', '--seed=5', '--epochs=2'} <= set(record['argv'])
    assert [h['epoch'] for h in record['history']] == [1, 2]
    # 2 steps an epoch (16 images, batches of 8): the count goes on from the first epoch's 2,
    # as the uninterrupted run's (issue 65 family 7: MXNet restarted it at 0, recording 2).
    assert record['optimizer'] == {'lr': 0.05, 'num_update': 4}
    net = gluon_mgpu.resnet18(10)
    trainer = training.init_training(net, two_cpus, 1.0)
    checkpoint.restore(cli_dir, record, net, trainer, two_cpus)
    assert trainer.learning_rate == 0.05


def test_resume_parses_the_command_line_twice_with_one_parser(cli_dir, data_dir, monkeypatch,
                                                               capsys):
    # The flags given now and the line the checkpoint records: each parsed once, by one
    # parser, before MXNet and after it alike.
    import argparse
    from gluon_mgpu.commands import cli, train
    train.build_parser.cache_clear()
    built, parsed = [], []
    init, parse = cli.Parser.__init__, argparse.ArgumentParser.parse_known_args

    def counted_init(self, *a, **k):
        built.append(k.get('prog'))
        init(self, *a, **k)

    def counted_parse(self, args=None, namespace=None):
        parsed.append(list(args))
        return parse(self, args, namespace)
    monkeypatch.setattr(cli.Parser, '__init__', counted_init)
    monkeypatch.setattr(argparse.ArgumentParser, 'parse_known_args', counted_parse)
    given = ['--checkpoint-dir', cli_dir, '--resume', '--epochs', '2', '--data-dir', data_dir]
    assert train.main(given) == 0, capsys.readouterr().err
    assert built == [train.PROG]
    recorded = checkpoint.read_checkpoint(cli_dir, 1)['argv']
    assert parsed == [given, recorded]
    assert capsys.readouterr().out.splitlines()[-1].startswith('test acc: ')


def test_a_flag_given_now_that_excludes_a_recorded_one_is_argparses_line(tmp_path):
    # The merged line is checked as argparse checks one (cli.Parser lists the exclusive flags).
    from gluon_mgpu.commands import cli, train
    (tmp_path / 'epoch-0001.json').write_text(json.dumps(
        {'argv': ['--num-gpus=2', '--device-weights=3,1', '--seed=5']}))
    with pytest.raises(cli.UsageError) as e:
        train.resolve(['--resume', '--checkpoint-dir', str(tmp_path), '--balance', 'auto'])
    assert str(e.value) == 'argument --balance: not allowed with argument --device-weights'
    parser = train.build_parser()
    assert [a.option_strings[0] for a in parser.exclusive[0]] == ['--device-weights', '--balance']
    assert 'help' not in [a.dest for a in parser.settings] and parser.settings[0].dest == 'num_gpus'
