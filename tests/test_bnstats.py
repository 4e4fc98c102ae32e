"""BatchNorm statistics at test time (gluon_mgpu.tools.bnstats)."""
import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, init, nd

from gluon_mgpu.tools import bnstats
from gluon_mgpu import data, training
from gluon_mgpu.model import lenet
from conftest import max_abs_diff


@pytest.fixture(scope='module')
def real_batch():
    images, labels = data.load_fashion_mnist_arrays('train')
    return nd.array(data.to_tensor(images[:32])), nd.array(labels[:32], dtype='int32')


@pytest.fixture
def net_and_batch(two_cpus, real_batch):
    mx.random.seed(4)
    net = training.new_network('resnet18', hybridize=False)
    net.initialize(init.Normal(sigma=0.01), ctx=two_cpus)
    X = real_batch[0][:32]
    for d in two_cpus:
        net(X[:1].as_in_context(d))
    return net, X


def test_the_chapters_resnet18_has_17_batch_norm_layers(net_and_batch):
    assert len(bnstats.batch_norm_layers(net_and_batch[0])) == 17


def test_reestimated_statistics_are_the_batchs_own(net_and_batch, two_cpus):
    net, X = net_and_batch
    with autograd.train_mode():
        batch_mode = net(X.as_in_context(two_cpus[0]))
    before = net(X.as_in_context(two_cpus[0]))
    assert max_abs_diff(before, batch_mode) > 0.1  # fresh running statistics: 0 and 1
    other = [l.running_mean.data(two_cpus[1]).copy() for l in bnstats.batch_norm_layers(net)]
    weights = [p.data(two_cpus[0]).copy() for p in net.collect_params().values()
               if p.grad_req != 'null']
    bnstats.reestimate_running_stats(net, X, two_cpus[0])
    # Predict mode now normalizes with the batch's statistics: the same outputs as train mode.
    assert max_abs_diff(net(X.as_in_context(two_cpus[0])), batch_mode) <= 1e-5
    layers = bnstats.batch_norm_layers(net)
    assert [l._kwargs['momentum'] for l in layers] == [0.9] * 17
    first = layers[0].running_mean.data(two_cpus[0]).asnumpy()
    stem = net[0](X.as_in_context(two_cpus[0])).asnumpy()
    assert np.allclose(first, stem.mean(axis=(0, 2, 3)), atol=1e-6)
    # Device 1's copies and every weight stay as they were.
    for layer, kept in zip(layers, other):
        assert max_abs_diff(layer.running_mean.data(two_cpus[1]), kept) == 0.0
    trained = [p for p in net.collect_params().values() if p.grad_req != 'null']
    assert all(max_abs_diff(p.data(two_cpus[0]), w) == 0.0 for p, w in zip(trained, weights))


def test_reestimating_refuses_a_hybridized_network_or_one_without_batch_norm(two_cpus):
    net = training.new_network('resnet18')
    with pytest.raises(ValueError, match='is hybridized, so its BatchNorm momentum cannot '
                                         'change; pass a network that is not'):
        bnstats.reestimate_running_stats(net, nd.zeros((2, 1, 28, 28)), two_cpus[0])
    with pytest.raises(ValueError, match='holds no nn.BatchNorm'):
        bnstats.reestimate_running_stats(lenet(10), nd.zeros((2, 1, 28, 28)),
                                         two_cpus[0])


def test_batch_statistics_accuracy_counts_train_mode_predictions(net_and_batch, two_cpus,
                                                                  real_batch):
    net, _ = net_and_batch
    X, y = real_batch[0][:20], real_batch[1][:20]
    batches = [(X[:10], y[:10]), (X[10:], y[10:])]
    expected = 0
    for Xb, yb in batches:
        with autograd.train_mode():
            out = net(Xb.as_in_context(two_cpus[0]))
        expected += int((out.argmax(axis=1).asnumpy() == yb.asnumpy()).sum())
    assert bnstats.evaluate_with_batch_stats(batches, net, two_cpus[0]) == expected / 20
    with pytest.raises(ValueError, match='yielded no examples'):
        bnstats.evaluate_with_batch_stats([], net, two_cpus[0])
