"""Horovod as the second engine of the chapter's step: ``--kvstore horovod`` under horovodrun,
on loopback with Gloo (docs/distributed.md). ``make test`` builds Horovod first."""
import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from mxnet import nd

from gluon_mgpu.commands.train import main as train_main
from gluon_mgpu.runtime import horovod

PY = sys.executable
HOROVODRUN = os.path.join(os.path.dirname(PY), 'horovodrun')
TRAIN = ['-m', 'gluon_mgpu.train', '--model', 'lenet', '--device', 'cpu', '--seed', '0',
         '--test-limit', '16', '--train-limit', '64', '--batch-size', '16']


def _env():
    return dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))


def _horovodrun(*args, np_=2, timeout=300):
    return subprocess.run([HOROVODRUN, '-np', str(np_), '-H', 'localhost:%d' % np_, '--gloo',
                           PY, *args], capture_output=True, text=True, timeout=timeout,
                          env=_env())


def _single(*args):
    run = subprocess.run([PY, *TRAIN, *args], capture_output=True, text=True, timeout=300,
                         env=_env())
    assert run.returncode == 0, run.stderr
    return run


def _max_diff(a, b):
    assert sorted(a) == sorted(b)
    return max(float(np.max(np.abs(a[k].asnumpy() - b[k].asnumpy()))) for k in a)


def _rank_lines(out, rank):
    return [line.split(':', 1)[1] for line in out.splitlines()
            if line.startswith('[%d]<stdout>:' % rank)]


@pytest.mark.slow  # a real horovodrun job: make test-slow builds Horovod
def test_two_processes_equal_one_process_on_two_devices(tmp_path):
    # Each process trains its device with the chapter's step; Horovod sums the gradients of
    # both, the Trainer divides by the global batch (rescale_grad = 1/2, then step(8)): the
    # parameters equal one process on 2 devices at the same global batch, as dist_sync's do.
    job = _horovodrun(*TRAIN, '--epochs', '2', '--kvstore', 'horovod', '--save-params',
                      str(tmp_path / 'hvd.params'))
    assert job.returncode == 0, job.stderr[-3000:]
    lines = _rank_lines(job.stdout, 0)
    assert lines[0] == 'running on: [cpu(0)] (worker 0 of 2, kvstore horovod)'
    assert [re.fullmatch(r'epoch \d, training time: \d+\.\d sec, test_acc (0|1)\.\d\d', line)
            is not None for line in lines[1:3]] == [True, True]
    assert _rank_lines(job.stdout, 1) == []  # only rank 0 prints
    assert not os.path.exists(tmp_path / 'hvd.rank1.params')  # and writes
    ours = nd.load(str(tmp_path / 'hvd.params'))
    _single('--epochs', '2', '--num-gpus', '2', '--save-params', str(tmp_path / 'one.params'))
    _single('--epochs', '2', '--num-gpus', '2', '--lr', '0.4',
            '--save-params', str(tmp_path / 'double.params'))
    assert len(ours) == 10
    assert _max_diff(ours, nd.load(str(tmp_path / 'one.params'))) <= 1e-6
    assert _max_diff(ours, nd.load(str(tmp_path / 'double.params'))) > 1e-3


JOINED_BY_NAME = '''
import gluon_mgpu
import mxnet as mx
from gluon_mgpu import init_training, new_network
trainer = init_training(new_network('lenet'), [mx.cpu(0)], 0.1, kvstore='horovod')
kv = trainer._kvstore_params['kvstore']  # created by the Trainer's first step otherwise
print('kvstore', kv.type, kv.rank, trainer.optimizer.rescale_grad)
'''


@pytest.mark.slow  # a real horovodrun job: make test-slow builds Horovod
def test_init_training_joins_a_horovod_job_by_name(tmp_path):
    # As kvstore='dist_sync' does: every process joins, the sum of 2 divided as 1 process's.
    script = tmp_path / 'joined.py'
    script.write_text(JOINED_BY_NAME)
    job = _horovodrun(str(script))
    assert job.returncode == 0, job.stderr[-3000:]
    ranks = [_rank_lines(job.stdout, r) for r in (0, 1)]
    assert ranks == [['kvstore horovod 0 0.5'], ['kvstore horovod 1 0.5']]


