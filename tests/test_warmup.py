"""The learning-rate warmup option (events.LinearWarmup, --warmup-steps)."""
import json
import os
import subprocess
import sys

import pytest

from gluon_mgpu.handlers.events import LinearWarmup

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROG = 'python -m gluon_mgpu.train'


class _Trainer:
    def __init__(self, lr):
        self.learning_rate = lr
        self.set = []

    def set_learning_rate(self, lr):
        self.learning_rate = lr
        self.set.append(lr)


class _Run:
    def __init__(self, lr, epoch=1, train_iter=()):
        self.trainer, self.epoch, self.train_iter = _Trainer(lr), epoch, train_iter


def _steps(warmup, run, n):
    warmup.train_begin(run)
    warmup.epoch_begin(run)
    rates = []
    for _ in range(n):
        warmup.batch_begin(run, batch=None)
        rates.append(run.trainer.learning_rate)
    return rates


def test_the_rate_rises_linearly_then_stays():
    run = _Run(0.2)
    assert _steps(LinearWarmup(4), run, 6) == pytest.approx([0.05, 0.1, 0.15, 0.2, 0.2, 0.2])
    # Set once more at the end of the ramp, then left alone (a later change by others stays).
    assert len(run.trainer.set) == 5


def test_a_resumed_run_continues_the_ramp_where_it_stood():
    run = _Run(0.3, epoch=2, train_iter=[None] * 4)  # 4 steps per epoch: epoch 2 starts at 5
    assert _steps(LinearWarmup(6), run, 3) == pytest.approx([0.25, 0.3, 0.3])
    with pytest.raises(ValueError, match='a run resumed after epoch 1 cannot continue its '
                                         'warmup: train_iter has no len'):
        _steps(LinearWarmup(6), _Run(0.3, epoch=2, train_iter=iter([])), 1)


@pytest.mark.parametrize('steps', [0, -1, 2.5, True, '3'])
def test_steps_must_be_a_whole_number(steps):
    with pytest.raises(ValueError, match='steps must be a whole number >= 1, got'):
        LinearWarmup(steps)


def _train(*args):
    return subprocess.run([sys.executable, '-m', 'gluon_mgpu.train', *args],
                          capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join(
                              p for p in (ROOT, os.environ.get('PYTHONPATH')) if p)))


@pytest.mark.parametrize('args,line', [
    (['--warmup-steps', '0'], PROG + ': error: argument --warmup-steps: --warmup-steps must '
                                     'be at least 1, got 0; for example --warmup-steps 2 (see '
                                     '--help)'),
    (['--warmup-steps', '5', '--parallel', 'layers', '--num-gpus', '2'],
     PROG + ': error: --warmup-steps works with --parallel data only; drop it or pass '
            '--parallel data'),
])
def test_bad_warmup_flags_are_one_line(args, line):
    result = _train(*args)
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1] == line
    assert 'Traceback' not in result.stderr


def test_a_checkpoint_records_the_warmup_and_a_resume_keeps_it(tmp_path):
    directory = str(tmp_path / 'run')
    common = ('--model', 'lenet', '--train-limit', '64', '--test-limit', '32', '--batch-size',
              '16', '--device', 'cpu', '--quiet', '--checkpoint-dir', directory)
    first = _train(*common, '--epochs', '1', '--seed', '3', '--warmup-steps', '6')
    assert first.returncode == 0, first.stderr
    with open(os.path.join(directory, 'epoch-0001.json')) as f:
        assert '--warmup-steps=6' in json.load(f)['argv']
    other = _train(*common, '--resume', '--epochs', '2', '--warmup-steps', '3')
    assert other.returncode == 2
    assert other.stderr.splitlines()[-1] == (
        PROG + ': error: --resume: cannot continue the run with other settings: '
        '--warmup-steps 3 (the run used 6); leave these flags out (the run\'s values are used) '
        'or start a new run in another --checkpoint-dir')
    same = _train(*common, '--resume', '--epochs', '2')
    assert same.returncode == 0, same.stderr
    with open(os.path.join(directory, 'epoch-0002.json')) as f:
        assert '--warmup-steps=6' in json.load(f)['argv']
