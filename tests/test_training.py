import types

import d2lzh
import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon, init, nd
from mxnet.gluon import loss as gloss, nn

import gluon_mgpu
from gluon_mgpu import data
from conftest import max_abs_diff


def _replica_max_diff(net, devices):
    worst = 0.0
    for p in net.collect_params().values():
        first = p.data(devices[0])
        for d in devices[1:]:
            worst = max(worst, max_abs_diff(p.data(d), first))
    return worst


def _small_cnn():
    """A network without BatchNorm: its gradient does not depend on how a batch is split."""
    net = nn.HybridSequential()
    net.add(nn.Conv2D(4, kernel_size=3, activation='relu'), nn.MaxPool2D(2),
            nn.Dense(16, activation='relu'), nn.Dense(10))
    return net


def _one_step(devices, X, y, lr=0.5):
    mx.random.seed(11)
    net = _small_cnn()
    net.initialize(init.Normal(sigma=0.1), ctx=devices)
    trainer = gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': lr})
    stats = gluon_mgpu.train_epoch(net, [(X, y)], gloss.SoftmaxCrossEntropyLoss(), trainer,
                                   devices)
    return net, stats


@pytest.fixture(scope='module')
def real_batch():
    images, labels = data.load_fashion_mnist_arrays('train')
    return nd.array(data.to_tensor(images[:12])), nd.array(labels[:12], dtype='int32')


@pytest.mark.parametrize('n,sizes', [(10, [4, 3, 3]), (12, [4, 4, 4]), (2, [1, 1, 1])])
def test_split_batch_sizes_and_idle_devices(n, sizes):
    devices = [mx.cpu(i) for i in range(3)]
    X, y = nd.arange(n).reshape((n, 1)), nd.arange(n)
    Xs, ys, weights = gluon_mgpu.split_batch(X, y, devices)
    assert [x.shape[0] for x in Xs] == sizes
    assert [x.context for x in Xs] == devices and [v.context for v in ys] == devices
    assert np.array_equal(np.concatenate([x.asnumpy()[:, 0] for x in Xs])[:n], np.arange(n))
    idle = [w is not None for w in weights]
    assert idle == [i >= n for i in range(3)]
    for w in weights:
        if w is not None:
            assert w.asnumpy().tolist() == [[0.0]]


@pytest.mark.parametrize('ndev,batch', [(2, 12), (3, 10), (2, 7), (3, 1)],
                         ids=['even', 'uneven-3', 'uneven-2', 'fewer-examples-than-devices'])
def test_data_parallel_step_equals_one_device(ndev, batch, real_batch):
    X, y = real_batch[0][:batch], real_batch[1][:batch]
    single, s1 = _one_step([mx.cpu(0)], X, y)
    devices = [mx.cpu(i) for i in range(ndev)]
    multi, sn = _one_step(devices, X, y)
    assert _replica_max_diff(multi, devices) == 0.0
    for p1, pn in zip(single.collect_params().values(), multi.collect_params().values()):
        assert max_abs_diff(pn.data(devices[-1]), p1.data(mx.cpu(0))) <= 1e-6
    assert sn['examples'] == s1['examples'] == batch
    assert abs(sn['train_loss'] - s1['train_loss']) <= 1e-6
    assert sn['train_acc'] == s1['train_acc']


def test_a_step_changes_the_parameters(real_batch):
    # Guards the equivalence test above: it would pass trivially if nothing were updated.
    mx.random.seed(11)
    net = _small_cnn()
    net.initialize(init.Normal(sigma=0.1), ctx=[mx.cpu(0)])
    net(real_batch[0])
    before = [p.data().copy() for p in net.collect_params().values()]
    after, _ = _one_step([mx.cpu(0)], *real_batch)
    changed = [max_abs_diff(a.data(), b) for a, b in zip(after.collect_params().values(), before)]
    assert min(changed) > 1e-4


def test_resnet18_replicas_stay_identical(two_cpus, real_batch):
    mx.random.seed(5)
    net = gluon_mgpu.resnet18(10)
    net.initialize(init.Normal(sigma=0.01), ctx=two_cpus)
    X, y = real_batch[0][:8], real_batch[1][:8]
    Xs = gluon.utils.split_and_load(X, two_cpus)
    for X_d in Xs:
        net(X_d)
    assert _replica_max_diff(net, two_cpus) == 0.0
    trainer = gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.1})
    conv = net[0].weight
    start = conv.data(two_cpus[0]).copy()
    for _ in range(3):
        gluon_mgpu.train_epoch(net, [(X, y)], gloss.SoftmaxCrossEntropyLoss(), trainer,
                               two_cpus)
    assert max_abs_diff(conv.data(two_cpus[0]), start) > 0
    trained = [p for p in net.collect_params().values() if p.grad_req != 'null']
    assert len(trained) == 76
    for p in trained:
        assert max_abs_diff(p.data(two_cpus[1]), p.data(two_cpus[0])) == 0.0, p.name


