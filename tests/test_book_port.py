"""The port is the book: the chapter's own loop and network against the package's step."""
import mxnet as mx
import numpy as np
import pytest

import gluon_mgpu
from gluon_mgpu.commands import compare


@pytest.fixture(scope='module')
def equality(data_dir):
    train_iter, test_iter = gluon_mgpu.load_data_fashion_mnist(
        64, data_dir=data_dir, train_limit=64 * 6, test_limit=500, seed=3)
    # lr 0.2: the book's 2-device setting.
    return compare.port_equality([mx.cpu(0), mx.cpu(1)], list(train_iter), list(test_iter),
                                 lr=0.2)


def test_books_loop_and_ours_are_bit_equal_on_two_devices(equality):
    assert equality['steps'] == 6
    # 76 trained arrays and 34 BatchNorm running statistics (17 layers) on each device.
    assert equality['arrays'] == (76, 34)
    assert equality['loss'] == 0.0
    assert equality['trained'] == 0.0
    assert equality['running'] == 0.0


def test_test_accuracy_is_the_books_on_device_0(equality):
    book, ours = equality['test_acc']
    assert ours == book
    assert book in {k / 500 for k in range(501)}


def test_port_equality_refuses_batches_the_books_split_cannot_take():
    X = mx.nd.zeros((3, 1, 28, 28))
    with pytest.raises(ValueError, match=r'multiple of the 2 devices; got batches of \[3\]'):
        compare.port_equality([mx.cpu(0), mx.cpu(1)], [(X, mx.nd.zeros(3))], [], lr=0.2)


# Whole epochs with a short last batch: the chapter's train (In [6]) as printed, fed the same
# batches as gluon_mgpu.train and the train command, on 1 and 2 devices.
EPOCHS, TEST_LIMIT, SEED = 2, 200, 7


def _slice(num_devices):
    """(batch_size, lr, train_limit): 4 full batches and a short one of 16 per epoch."""
    batch_size = 32 * num_devices
    return batch_size, 0.1 * num_devices, 4 * batch_size + 16


def _arrays(net, devices):
    """Every parameter and running statistic of ``net`` on every device, in order."""
    return [p.data(d).asnumpy() for p in net.collect_params().values() for d in devices]


@pytest.fixture(scope='module', params=[1, 2], ids=['1-device', '2-devices'])
def whole_epochs(request, data_dir, tmp_path_factory):
    import json
    import os
    import subprocess
    import sys
    from types import SimpleNamespace

    import d2lzh
    from gluon_mgpu import training
    from gluon_mgpu.handlers.checkpoint import checkpoint_path
    from gluon_mgpu.handlers.events import BatchEnd, EpochEnd

    n = request.param
    devices = [mx.cpu(i) for i in range(n)]
    batch_size, lr, train_limit = _slice(n)
    steps = 5

    def loaders(size):
        return gluon_mgpu.load_data_fashion_mnist(size, data_dir=data_dir,
                                                  train_limit=train_limit,
                                                  test_limit=TEST_LIMIT, seed=SEED)

    book = {'losses': [], 'arrays': []}
    theirs = d2lzh.resnet18(10)

    def book_step(ls):
        book['losses'].append([l.asnumpy() for l in ls])
        if len(book['losses']) % steps == 0:
            book['arrays'].append(_arrays(theirs, devices))

    gb = SimpleNamespace(load_data_fashion_mnist=loaders,
                         evaluate_accuracy=d2lzh.evaluate_accuracy)
    mx.random.seed(SEED)
    book['test_acc'] = compare.book_train(n, batch_size, lr, theirs, gb, devices, EPOCHS,
                                          on_step=book_step)

    class Watch(BatchEnd, EpochEnd):
        def __init__(self):
            self.losses, self.arrays, self.device0_acc, self.sizes = [], [], [], []

        def batch_end(self, estimator, *args, **kwargs):
            self.losses.append([l.asnumpy() for l in kwargs['loss']])
            self.sizes.append(kwargs['batch'][0].shape[0])
            return False

        def epoch_end(self, estimator, *args, **kwargs):
            self.arrays.append(_arrays(estimator.net, devices))
            self.device0_acc.append(training.evaluate_accuracy(
                estimator.test_iter, estimator.net, devices[:1]))
            return False

    watch = Watch()
    ours = training.new_network('resnet18')
    train_iter, test_iter = loaders(batch_size)
    mx.random.seed(SEED)
    history = gluon_mgpu.train(ours, train_iter, test_iter, devices, lr=lr, num_epochs=EPOCHS,
                               event_handlers=[watch])

    folder = str(tmp_path_factory.mktemp('run'))
    command = [sys.executable, '-m', 'gluon_mgpu.train', '--num-gpus', str(n), '--device',
               'cpu', '--batch-size', str(batch_size), '--lr', str(lr), '--epochs',
               str(EPOCHS), '--seed', str(SEED), '--train-limit', str(train_limit),
               '--test-limit', str(TEST_LIMIT), '--data-dir', data_dir, '--checkpoint-dir',
               folder, '--quiet']
    # The same OpenMP threads as this process: another count sums in another order. (Alone, the
    # command would give each of 2 simulated devices half the cores.)
    env = {k: v for k, v in os.environ.items() if k != 'GLUON_MGPU_CHOSE'}
    env['OMP_NUM_THREADS'] = str(gluon_mgpu.thread_settings()['omp_num_threads'])
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, env=env)
    assert done.returncode == 0, done.stderr
    checkpoints = []
    names = list(ours._collect_params_with_prefix())
    for epoch in range(1, EPOCHS + 1):
        record = json.load(open(checkpoint_path(folder, epoch, 'json')))
        params = mx.nd.load(checkpoint_path(folder, epoch, 'params'))
        replicas = mx.nd.load(checkpoint_path(folder, epoch, 'replicas')) or {}  # none: []
        by_name = [[replicas.get('%s@%d' % (name, i), params[name]).asnumpy()
                    for i in range(n)] for name in names]
        checkpoints.append({'record': record, 'arrays': [a for per in by_name for a in per]})
    assert os.path.isdir(folder)
    return {'n': n, 'book': book, 'watch': watch, 'history': history,
            'checkpoints': checkpoints, 'steps': steps}


