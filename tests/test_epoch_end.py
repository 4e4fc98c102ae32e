"""benchmarks/epoch_end.py: the replay of an epoch from a saved state is the run's own epoch, bit
for bit, and says so when it is not."""
import json
import os
import subprocess
import sys

import mxnet as mx

from gluon_mgpu.handlers.checkpoint import checkpoint_path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, 'benchmarks'))
import epoch_end  # noqa: E402

import pytest  # noqa: E402

# A test of a script in benchmarks/ (the project measuring itself): make bench-test.
pytestmark = pytest.mark.bench

# 56 = 3 x 16 + 8: each epoch ends with a short batch, as Fashion-MNIST's do.
RUN = ['--num-gpus', '2', '--device', 'cpu', '--batch-size', '16', '--lr', '0.2',
       '--train-limit', '56', '--test-limit', '32', '--seed', '4', '--epochs', '2', '--quiet']


def _replay(folder, output, data_dir):
    return subprocess.run([sys.executable, os.path.join(ROOT, 'benchmarks', 'epoch_end.py'),
                           '--checkpoint-dir', folder, '--from-epoch', '1', '--test-limit', '32',
                           '--every', '2', '--last', '1', '--output', output,
                           '--data-dir', data_dir],
                          capture_output=True, text=True, timeout=600)