def test_evaluate_accuracy_equals_d2lzh_and_uses_all_devices(real_batch):
    mx.random.seed(6)
    net = _small_cnn()
    net.initialize(init.Normal(sigma=0.1), ctx=[mx.cpu(0), mx.cpu(1), mx.cpu(2)])
    X, y = real_batch
    batches = [(X[:6], y[:6]), (X[6:12], y[6:12])]
    ours = gluon_mgpu.evaluate_accuracy(batches, net, [mx.cpu(0), mx.cpu(1), mx.cpu(2)])
    theirs = d2lzh.evaluate_accuracy(batches, net, [mx.cpu(0)])
    assert ours == theirs
    expected = (net(X.as_in_context(mx.cpu(1))).argmax(axis=1).asnumpy() ==
                y.asnumpy()).mean()
    assert ours == pytest.approx(expected, abs=1e-12)
    # Uneven: 7 and 5 examples over 3 devices still count every example once.
    uneven = [(X[:7], y[:7]), (X[7:], y[7:])]
    assert gluon_mgpu.evaluate_accuracy(uneven, net, [mx.cpu(0), mx.cpu(1), mx.cpu(2)]) == ours


def test_train_records_history_and_uses_the_real_batch_sizes(capsys, data_dir):
    train_iter, test_iter = gluon_mgpu.load_data_fashion_mnist(
        5, data_dir=data_dir, train_limit=12, test_limit=7, seed=1)
    devices = [mx.cpu(0), mx.cpu(1), mx.cpu(2)]
    history = gluon_mgpu.train(_small_cnn(), train_iter, test_iter, devices, lr=0.1,
                               num_epochs=2, seed=0)
    lines = capsys.readouterr().out.splitlines()
    assert [h['epoch'] for h in history] == [1, 2]
    for h, line in zip(history, lines):
        assert set(h) == {'epoch', 'seconds', 'train_loss', 'train_acc', 'test_acc',
                          'images_per_sec'}
        assert line == 'epoch %d, training time: %.1f sec, test_acc %.2f' % (
            h['epoch'], h['seconds'], h['test_acc'])
        assert h['images_per_sec'] == pytest.approx(12 / h['seconds'])
        assert h['test_acc'] in {k / 7 for k in range(8)}
        assert h['train_acc'] in {k / 12 for k in range(13)}
        assert 0 < h['train_loss'] < 5
    assert len(lines) == 2


def test_train_is_silent_when_asked(capsys, data_dir):
    train_iter, test_iter = gluon_mgpu.load_data_fashion_mnist(
        4, data_dir=data_dir, train_limit=4, test_limit=4, seed=1)
    gluon_mgpu.train(_small_cnn(), train_iter, test_iter, [mx.cpu(0)], num_epochs=1,
                     verbose=False)
    assert capsys.readouterr().out == ''


@pytest.mark.slow
def test_resnet18_learns_on_real_data(two_cpus, data_dir):
    """The chapter's network on 2 devices, a real slice: clearly above chance (0.10)."""
    train_iter, test_iter = gluon_mgpu.load_data_fashion_mnist(
        32, data_dir=data_dir, train_limit=1000, test_limit=500, seed=0)
    history = gluon_mgpu.train(gluon_mgpu.resnet18(10), train_iter, test_iter, two_cpus,
                               lr=0.1, num_epochs=2, seed=0, verbose=False)
    # 500 held-out images: chance gives 0.10 +- 0.013, so 0.2 is far outside it.
    assert history[-1]['test_acc'] >= 0.2
    assert history[-1]['train_loss'] < history[0]['train_loss']


def test_train_calls_the_step_and_epoch_hooks(data_dir):
    train_iter, test_iter = gluon_mgpu.load_data_fashion_mnist(
        4, data_dir=data_dir, train_limit=10, test_limit=4, seed=1)
    steps, epochs = [], []
    history = gluon_mgpu.train(_small_cnn(), train_iter, test_iter, [mx.cpu(0), mx.cpu(1)],
                               num_epochs=2, verbose=False,
                               on_step=lambda e, s: steps.append((e, s)),
                               on_epoch=epochs.append)
    assert steps == [(1, 1), (1, 2), (1, 3), (2, 1), (2, 2), (2, 3)]
    assert epochs == history


