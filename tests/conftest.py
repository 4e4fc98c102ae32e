# Before MXNet starts: `make test` runs two workers on two cores, and OpenMP's threads, spinning
# while they wait for work, take the core the other worker computes on. Waiting asleep changes
# no number, only who has the core (docs/testing.md).
import os
os.environ.setdefault('OMP_WAIT_POLICY', 'PASSIVE')

# gluon_mgpu first: it chooses MXNet's thread count, which MXNet reads once, on import.
import gluon_mgpu  # noqa: E402,I001

import json
import shutil
import signal
import warnings

import mxnet as mx
import numpy as np
import pytest

# A test run started in the background (`make test &`, nohup) inherits SIGINT ignored, and then
# neither this process nor the commands it starts would see a Ctrl-C. The tests of Ctrl-C need
# what a terminal gives: Python's own handler here, the default in every child.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def autograd_state_left_as_found():
    """MXNet's autograd state (recording, training) holds for the whole thread: one test that
    left it on would make the next test's forward passes update BatchNorm's statistics (in one
    two-worker run, test_training's replica test found its replicas 0.071 apart after a forward
    pass outside autograd.record()). A test that leaves it changed is named in a warning, which
    the run's summary shows, and the state is put back for the next."""
    yield
    from mxnet import autograd
    state = (autograd.is_recording(), autograd.is_training())
    if state != (False, False):
        autograd.set_recording(False)
        autograd.set_training(False)
        warnings.warn('this test left autograd recording=%s, training=%s' % state)


@pytest.fixture
def two_cpus():
    """Two distinct MXNet contexts on one CPU: real replicas, real split, real reduction."""
    return [mx.cpu(0), mx.cpu(1)]


@pytest.fixture(scope='session')
def data_dir():
    """The real Fashion-MNIST folder. Missing data is an error here, never a skip:
    `make test` installs it (apt-get install dataset-fashion-mnist)."""
    return gluon_mgpu.find_data_dir()


def max_abs_diff(a, b):
    return float(np.max(np.abs(a.asnumpy().astype(np.float64) - b.asnumpy())))


@pytest.fixture(scope='session')
def cli_run(tmp_path_factory, data_dir):
    """One epoch of the real train command into a checkpoint folder, once per test run; tests
    that change a checkpoint take a copy (``cli_dir``)."""
    from gluon_mgpu.commands.train import main
    directory = str(tmp_path_factory.mktemp('cli') / 'ck')
    assert main(['--num-gpus', '2', '--batch-size', '8', '--train-limit', '16', '--test-limit',
                 '8', '--epochs', '1', '--seed', '5', '--data-dir', data_dir,
                 '--checkpoint-dir', directory]) == 0
    return directory


@pytest.fixture
def cli_dir(cli_run, tmp_path):
    """A copy of ``cli_run``'s checkpoint folder, this test's to change."""
    directory = str(tmp_path / 'ck')
    shutil.copytree(cli_run, directory)
    return directory


# The chapter's train as printed beside ours, on tiny batches: 4 of 8 per device and a short
# one of 4, twice. tests/test_book_port.py and tests/test_compare.py read the same run.
TINY_PER_DEVICE, TINY_TEST_LIMIT = 8, 40


@pytest.fixture(scope='session')
def book_equality(data_dir, tmp_path_factory):
    """``equality(n)``: ``compare.epoch_equality`` on ``n`` CPU devices with tiny batches, and the
    train command's checkpoints of the same run (each device's arrays after every epoch and
    the JSON record) under ``'checkpoints'``; each ``n`` is trained once per test run."""
    from gluon_mgpu.commands import compare
    from gluon_mgpu.commands.train import main
    from gluon_mgpu.handlers.checkpoint import checkpoint_path
    runs = {}

    def equality(n):
        if n in runs:
            return runs[n]
        devices = [mx.cpu(i) for i in range(n)]
        found = compare.epoch_equality(devices, data_dir, test_limit=TINY_TEST_LIMIT,
                                       per_device=TINY_PER_DEVICE)
        folder = str(tmp_path_factory.mktemp('book-equality-%d' % n) / 'ck')
        # In this process, so with its OpenMP threads: another count sums in another order.
        assert main(['--num-gpus', str(n), '--device', 'cpu', '--batch-size',
                     str(found['batch_size']), '--lr', str(found['lr']), '--epochs',
                     str(compare.EQUALITY_EPOCHS), '--seed', str(compare.EQUALITY_SEED),
                     '--train-limit', str(found['train_limit']), '--test-limit',
                     str(found['test_limit']), '--data-dir', data_dir, '--checkpoint-dir',
                     folder, '--quiet']) == 0
        names = list(gluon_mgpu.training.new_network()._collect_params_with_prefix())
        found['checkpoints'] = []
        for epoch in range(1, compare.EQUALITY_EPOCHS + 1):
            params = mx.nd.load(checkpoint_path(folder, epoch, 'params'))
            # Only the copies that differ from the .params file (device 0's); none: a list.
            replicas = mx.nd.load(checkpoint_path(folder, epoch, 'replicas')) or {}
            with open(checkpoint_path(folder, epoch, 'json')) as f:
                record = json.load(f)
            found['checkpoints'].append({'record': record, 'arrays': [
                replicas.get('%s@%d' % (name, i), params[name]).asnumpy()
                for name in names for i in range(n)]})
        found['n'] = n
        runs[n] = found
        return found

    return equality