def _equal(a, b):
    return len(a) == len(b) and all(x.dtype == y.dtype and np.array_equal(x, y)
                                    for x, y in zip(a, b))


def test_every_epoch_ends_with_a_short_batch(whole_epochs):
    n = whole_epochs['n']
    assert whole_epochs['watch'].sizes == ([32 * n] * 4 + [16]) * EPOCHS


def test_the_books_train_and_ours_take_the_same_steps(whole_epochs):
    book, watch = whole_epochs['book'], whole_epochs['watch']
    assert len(book['losses']) == len(watch.losses) == whole_epochs['steps'] * EPOCHS
    for theirs, ours in zip(book['losses'], watch.losses):
        assert _equal(theirs, ours)


def test_every_weight_and_running_statistic_is_the_books_after_every_epoch(whole_epochs):
    book, watch = whole_epochs['book'], whole_epochs['watch']
    n = whole_epochs['n']
    # ResNet-18: 76 trained arrays and 34 running statistics, on each device.
    assert len(book['arrays'][0]) == 110 * n
    for epoch in range(EPOCHS):
        assert _equal(book['arrays'][epoch], watch.arrays[epoch])
        assert _equal(book['arrays'][epoch], whole_epochs['checkpoints'][epoch]['arrays'])


def test_each_epochs_test_accuracy_is_the_books(whole_epochs):
    book, watch = whole_epochs['book'], whole_epochs['watch']
    assert watch.device0_acc == book['test_acc']
    assert len(book['test_acc']) == EPOCHS
    ours = [r['test_acc'] for r in whole_epochs['history']]
    command = whole_epochs['checkpoints'][-1]['record']['history']
    assert [r['test_acc'] for r in command] == ours
    assert [r['train_loss'] for r in command] == [r['train_loss'] for r in
                                                  whole_epochs['history']]
    if whole_epochs['n'] == 1:  # one device: our evaluation is the book's
        assert ours == book['test_acc']


def test_the_checkpoints_name_the_books_step(whole_epochs):
    for checkpoint in whole_epochs['checkpoints']:
        assert checkpoint['record']['step'] == 'trainer.step(batch_size)'
        assert checkpoint['record']['format'] == 'gluon_mgpu checkpoint 3'