def test_hybridized_training_equals_imperative_training(two_cpus, data_dir):
    nets = []
    for hybridize, loader in ((False, 'gluon'), (True, 'array')):
        train_iter, test_iter = gluon_mgpu.load_data_fashion_mnist(
            8, data_dir=data_dir, train_limit=24, test_limit=8, seed=2, loader=loader)
        net = gluon_mgpu.resnet18(10)
        if hybridize:
            net.hybridize(static_alloc=True)
        history = gluon_mgpu.train(net, train_iter, test_iter, two_cpus, lr=0.1, num_epochs=1,
                                   seed=0, verbose=False)
        nets.append((net, history))
    (book, h_book), (fast, h_fast) = nets
    assert h_fast[0]['train_loss'] == pytest.approx(h_book[0]['train_loss'], abs=1e-6)
    assert h_fast[0]['test_acc'] == h_book[0]['test_acc']
    for p_book, p_fast in zip(book.collect_params().values(), fast.collect_params().values()):
        assert max_abs_diff(p_fast.data(two_cpus[1]), p_book.data(two_cpus[1])) <= 1e-6


@pytest.mark.parametrize('n,weights,sizes', [
    (16, [3, 1], [12, 4]),
    (10, [1, 1, 1], [4, 3, 3]),
    (7, [1, 1], [4, 3]),
    (5, [100, 1], [4, 1]),
    (3, [1e-9, 1, 1e9], [1, 1, 1]),
    (10, [0.1, 0.2, 0.7], [1, 2, 7]),
    (11, [2, 1, 1], [5, 3, 3]),  # shares 5.5, 2.75, 2.75: the two .75 get the 2 left
])
def test_slice_sizes_follow_the_weights(n, weights, sizes):
    assert gluon_mgpu.training.slice_sizes(n, weights) == sizes


@pytest.mark.parametrize('weights,match', [
    ([3, 0], r'device weights must be finite numbers above 0, got \[3, 0\]'),
    ([3, float('nan')], r'finite numbers above 0'),
    ([3, True], r'finite numbers above 0'),
    ([3, 1, 1], r'3 device weights for 2 devices; give one weight per device'),
])
def test_bad_device_weights(weights, match, two_cpus):
    X, y = nd.zeros((4, 1)), nd.zeros(4)
    with pytest.raises(ValueError, match=match):
        gluon_mgpu.split_batch(X, y, two_cpus, weights)


def test_slice_sizes_needs_one_example_per_device():
    with pytest.raises(ValueError, match=r'2 examples cannot give each of 3 devices at least '
                                         r'one; use a batch of 3 or more'):
        gluon_mgpu.training.slice_sizes(2, [1, 1, 1])


def test_weighted_split_covers_the_batch_in_order(two_cpus):
    X, y = nd.arange(16).reshape((16, 1)), nd.arange(16)
    Xs, ys, weights = gluon_mgpu.split_batch(X, y, two_cpus, [3, 1])
    assert [x.shape[0] for x in Xs] == [12, 4] and [v.shape[0] for v in ys] == [12, 4]
    assert [x.context for x in Xs] == two_cpus and [v.context for v in ys] == two_cpus
    assert np.concatenate([x.asnumpy()[:, 0] for x in Xs]).tolist() == list(range(16))
    assert weights == [None, None]
    # Fewer examples than devices: the idle-device rule wins, as for an even split.
    _, _, idle = gluon_mgpu.split_batch(X[:1], y[:1], two_cpus, [3, 1])
    assert idle[0] is None and idle[1].asnumpy().tolist() == [[0.0]]


@pytest.mark.parametrize('weights', [[3, 1], [1, 5], [1, 1e6]])
def test_weighted_step_equals_the_even_step(weights, two_cpus, real_batch):
    X, y = real_batch

    def step(device_weights):
        mx.random.seed(11)
        net = _small_cnn()
        net.initialize(init.Normal(sigma=0.1), ctx=two_cpus)
        trainer = gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.5})
        stats = gluon_mgpu.train_epoch(net, [(X, y)], gloss.SoftmaxCrossEntropyLoss(),
                                       trainer, two_cpus, device_weights=device_weights)
        return net, stats

    even, s_even = step(None)
    weighted, s_weighted = step(weights)
    assert _replica_max_diff(weighted, two_cpus) == 0.0
    for pe, pw in zip(even.collect_params().values(), weighted.collect_params().values()):
        assert max_abs_diff(pw.data(two_cpus[0]), pe.data(two_cpus[0])) <= 1e-6
    assert abs(s_weighted['train_loss'] - s_even['train_loss']) <= 1e-6
    assert s_weighted['train_acc'] == s_even['train_acc'] and s_weighted['examples'] == 12


