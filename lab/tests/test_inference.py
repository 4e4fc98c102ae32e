"""lab/fold.py's fold_batchnorm: the same predictions without BatchNorm layers, the
original intact."""
import os
import sys

import d2lzh
import mxnet as mx
import numpy as np
import pytest
from mxnet import gluon, nd
from mxnet.gluon import nn
from mxnet.gluon.nn.basic_layers import _BatchNorm

from gluon_mgpu import evaluate_accuracy, init_training, load_data_fashion_mnist, new_network, \
    train_batch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # lab/
from fold import FOLD_ATOL, FOLD_RTOL, fold_batchnorm  # noqa: E402



def _trained_resnet(devices, data_dir, steps=3, batch_size=32):
    """The chapter's ResNet-18 after ``steps`` SGD steps on real images: running statistics
    moved away from (0, 1), and differ per device (each normalizes its own half-batch)."""
    net = new_network('resnet18')
    trainer = init_training(net, devices, 0.1, seed=0)
    batches, _ = load_data_fashion_mnist(batch_size, data_dir, train_limit=steps * batch_size,
                                         test_limit=1, seed=0)
    loss = gluon.loss.SoftmaxCrossEntropyLoss()
    for X, y in batches:
        train_batch(net, X, y, loss, trainer, devices)
    return net, trainer, loss


def _test_images(data_dir, n):
    return load_data_fashion_mnist(n, data_dir, train_limit=1, test_limit=n)[1]


def _snapshot(net):
    return {name: [a.asnumpy() for a in p.list_data()]
            for name, p in net.collect_params().items()}


@pytest.fixture(scope='module')
def folded_pair(data_dir):
    devices = [mx.cpu(0), mx.cpu(1)]
    net, _, _ = _trained_resnet(devices, data_dir)
    before = _snapshot(net)
    return net, fold_batchnorm(net), before, devices


def test_folded_outputs_equal_the_original_in_predict_mode_on_each_device(folded_pair, data_dir):
    net, folded, _, devices = folded_pair
    X, _ = next(iter(_test_images(data_dir, 16)))
    originals = []
    for d in devices:
        want = net(X.as_in_context(d)).asnumpy()
        got = folded(X.as_in_context(d))
        assert got.context == d
        np.testing.assert_allclose(got.asnumpy(), want, rtol=FOLD_RTOL, atol=FOLD_ATOL)
        originals.append(want)
    # Non-trivial: each device's running statistics are its own, and far from their start.
    bn = net[1]
    assert np.abs(bn.running_mean.data(devices[0]).asnumpy()).max() > 1e-3
    assert not np.allclose(originals[0], originals[1], rtol=FOLD_RTOL, atol=FOLD_ATOL)


def test_folding_leaves_the_original_parameters_exactly_as_they_were(folded_pair):
    net, _, before, _ = folded_pair
    after = _snapshot(net)
    assert after.keys() == before.keys()
    for name in before:
        for a, b in zip(after[name], before[name]):
            np.testing.assert_array_equal(a, b, err_msg=name)


def test_the_folded_network_has_no_batchnorm_and_nothing_to_train(folded_pair):
    net, folded, _, devices = folded_pair

    def blocks(b):
        yield b
        for c in b._children.values():
            yield from blocks(c)
    assert not [b for b in blocks(folded) if isinstance(b, _BatchNorm)]
    assert sum(isinstance(b, _BatchNorm) for b in blocks(net)) == 17
    convs = [b for b in blocks(folded) if isinstance(b, nn.Conv2D)]
    assert len(convs) == sum(isinstance(b, nn.Conv2D) for b in blocks(net)) == 20
    params = folded.collect_params()
    assert {p.grad_req for p in params.values()} == {'null'}
    assert {tuple(p.list_ctx()) for p in params.values()} == {tuple(devices)}
    assert not set(id(p) for p in params.values()) & set(
        id(p) for p in net.collect_params().values())


def test_accuracy_on_real_fashion_mnist_is_the_same(folded_pair, data_dir):
    net, folded, _, devices = folded_pair
    test_iter = _test_images(data_dir, 256)
    assert (evaluate_accuracy(test_iter, folded, devices)
            == evaluate_accuracy(test_iter, net, devices))