WRONG_DIVISOR = '''
import sys
import gluon_mgpu
import mxnet as mx
from mxnet import gluon, init, nd
from gluon_mgpu import data, training
from gluon_mgpu.runtime.horovod import HorovodKVStore
kv = HorovodKVStore()
train_iter, _ = data.load_data_fashion_mnist(16, train_limit=64, test_limit=16, seed=0)
train_iter.set_part(kv.num_workers, kv.rank)
mx.random.seed(0)
net = training.new_network('lenet')
net.initialize(init.Normal(sigma=training.INIT_SIGMA), ctx=[mx.cpu(0)])
# The book's Trainer, without dividing by the number of processes: step(8) divides the sum
# of both processes' gradients by one process's batch.
trainer = gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.2}, kvstore=kv)
loss = gluon.loss.SoftmaxCrossEntropyLoss()
for X, y in train_iter:
    training.train_batch(net, X, y, loss, trainer, [mx.cpu(0)])
nd.waitall()  # no process may leave while an allreduce of another is under way
if kv.rank == 0:
    net.save_parameters(sys.argv[1])
'''


@pytest.mark.slow  # a real horovodrun job: make test-slow builds Horovod
def test_the_wrong_divisor_is_twice_the_learning_rate(tmp_path):
    script = tmp_path / 'wrong.py'
    script.write_text(WRONG_DIVISOR)
    job = _horovodrun(str(script), str(tmp_path / 'wrong.params'))
    # Once in about 30 runs under the full suite, rank 0 ended with SIGABRT ('Aborted') and
    # horovodrun's traceback hid why: its own lines come first here.
    assert job.returncode == 0, '\n'.join(
        [line for line in job.stderr.splitlines() if line.startswith('[0]')][-40:]
        + ['...'] + job.stderr.splitlines()[-15:])
    wrong = nd.load(str(tmp_path / 'wrong.params'))
    _single('--epochs', '1', '--num-gpus', '2', '--save-params', str(tmp_path / 'one.params'))
    _single('--epochs', '1', '--num-gpus', '2', '--lr', '0.4',
            '--save-params', str(tmp_path / 'double.params'))
    assert _max_diff(wrong, nd.load(str(tmp_path / 'one.params'))) > 1e-3
    assert _max_diff(wrong, nd.load(str(tmp_path / 'double.params'))) <= 1e-6