def test_train_with_device_weights_equals_even_training(two_cpus, data_dir):
    nets = []
    for weights in (None, [3, 1]):
        train_iter, test_iter = gluon_mgpu.load_data_fashion_mnist(
            8, data_dir=data_dir, train_limit=24, test_limit=8, seed=4)
        net = gluon_mgpu.model.lenet()
        history = gluon_mgpu.train(net, train_iter, test_iter, two_cpus, lr=0.9, num_epochs=1,
                                   seed=0, verbose=False, device_weights=weights)
        nets.append((net, history))
    (even, h_even), (weighted, h_weighted) = nets
    assert h_weighted[0]['test_acc'] == h_even[0]['test_acc']
    for pe, pw in zip(even.collect_params().values(), weighted.collect_params().values()):
        assert max_abs_diff(pw.data(two_cpus[1]), pe.data(two_cpus[1])) <= 1e-6


def test_measure_device_speeds_leaves_the_network_as_it_was(two_cpus, real_batch):
    mx.random.seed(3)
    net = gluon_mgpu.resnet18(10)
    net.initialize(init.Normal(sigma=0.01), ctx=two_cpus)
    X, y = real_batch[0][:4], real_batch[1][:4]
    net(X.as_in_context(two_cpus[0]))
    before = {p.name: [a.copy() for a in p.list_data()]
              for p in net.collect_params().values()}
    speeds = gluon_mgpu.training.measure_device_speeds(net, X, y, two_cpus, repeats=1,
                                                       min_seconds=0)
    assert len(speeds) == 2 and all(s > 0 for s in speeds)
    running = [p for p in net.collect_params().values() if p.grad_req == 'null']
    assert len(running) == 34  # running mean and variance of the 17 BatchNorm layers
    for p in net.collect_params().values():
        for a, b in zip(p.list_data(), before[p.name]):
            assert max_abs_diff(a, b) == 0.0, p.name
    # Guard: a training pass does move the statistics (MXNet 1.x updates them in backward),
    # so the restore above was needed.
    with autograd.record():
        out = net(X.as_in_context(two_cpus[0]))
    out.backward()
    assert max(max_abs_diff(p.data(two_cpus[0]), before[p.name][0]) for p in running) > 0


def test_kvstore_reaches_the_trainer_and_local_equals_device(two_cpus, data_dir, monkeypatch):
    seen = []

    class Recording(gluon.Trainer):
        def __init__(self, *args, **kwargs):
            seen.append(kwargs.get('kvstore'))
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(gluon_mgpu.training.gluon, 'Trainer', Recording)
    nets = []
    for kvstore in ('device', 'local'):
        train_iter, test_iter = gluon_mgpu.load_data_fashion_mnist(
            8, data_dir=data_dir, train_limit=16, test_limit=8, seed=4)
        net = gluon_mgpu.model.lenet()
        gluon_mgpu.train(net, train_iter, test_iter, two_cpus, lr=0.9, num_epochs=1, seed=0,
                         verbose=False, kvstore=kvstore)
        nets.append(net)
    assert seen == ['device', 'local']
    for pd, pl in zip(nets[0].collect_params().values(), nets[1].collect_params().values()):
        assert max_abs_diff(pl.data(two_cpus[0]), pd.data(two_cpus[0])) <= 1e-6


def _loss_turning(value, from_step, ndev):
    """The chapter's loss, times ``value`` (nan or inf) from step ``from_step`` on."""
    base, calls = gloss.SoftmaxCrossEntropyLoss(), [0]

    def loss(*args):
        calls[0] += 1
        step = (calls[0] - 1) // ndev + 1
        return base(*args) * value if step >= from_step else base(*args)
    return loss


@pytest.mark.parametrize('value,from_step', [(float('nan'), 2), (float('inf'), 3),
                                             (float('nan'), 1)])
