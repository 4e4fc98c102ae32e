"""nn.BatchNormReLU's running statistics race with readers (docs/bn-relu-race.md); the fence of
benchmarks/bnrelu.py orders them, and the fused network keeps resnet18's parameters.

The race is made deterministic: the backward pass is held (its head gradient comes from a
Python operator that waits until the read has returned, or 1 s at most), so a read that does
not wait for the update sees the initial zeros every time, and one that waits sees the update.
"""
import os
import sys

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, init, nd
from mxnet.gluon import nn

import gluon_mgpu
from conftest import max_abs_diff

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                'benchmarks'))
import bn_relu_race  # noqa: E402
import bnrelu  # noqa: E402

# A test of a script in benchmarks/ (the project measuring itself): make bench-test.
pytestmark = pytest.mark.bench


def _x():
    mx.random.seed(3)
    return nd.random.uniform(shape=(8, 64, 28, 28))


def _expected_running_mean(x):
    """nn.BatchNorm's running mean after one step on ``x``, once everything has finished."""
    layer = bn_relu_race.new_layer(nn.BatchNorm)
    bn_relu_race.step(layer, x)
    nd.waitall()
    return layer.running_mean.data().asnumpy()


def _held_read(make, read):
    """One held step of a fresh layer, then ``read(layer)``; the gate opens after the read.
    Return what was read and the running mean expected after the step."""
    x = _x()
    layer = bn_relu_race.new_layer(make)
    bn_relu_race.step(layer, x, held=True)
    try:
        seen = read(layer)
    finally:
        bn_relu_race.open_gate()
        nd.waitall()
    return seen, _expected_running_mean(x)


READERS = {'asnumpy': lambda layer: layer.running_mean.data().asnumpy(),
           'copyto': lambda layer: layer.running_mean.data().copyto(mx.cpu(1)).asnumpy()}


@pytest.mark.parametrize('reader', list(READERS))
def test_batch_norm_relu_unfenced_reader_sees_the_old_running_mean(reader):
    # MXNet 1.9.1's bug, which the fence exists for: the read does not wait for the update.
    seen, expected = _held_read(nn.BatchNormReLU, READERS[reader])
    assert (seen == 0).all()
    assert not (expected == 0).all()


@pytest.mark.parametrize('make', [nn.BatchNorm, bn_relu_race.fenced_batch_norm_relu],
                         ids=['BatchNorm', 'BatchNormReLU-fenced'])
@pytest.mark.parametrize('reader', list(READERS))
def test_fenced_reader_sees_the_update(make, reader):
    seen, expected = _held_read(make, READERS[reader])
    assert np.array_equal(seen, expected)


def test_predict_mode_forward_is_ordered_without_fence():
    # The forward operator declares the running statistics as written, so it waits for the
    # held backward pass (which reads them) and normalizes with the updated ones.
    x = _x()
    ref = bn_relu_race.new_layer(nn.BatchNormReLU)
    bn_relu_race.step(ref, x)
    nd.waitall()
    expected = ref(x).asnumpy()
    layer = bn_relu_race.new_layer(nn.BatchNormReLU)
    bn_relu_race.step(layer, x, held=True)
    try:
        seen = layer(x).asnumpy()
    finally:
        bn_relu_race.open_gate()
        nd.waitall()
    assert np.array_equal(seen, expected)


def test_fused_resnet18_keeps_resnet18_parameters_and_values():
    nets = []
    for make in (gluon_mgpu.resnet18, bnrelu.fused_resnet18):
        with mx.name.NameManager():  # fresh counters: both start at conv0, batchnorm0
            nets.append(make(10))
    ours, fused = nets
    x = nd.random.uniform(shape=(4, 1, 28, 28))
    for net in nets:
        net.initialize(init.Normal(sigma=0.01))
        net(x)
    assert list(fused.collect_params()) == list(ours.collect_params())
    assert len(bnrelu.fused_layers(fused)) == 9  # the stem and every block's first
    for name, p in ours.collect_params().items():
        fused.collect_params()[name].set_data(p.data())
    results = []
    for net in nets:
        net.hybridize(static_alloc=True)
        with autograd.record():
            y = net(x)
        y.backward()
        bnrelu.fence(bnrelu.fused_layers(net))
        results.append((y, [p.grad() for p in net.collect_params().values()
                            if p.grad_req != 'null'],
                        [p.data() for n, p in net.collect_params().items() if 'running' in n]))
    (y_o, g_o, s_o), (y_f, g_f, s_f) = results
    assert max_abs_diff(y_f, y_o) <= 1e-6
    assert max(max_abs_diff(a, b) for a, b in zip(g_f, g_o)) <= 1e-6
    assert max(max_abs_diff(a, b) for a, b in zip(s_f, s_o)) <= 1e-6