@pytest.mark.slow  # a real horovodrun job: make test-slow builds Horovod
def test_checkpoints_and_resume_equal_an_uninterrupted_job(tmp_path):
    # The optimizer's state lives in every process (not on servers, as with dist_sync): rank 0
    # writes the checkpoints, every process resumes from them, bit for bit.
    whole = _horovodrun(*TRAIN, '--epochs', '2', '--kvstore', 'horovod', '--quiet',
                        '--checkpoint-dir', str(tmp_path / 'whole'))
    assert whole.returncode == 0, whole.stderr[-3000:]
    first = _horovodrun(*TRAIN, '--epochs', '1', '--kvstore', 'horovod', '--quiet',
                        '--checkpoint-dir', str(tmp_path / 'parts'))
    assert first.returncode == 0, first.stderr[-3000:]
    rest = _horovodrun('-m', 'gluon_mgpu.train', '--epochs', '2', '--resume',
                       '--checkpoint-dir', str(tmp_path / 'parts'))
    assert rest.returncode == 0, rest.stderr[-3000:]
    # --quiet, as the run recorded it: rank 0's summary line only.
    assert [re.fullmatch(r'test acc: (0|1)\.\d\d, \d+\.\d sec/epoch on \[cpu\(0\)\]', line)
            is not None for line in _rank_lines(rest.stdout, 0)] == [True]
    assert _rank_lines(rest.stdout, 1) == []
    a = nd.load(str(tmp_path / 'whole' / 'epoch-0002.params'))
    b = nd.load(str(tmp_path / 'parts' / 'epoch-0002.params'))
    assert _max_diff(a, b) == 0.0
    # A job of another size cannot continue it: its batches and learning rate would differ.
    three = _horovodrun('-m', 'gluon_mgpu.train', '--epochs', '3', '--resume',
                        '--checkpoint-dir', str(tmp_path / 'parts'), np_=1)
    assert three.returncode != 0
    assert ('the run in %s trained with 2 processes, this job has 1' % (tmp_path / 'parts')
            in three.stdout + three.stderr)
    # Nor can one process continue it: outside horovodrun its settings are refused in one line.
    alone = subprocess.run([PY, '-m', 'gluon_mgpu.train', '--epochs', '3', '--resume',
                            '--checkpoint-dir', str(tmp_path / 'parts')],
                           capture_output=True, text=True, timeout=300, env=_env())
    assert alone.returncode == 2
    assert alone.stderr.splitlines()[-1].startswith(
        'python -m gluon_mgpu.train: error: --resume: %s records the command line %s, which the '
        'command refuses (--kvstore horovod: HOROVOD_RANK is not set, so this process was not '
        'started by horovodrun' % (tmp_path / 'parts' / 'epoch-0002.json', ' '.join(json.load(
            open(tmp_path / 'parts' / 'epoch-0002.json'))['argv'])))
    # And a one-process run cannot go on as a job.
    _single('--epochs', '1', '--quiet', '--checkpoint-dir', str(tmp_path / 'solo'))
    job = _horovodrun('-m', 'gluon_mgpu.train', '--epochs', '2', '--resume', '--kvstore',
                      'horovod', '--checkpoint-dir', str(tmp_path / 'solo'))
    assert job.returncode == 1
    # Both ranks refuse it; horovodrun stops the job at the first that exits, so the other may
    # have been ended (SIGTERM) before it printed: the line comes from one rank or the other.
    refusal = ('<stderr>:python -m gluon_mgpu.train: error: --resume: the run in %s trained '
               'with --kvstore device; leave --kvstore out to continue it, or start a new run in '
               'another --checkpoint-dir\n' % (tmp_path / 'solo'))
    assert '[0]' + refusal in job.stderr or '[1]' + refusal in job.stderr, job.stderr[-3000:]
    # The rank that was ended says so in one line, without a traceback of ours. A rank ended
    # after its refusal, while its process was exiting, has no handler left: horovodrun's shell
    # (sh -c 'env ... python ...') then reports the signal with its own 'Terminated'.
    ours = [line for line in job.stderr.splitlines() if re.match(r'\[\d\]<stderr>:', line)]
    refused = set()
    for line in ours:
        rank, text = line.split(':', 1)
        if text == refusal.split(':', 1)[1].rstrip('\n'):
            refused.add(rank)
        else:
            assert (text.startswith('python -m gluon_mgpu.train: terminated (SIGTERM) ')
                    or (text == 'Terminated' and rank in refused)), ours