def _train_and_replay(run, folder, output, data_dir):
    """Train ``run`` (the train command's flags) into ``folder``, replay its epoch 2 into
    ``output``; the replay's JSON."""
    # The command chooses its own threads (the replay chooses the same from the record).
    done = subprocess.run([sys.executable, '-m', 'gluon_mgpu.train', *run, '--data-dir', data_dir,
                           '--checkpoint-dir', folder], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    replayed = _replay(folder, output, data_dir)
    assert replayed.returncode == 0, replayed.stderr
    with open(output) as f:
        return json.load(f)


def test_probe_steps():
    assert epoch_end.probe_steps(118, 10, 3) == [10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 110,
                                                 116, 117, 118]
    assert epoch_end.probe_steps(4, 0, 1) == [4]
    assert epoch_end.probe_steps(4, 2, 9) == [1, 2, 3, 4]


def test_the_replay_of_a_saved_epoch_is_the_runs_epoch_bit_for_bit(tmp_path, data_dir):
    folder, output = str(tmp_path / 'run'), str(tmp_path / 'replay.json')
    found = _train_and_replay(RUN, folder, output, data_dir)
    with open(checkpoint_path(folder, 2, 'json')) as f:
        saved = json.load(f)
    params = len(saved_params(folder))
    assert found['replay'] == {'copies': 2 * params, 'max_abs_difference': 0.0,
                               'bit_equal': True}
    assert (found['from_epoch'], found['epoch'], found['steps']) == (1, 2, 4)
    assert [p['step'] for p in found['probes']] == [2, 4]
    # What the command printed for epoch 2 (the test set split over the devices) ...
    assert found['test_acc_split'] == saved['history'][1]['test_acc']
    # ... and the book's measure after the last step, probed on the same 32 images.
    assert found['probes'][-1]['acc_device0'] == found['test_acc_device0']

    # A saved weight changed by 1: the replay no longer matches, and says by how much.
    arrays = saved_params(folder)
    name = next(k for k in sorted(arrays) if arrays[k].ndim == 4)  # a convolution's weight
    arrays[name][0, 0, 0, 0] += 1.0
    mx.nd.save(checkpoint_path(folder, 2, 'params'), arrays)
    replayed = _replay(folder, output, data_dir)
    assert replayed.returncode == 1, replayed.stderr
    with open(output) as f:
        found = json.load(f)
    assert found['replay']['bit_equal'] is False
    assert abs(found['replay']['max_abs_difference'] - 1.0) < 1e-6


def test_an_output_that_is_not_a_regular_file_is_refused_before_training(tmp_path):
    folder = tmp_path / 'run'
    folder.mkdir()
    (folder / 'epoch-0001.json').write_text(json.dumps({'devices': ['cpu(0)', 'cpu(1)']}))
    link = tmp_path / 'link.json'
    link.symlink_to(tmp_path / 'elsewhere.json')
    for output in ('/dev/null', str(tmp_path), str(link)):
        done = subprocess.run([sys.executable, os.path.join(ROOT, 'benchmarks', 'epoch_end.py'),
                               '--checkpoint-dir', str(folder), '--from-epoch', '1',
                               '--output', output], capture_output=True, text=True, timeout=120)
        assert done.returncode == 2
        [line] = done.stderr.splitlines()  # one line: no usage, no traceback
        assert line.startswith('benchmarks/epoch_end.py: error: argument --output: --output %s: '
                               % output), line
    assert not (tmp_path / 'elsewhere.json').exists()


def test_a_checkpoint_the_replay_cannot_use_is_one_line_before_training(tmp_path, data_dir):
    folder = str(tmp_path / 'run')
    done = subprocess.run([sys.executable, '-m', 'gluon_mgpu.train', *RUN, '--epochs', '1',
                           '--data-dir', data_dir, '--checkpoint-dir', folder],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    path = checkpoint_path(folder, 1, 'json')
    with open(path) as f:
        saved = json.load(f)

    def refused(changes, *flags):
        with open(path, 'w') as f:
            f.write(changes if isinstance(changes, str) else json.dumps(dict(saved, **changes)))
        done = subprocess.run([sys.executable, os.path.join(ROOT, 'benchmarks', 'epoch_end.py'),
                               '--checkpoint-dir', folder, '--from-epoch', '1',
                               '--data-dir', data_dir, *flags],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 2, done.stderr
        [line] = done.stderr.splitlines()
        return line.replace('benchmarks/epoch_end.py: error: ', '')

    # argparse would print the train command's help and exit 0.
    assert refused({'argv': ['--help']}) == (
        '%s: argv holds "--help", which is not a setting a run records; the file was not written '
        'by this version of gluon_mgpu or was changed: start a new run in an empty '
        '--checkpoint-dir' % path)
    assert refused({'optimizer': {'lr': 'x', 'num_update': 4}}).startswith(
        '%s: optimizer is {"lr": "x", "num_update": 4}, not a learning rate' % path)
    assert refused({'argv': saved['argv'] + ['--warmup-steps=5']}).startswith(
        "%s is not a run the replay trains as it was (--warmup-steps 5)" % path)
    assert refused('[' * 100000 + ']' * 100000) == (
        "--checkpoint-dir %s --from-epoch 1: %s cannot be read (it is nested too deeply); give a "
        "folder of the book table's runs and one of its saved epochs" % (folder, path))
    assert refused({}, '--test-limit', '0') == (
        'argument --test-limit: --test-limit must be between 1 and 10000, got 0; for example '
        '--test-limit 2 (see --help)')


def saved_params(folder):
    return mx.nd.load(checkpoint_path(folder, 2, 'params'))


def test_a_one_device_run_replays_and_a_file_it_cannot_compare_with_is_refused_first(
        tmp_path, data_dir):
    # A 1-device run saves no replicas (an empty dict, which MXNet loads back as a list): the
    # replay of such a run once failed after its epoch, losing it.
    folder, output = str(tmp_path / 'run'), str(tmp_path / 'replay.json')
    run = RUN[:]
    run[run.index('--num-gpus') + 1] = '1'
    assert _train_and_replay(run, folder, output, data_dir)['replay'] == {
        'copies': len(saved_params(folder)), 'max_abs_difference': 0.0, 'bit_equal': True}
    # A file of epoch 2 it cannot compare with: one line, before the epoch is trained again.
    os.remove(output)
    params_path, replicas_path = (checkpoint_path(folder, 2, k) for k in ('params', 'replicas'))
    arrays = saved_params(folder)
    name = sorted(arrays)[0]
    kept = arrays[name]

    def refused(path):
        replayed = _replay(folder, output, data_dir)
        assert replayed.returncode == 2
        assert 'epoch 2' not in replayed.stdout and not os.path.exists(output)
        assert replayed.stderr.splitlines()[-2] == (  # after the no-GPU warning
            'warning: no GPU found, so training runs on the CPU as [cpu(0)]')
        line = replayed.stderr.splitlines()[-1]
        start, end = 'benchmarks/epoch_end.py: error: %s: ' % path, (
            '; the file was not written by this version of gluon_mgpu or was changed: start a '
            'new run in an empty --checkpoint-dir')
        assert line.startswith(start) and line.endswith(end), line
        return line[len(start):-len(end)]

    del arrays[name]
    mx.nd.save(params_path, arrays)
    assert refused(params_path) == 'it lacks %s' % name
    arrays[name] = mx.nd.zeros((1,))
    mx.nd.save(params_path, arrays)
    assert refused(params_path) == (
        'it holds %s of shape (1,), which is no parameter of the network' % name)
    arrays[name] = kept
    mx.nd.save(params_path, arrays)
    mx.nd.save(replicas_path, [mx.nd.zeros((1,))])
    assert refused(replicas_path) == 'it holds arrays without names'
    with open(replicas_path, 'wb') as f:
        f.write(b'not arrays')
    assert refused(replicas_path).startswith('it cannot be loaded (')


import signal  # noqa: E402

import pytest  # noqa: E402


@pytest.mark.parametrize('signum,code,name', [(signal.SIGTERM, 143, 'SIGTERM'),
                                              (signal.SIGHUP, 129, 'SIGHUP')])
def test_45_8_sigterm_and_sighup_end_it_with_one_line_and_their_code(signum, code, name,
                                                                    tmp_path, data_dir):
    # The docstring promises 143 and 129; the process died silently, killed by the signal.
    folder = str(tmp_path / 'run')
    done = subprocess.run([sys.executable, '-m', 'gluon_mgpu.train', *RUN, '--epochs', '1',
                           '--data-dir', data_dir, '--checkpoint-dir', folder],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    replay = subprocess.Popen([sys.executable, os.path.join(ROOT, 'benchmarks', 'epoch_end.py'),
                               '--checkpoint-dir', folder, '--from-epoch', '1', '--data-dir',
                               data_dir], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, preexec_fn=lambda: [signal.signal(s, signal.SIG_DFL)
                                                             for s in (signal.SIGINT,
                                                                       signal.SIGHUP)])
    warning = replay.stderr.readline()  # get_devices': MXNet is loaded, the replay starts
    assert warning.startswith('warning: no GPU found'), warning
    replay.send_signal(signum)
    out, err = replay.communicate(timeout=120)
    assert replay.returncode == code, err  # not -signum: killed silently
    assert err == 'benchmarks/epoch_end.py: terminated (%s)\n' % name