def test_the_original_trains_on_and_the_copy_does_not_follow(two_cpus, data_dir):
    net, trainer, loss = _trained_resnet(two_cpus, data_dir, steps=1, batch_size=8)
    folded = fold_batchnorm(net)
    X, y = next(iter(_test_images(data_dir, 8)))
    out = folded(X.as_in_context(two_cpus[0])).asnumpy()
    weight = net[0].weight.data(two_cpus[0]).asnumpy()
    train_batch(net, X, y, loss, trainer, two_cpus)
    assert not np.array_equal(net[0].weight.data(two_cpus[0]).asnumpy(), weight)
    np.testing.assert_array_equal(folded(X.as_in_context(two_cpus[0])).asnumpy(), out)


def test_eps_and_fix_gamma_are_folded_as_batchnorm_applies_them():
    net = nn.HybridSequential()
    net.add(nn.Conv2D(4, 3, in_channels=2),
            nn.BatchNorm(scale=False, epsilon=0.5, in_channels=4), nn.Activation('relu'),
            nn.Conv2D(3, 1, use_bias=False, in_channels=4),
            nn.BatchNorm(epsilon=1e-3, in_channels=3),
            nn.Flatten(), nn.Dense(2, in_units=3 * 4 * 4))
    net.initialize(mx.init.Uniform(1.0), ctx=mx.cpu(0))
    rng = np.random.RandomState(0)
    for name, p in net.collect_params().items():
        value = rng.uniform(0.01, 0.1 if 'var' in name else 2.0, p.shape)
        p.set_data(nd.array(value))
    X = nd.array(rng.uniform(-1, 1, (5, 2, 6, 6)))
    folded = fold_batchnorm(net)
    np.testing.assert_allclose(folded(X).asnumpy(), net(X).asnumpy(), rtol=FOLD_RTOL,
                               atol=FOLD_ATOL)
    # gamma 0.01-2.0 is ignored by BatchNorm(scale=False) (fix_gamma), and so by the fold.
    scale = 1 / np.sqrt(net[1].running_var.data().asnumpy() + 0.5)
    np.testing.assert_allclose(folded[0].weight.data().asnumpy(),
                               net[0].weight.data().asnumpy() * scale[:, None, None, None],
                               rtol=1e-6)


def test_a_network_without_batchnorm_is_copied_exactly():
    net = new_network('lenet')
    net.initialize(mx.init.Xavier(), ctx=[mx.cpu(0), mx.cpu(1)])
    X = nd.random.uniform(shape=(3, 1, 28, 28))
    want = net(X).asnumpy()
    np.testing.assert_array_equal(fold_batchnorm(net)(X).asnumpy(), want)


def test_an_uninitialized_network_is_refused():
    with pytest.raises(RuntimeError, match=r"parameter 'conv\d+_weight' is not initialized; "
                       r"call net.initialize\(ctx=devices\)"):
        fold_batchnorm(new_network('resnet18'))
    net = new_network('resnet18')
    net.initialize(ctx=mx.cpu(0))
    with pytest.raises(RuntimeError, match='has no shape yet .* pass one batch through the '
                       'network first'):
        fold_batchnorm(net)


def test_blocks_it_cannot_fold_are_refused_by_name():
    net = d2lzh.resnet18(10)
    net.initialize(ctx=mx.cpu(0))
    with pytest.raises(ValueError, match=r"needs a HybridBlock \(such as "
                       r"gluon_mgpu.resnet18\(10\)\), got 'Sequential'"):
        fold_batchnorm(net)

    def built(*blocks):
        net = nn.HybridSequential()
        net.add(*blocks)
        net.initialize(ctx=mx.cpu(0))
        net(nd.zeros((1, 1, 6, 6)))
        return net
    with pytest.raises(ValueError, match=r"cannot fold block net\[1\] \('dropout\d+', "
                       r"mxnet.gluon.nn.basic_layers.Dropout\); it knows .*"
                       r"gluon_mgpu.model.Residual.*build it from those blocks "
                       r"\(gluon_mgpu.resnet18\)"):
        fold_batchnorm(built(nn.Conv2D(2, 3), nn.Dropout(0.5)))
    with pytest.raises(ValueError, match=r"net\[1\] \('batchnorm\d+'.*a BatchNorm that does "
                       'not directly follow a Conv2D'):
        fold_batchnorm(built(nn.Dense(4), nn.BatchNorm()))
    with pytest.raises(ValueError, match=r"net\[0\] \('conv\d+'.*its activation 'relu' comes "
                       'before the BatchNorm'):
        fold_batchnorm(built(nn.Conv2D(2, 3, activation='relu'), nn.BatchNorm()))

