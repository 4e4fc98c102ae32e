"""Data parallelism from scratch: the book's example, and one step equal to Gluon's Trainer."""
import d2lzh
import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon, nd

from gluon_mgpu.parallel import scratch
from parallel_helpers import batch

DEVICES = {2: [mx.cpu(0), mx.cpu(1)], 3: [mx.cpu(0), mx.cpu(1), mx.cpu(2)]}


def test_allreduce_gives_the_books_numbers():
    data = [nd.ones((1, 2), ctx=mx.cpu(i)) * (i + 1) for i in range(2)]
    assert [d.asnumpy().tolist() for d in data] == [[[1, 1]], [[2, 2]]]
    scratch.allreduce(data)
    assert [d.asnumpy().tolist() for d in data] == [[[3, 3]], [[3, 3]]]
    assert [d.context for d in data] == DEVICES[2]


def test_allreduce_over_three_devices():
    data = [nd.ones((2,), ctx=d) * (i + 1) for i, d in enumerate(DEVICES[3])]
    scratch.allreduce(data)
    assert [d.asnumpy().tolist() for d in data] == [[6, 6]] * 3
    assert [d.context for d in data] == DEVICES[3]


def test_get_params_puts_data_and_gradient_on_the_device():
    params = scratch.init_params()
    copy = scratch.get_params(params, mx.cpu(1))
    assert [p.shape for p in copy] == [p.shape for p in params]
    assert {p.context for p in copy} == {p.grad.context for p in copy} == {mx.cpu(1)}
    assert all(np.array_equal(a.asnumpy(), b.asnumpy()) for a, b in zip(copy, params))


def test_split_batch_and_its_refusal():
    X, y = batch(6)
    Xs, ys = scratch.split_batch(X, y, DEVICES[3])
    assert [(x.shape[0], x.context) for x in Xs] == [(2, d) for d in DEVICES[3]]
    assert [v.context for v in ys] == DEVICES[3]
    with pytest.raises(ValueError, match=r'a batch of 6 examples cannot be split evenly over 4 '
                                         r'devices; use a batch size that is a multiple of 4'):
        scratch.split_batch(X, y, [mx.cpu(i) for i in range(4)])
    with pytest.raises(ValueError, match=r'X has 6 examples but y has 5 labels'):
        scratch.split_batch(X, y[:5], DEVICES[3])


def test_sgd_is_the_books():
    mine, theirs = [nd.ones((3,)) * 2], [nd.ones((3,)) * 2]
    for p in mine + theirs:
        p.attach_grad()
        p.grad[:] = 4
    scratch.sgd(mine, 0.5, 8)
    d2lzh.sgd(theirs, 0.5, 8)
    assert mine[0].asnumpy().tolist() == theirs[0].asnumpy().tolist() == [1.75] * 3


@pytest.mark.parametrize('n', [2, 3])
def test_one_step_equals_gluons_trainer(n, tmp_path):
    """Same operations, so the same numbers: the book's step and the chapter's Trainer."""
    devices = DEVICES[n]
    mx.random.seed(0)
    params = scratch.init_params()
    model = scratch.ScratchDataParallel(devices, lr=0.1, params=params)
    path = str(tmp_path / 'start.params')
    scratch.save_params(params, path)
    net = scratch.gluon_lenet()
    net.load_parameters(path, ctx=devices)
    trainer = gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.1})
    X, y = batch(6)
    Xs, ys = gluon.utils.split_and_load(X, devices), gluon.utils.split_and_load(y, devices)
    with autograd.record():
        ls = [scratch.loss(net(a), b) for a, b in zip(Xs, ys)]
    for l in ls:
        l.backward()
    trainer.step(6)
    ours = model.train_batch(X, y).asscalar()
    assert abs(ours - sum(l.sum().asscalar() for l in ls)) <= 1e-6 * ours
    gluon_params = net._collect_params_with_prefix()
    for k, device in enumerate(devices):
        for name, p in zip(scratch.PARAM_NAMES, model.device_params[k]):
            assert p.context == p.grad.context == device
            assert np.abs(p.asnumpy() - gluon_params[name].data(device).asnumpy()).max() <= 1e-6
    # allreduce leaves the same summed gradient on every device.
    for i in range(len(params)):
        first = model.device_params[0][i].grad.asnumpy()
        assert all(np.array_equal(first, model.device_params[k][i].grad.asnumpy())
                   for k in range(n))


def test_params_file_round_trip(tmp_path):
    mx.random.seed(0)
    model = scratch.ScratchDataParallel(DEVICES[2], lr=0.1)
    X, y = batch(4)
    model.train_batch(X, y)
    path = str(tmp_path / 'lenet.params')
    model.save_parameters(path)
    net = scratch.gluon_lenet()
    net.load_parameters(path, ctx=mx.cpu(0))  # an ordinary Gluon file
    assert np.abs(net(X).asnumpy() - model(X).asnumpy()).max() <= 1e-6
    other = scratch.ScratchDataParallel(DEVICES[2], lr=0.1)
    other.load_parameters(path)
    for k, device in enumerate(DEVICES[2]):
        for a, b in zip(other.device_params[k], model.device_params[0]):
            assert a.context == device and np.array_equal(a.asnumpy(), b.asnumpy())


def test_bad_params_files_are_refused(tmp_path):
    path = str(tmp_path / 'bad.params')
    nd.save(path, {'0.weight': nd.zeros((20, 1, 3, 3))})
    with pytest.raises(ValueError, match=r"holds \['0.weight'\], not the parameters 0.weight, "
                                         r"0.bias, .* of the book's LeNet"):
        scratch.load_params(path)
    arrays = {n: nd.zeros(s) for n, s in zip(scratch.PARAM_NAMES, scratch.SHAPES)}
    arrays['4.weight'] = nd.zeros((128, 801))
    nd.save(path, arrays)
    with pytest.raises(ValueError, match=r'4.weight has shape \(128, 801\), the book.s LeNet '
                                         r'\(128, 800\)'):
        scratch.load_params(path)


def test_summary():
    model = scratch.ScratchDataParallel(DEVICES[2], lr=0.1)
    s = model.summary(nd.zeros((8, 1, 28, 28)))
    size = 4 * (20 * 9 + 20 + 50 * 20 * 25 + 50 + 128 * 800 + 128 + 10 * 128 + 10)
    assert s['parameter_bytes'] == [size, size] and size == 516272
    # Per image: 20x26x26 + 20x13x13 + 50x9x9 + 50x4x4 + 128 + 10 floats; 4 images per device.
    assert s['activation_bytes'] == [4 * 4 * (13520 + 3380 + 4050 + 800 + 128 + 10)] * 2
    assert s['copied_bytes_per_step'] == 2 * size