def _descendants(pid):
    children = {}
    for entry in os.listdir('/proc'):
        if entry.isdigit():
            try:
                stat = open('/proc/%s/stat' % entry).read()
            except OSError:
                continue
            ppid = int(stat.rsplit(')', 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


@pytest.mark.slow  # a real horovodrun job: make test-slow builds Horovod
def test_a_killed_worker_ends_the_job_within_the_bound_naming_it(tmp_path):
    # horovodrun watches its processes: when one dies it stops the others and exits 1, with a
    # line naming the dead one.
    job = subprocess.Popen([HOROVODRUN, '-np', '2', '-H', 'localhost:2', '--gloo', PY, *TRAIN,
                            '--kvstore', 'horovod', '--epochs', '1000', '--train-limit', '2000'],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env=_env(), start_new_session=True)
    try:
        for line in job.stdout:
            if re.match(r'\[0\]<stdout>:epoch 1,', line):
                break  # both processes have joined and stepped together
        ranks = {}
        for pid in _descendants(job.pid):
            try:
                environ = open('/proc/%d/environ' % pid, 'rb').read().split(b'\0')
            except OSError:
                continue
            for item in environ:
                if item.startswith(b'HOROVOD_RANK='):
                    ranks[int(item.split(b'=')[1])] = pid
        assert sorted(ranks) == [0, 1], ranks
        os.kill(ranks[1], signal.SIGKILL)
        start = time.monotonic()
        out, err = job.communicate(timeout=120)
        seconds, code = time.monotonic() - start, job.returncode
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    assert code == 1
    assert seconds < 30
    assert 'Process 1 exit with status code 137.\n' in out
    # Its traceback names the first exit it saw: rank 1's, or rank 0's when the survivor left
    # first (with its line below).
    assert 'Horovod detected that one or more processes exited with non-zero status' in err
    # The survivor says in one line why it stopped: the job ended under it, or horovodrun's
    # SIGTERM came first. Horovod's C++ logger, on its background thread, writes its error to an
    # unbuffered std::cerr piece by piece ('[', then the time, ...), so our line, one write, can
    # land right after its '[' (seen once: '[0]<stderr>:[python -m ...'): look for it after the
    # rank's prefix and at most that one character.
    ours = [line for line in err.splitlines()
            if re.match(r'\[0\]<stderr>:\[?python -m gluon_mgpu\.train: ', line)]
    assert len(ours) == 1, err
    said = ours[0][ours[0].index('python -m'):]
    assert said.startswith(('python -m gluon_mgpu.train: error: another process of the Horovod '
                            'job stopped, so this one cannot go on (horovodrun names it); nothing '
                            'was saved',
                            'python -m gluon_mgpu.train: terminated (SIGTERM)')), ours
    time.sleep(0.5)
    for pid in ranks.values():
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def _horovod_found(monkeypatch, found):
    """Make ``job_env`` see Horovod installed (``found``) or not, whatever this environment
    holds: the fast suite runs before ``make horovod-install``, the slow one after it."""
    import importlib.machinery
    import importlib.util
    find_spec = importlib.util.find_spec
    spec = importlib.machinery.ModuleSpec('horovod', None) if found else None
    monkeypatch.setattr(importlib.util, 'find_spec',
                        lambda name, *a: spec if name == 'horovod' else find_spec(name, *a))


def test_without_horovodrun_it_is_one_line_and_exit_2(capsys, data_dir, monkeypatch):
    _horovod_found(monkeypatch, True)
    monkeypatch.delenv('HOROVOD_RANK', raising=False)
    assert train_main(['--kvstore', 'horovod', '--data-dir', data_dir]) == 2
    assert capsys.readouterr().err == (
        'python -m gluon_mgpu.train: error: --kvstore horovod: HOROVOD_RANK is not set, so '
        'this process was not started by horovodrun; start the job with horovodrun -np 2 -H '
        'localhost:2 --gloo python -m gluon_mgpu.train --kvstore horovod ...\n')

    # A digit to str.isdigit that int() refuses: the same line, not a traceback.
    monkeypatch.setenv('HOROVOD_RANK', '\u00b2')
    assert horovod.worker_rank() is None
    assert train_main(['--kvstore', 'horovod', '--data-dir', data_dir]) == 2
    assert capsys.readouterr().err.startswith(
        "python -m gluon_mgpu.train: error: --kvstore horovod: HOROVOD_RANK is '\u00b2', so "
        'this process was not started by horovodrun; ')

    # A size of 0 said "--batch-size 0 is smaller than --num-gpus 1" (no --batch-size given),
    # and with one given, divided by it (unexpected ZeroDivisionError).
    for rank, size in (('0', '0'), ('2', '2')):
        monkeypatch.setenv('HOROVOD_RANK', rank)
        monkeypatch.setenv('HOROVOD_SIZE', size)
        for given in ([], ['--batch-size', '8', '--lr', '0.1']):
            assert train_main(['--kvstore', 'horovod', '--data-dir', data_dir] + given) == 2
            assert capsys.readouterr().err == (
                "python -m gluon_mgpu.train: error: --kvstore horovod: HOROVOD_RANK=%s and "
                "HOROVOD_SIZE=%s: a rank must be below the job's size, so this process was not "
                "started by horovodrun; start the job with horovodrun -np 2 -H localhost:2 "
                "--gloo python -m gluon_mgpu.train --kvstore horovod ...\n" % (rank, size))


def test_without_horovod_installed_the_line_names_the_install(capsys, data_dir, monkeypatch):
    _horovod_found(monkeypatch, False)
    assert train_main(['--kvstore', 'horovod', '--data-dir', data_dir]) == 2
    assert capsys.readouterr().err == (
        'python -m gluon_mgpu.train: error: --kvstore horovod: Horovod is not installed in '
        'this environment; build it with make horovod-install\n')
    with pytest.raises(ImportError, match=r'^Horovod is not installed in this environment '):
        monkeypatch.setitem(sys.modules, 'horovod.mxnet', None)
        horovod.import_horovod()