def test_train_epoch_names_the_step_where_the_loss_stops_being_finite(value, from_step,
                                                                      real_batch, two_cpus):
    X, y = real_batch
    batches = [(X[i:i + 4], y[i:i + 4]) for i in range(0, 12, 4)]
    mx.random.seed(1)
    net = _small_cnn()
    trainer = gluon_mgpu.training.init_training(net, two_cpus, 0.3)
    with pytest.raises(gluon_mgpu.training.LossNotFiniteError) as info:
        gluon_mgpu.train_epoch(net, batches, _loss_turning(value, from_step, 2), trainer,
                               two_cpus)
    e = info.value
    assert (e.step, e.lr, e.epoch) == (from_step, 0.3, None)
    assert str(e.loss) == str(value)
    assert str(e) == ('the training loss became %s at step %d with learning rate 0.3: training '
                      'diverged; use a smaller learning rate' % (value, from_step))


def test_a_loss_turning_nan_at_the_last_step_is_caught(real_batch, two_cpus):
    X, y = real_batch
    net = _small_cnn()
    trainer = gluon_mgpu.training.init_training(net, two_cpus, 0.3, seed=1)
    with pytest.raises(gluon_mgpu.training.LossNotFiniteError, match='at step 3 '):
        gluon_mgpu.train_epoch(net, [(X[:4], y[:4])] * 3,
                               _loss_turning(float('nan'), 3, 2), trainer, two_cpus)


def test_train_names_the_epoch_of_a_diverging_loss(monkeypatch, data_dir, two_cpus):
    train_iter, test_iter = gluon_mgpu.load_data_fashion_mnist(
        4, data_dir=data_dir, train_limit=8, test_limit=4, seed=1)
    # Two steps per epoch: step 4 overall is epoch 2, step 2.
    monkeypatch.setattr(gluon_mgpu.training, 'gloss', types.SimpleNamespace(
        SoftmaxCrossEntropyLoss=lambda: _loss_turning(float('nan'), 4, 2)))
    epochs = []
    with pytest.raises(gluon_mgpu.training.LossNotFiniteError,
                       match=r'^the training loss became nan at epoch 2, step 2 with learning '
                             r'rate 0\.1: '):
        gluon_mgpu.train(_small_cnn(), train_iter, test_iter, two_cpus, lr=0.1, num_epochs=3,
                         verbose=False, on_epoch=epochs.append)
    assert [r['epoch'] for r in epochs] == [1]


def test_train_continues_from_start_epoch_with_the_given_trainer(data_dir, two_cpus):
    train_iter, test_iter = gluon_mgpu.load_data_fashion_mnist(
        4, data_dir=data_dir, train_limit=8, test_limit=4, seed=1)
    net = _small_cnn()
    trainer = gluon_mgpu.training.init_training(net, two_cpus, 0.1, seed=0)
    net(nd.zeros((1, 1, 28, 28), ctx=two_cpus[0]))
    before = net[0].weight.data(two_cpus[0]).copy()
    earlier = [{'epoch': 1}, {'epoch': 2}]
    steps = []
    history = gluon_mgpu.train(net, train_iter, test_iter, two_cpus, lr=99.0, num_epochs=3,
                               seed=5, verbose=False, trainer=trainer, start_epoch=2,
                               history=earlier, on_step=lambda e, s: steps.append((e, s)))
    assert [h['epoch'] for h in history] == [1, 2, 3] and history[:2] == earlier
    assert earlier == [{'epoch': 1}, {'epoch': 2}]
    assert steps == [(3, 1), (3, 2)]
    assert train_iter.epoch == 3  # set_epoch(2), then one pass
    assert trainer.learning_rate == 0.1  # the given trainer: lr=99 is not used
    assert max_abs_diff(net[0].weight.data(two_cpus[0]), before) > 0  # not re-initialized...
    assert max_abs_diff(net[0].weight.data(two_cpus[0]), before) < 0.5  # ...but trained


def test_train_gives_the_batch_hook_sizes_and_the_running_loss(data_dir):
    train_iter, test_iter = gluon_mgpu.load_data_fashion_mnist(
        4, data_dir=data_dir, train_limit=10, test_limit=4, seed=1)
    seen = []

    def on_batch(epoch, step, examples, running_loss):
        seen.append((epoch, step, examples, running_loss()))

    history = gluon_mgpu.train(_small_cnn(), train_iter, test_iter, [mx.cpu(0), mx.cpu(1)],
                               num_epochs=2, verbose=False, on_batch=on_batch)
    assert [s[:3] for s in seen] == [(1, 1, 4), (1, 2, 4), (1, 3, 2),
                                     (2, 1, 4), (2, 2, 4), (2, 3, 2)]
    # After the last batch the running loss is the epoch's loss.
    assert seen[2][3] == history[0]['train_loss'] and seen[5][3] == history[1]['train_loss']
    assert all(s[3] > 0 for s in seen)
