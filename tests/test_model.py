import json
import os
import subprocess
import sys

import d2lzh
import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, init, nd
from mxnet.gluon import nn

import gluon_mgpu
from conftest import max_abs_diff


def _initialized(net, x, ctx=mx.cpu()):
    net.initialize(init.Normal(sigma=0.01), ctx=ctx)
    net(x)
    return net


def _copy_params(src, dst):
    """Copy parameters one to one, in order; names differ only by their prefixes."""
    ps, pd = list(src.collect_params().values()), list(dst.collect_params().values())
    assert len(ps) == len(pd)
    for a, b in zip(ps, pd):
        assert a.name.rsplit('_', 1)[-1] == b.name.rsplit('_', 1)[-1], (a.name, b.name)
        assert a.shape == b.shape, (a.name, b.name)
        b.set_data(a.data())


def _outputs_and_grads(net, x, train_mode):
    with autograd.record(train_mode=train_mode):
        y = net(x)
        s = (y * nd.arange(y.size).reshape(y.shape)).sum()
    s.backward()
    grads = [p.grad().copy() for p in net.collect_params().values() if p.grad_req != 'null']
    return y, grads


@pytest.mark.parametrize('train_mode', [True, False], ids=['train', 'predict'])
def test_resnet18_equals_d2lzh(train_mode):
    mx.random.seed(1)
    x = nd.random.uniform(shape=(4, 1, 28, 28))
    theirs = _initialized(d2lzh.resnet18(10), x)
    ours = _initialized(gluon_mgpu.resnet18(10), x)
    _copy_params(theirs, ours)
    y_t, g_t = _outputs_and_grads(theirs, x, train_mode)
    y_o, g_o = _outputs_and_grads(ours, x, train_mode)
    assert y_o.shape == (4, 10)
    assert max_abs_diff(y_o, y_t) <= 1e-6
    assert len(g_o) == len(g_t) == 76
    assert max(max_abs_diff(a, b) for a, b in zip(g_o, g_t)) <= 1e-6


@pytest.mark.parametrize('use_1x1conv,strides,out_shape', [
    (False, 1, (2, 3, 6, 6)), (True, 2, (2, 6, 3, 3))])
def test_residual_equals_d2lzh(use_1x1conv, strides, out_shape):
    mx.random.seed(2)
    channels = out_shape[1]
    x = nd.random.uniform(shape=(2, 3, 6, 6))
    theirs = _initialized(d2lzh.Residual(channels, use_1x1conv, strides), x)
    ours = _initialized(gluon_mgpu.Residual(channels, use_1x1conv=use_1x1conv,
                                            strides=strides), x)
    _copy_params(theirs, ours)
    for train_mode in (True, False):
        y_t, g_t = _outputs_and_grads(theirs, x, train_mode)
        y_o, g_o = _outputs_and_grads(ours, x, train_mode)
        assert y_o.shape == out_shape
        assert max_abs_diff(y_o, y_t) <= 1e-6
        assert max(max_abs_diff(a, b) for a, b in zip(g_o, g_t)) <= 1e-6


def test_resnet18_is_the_chapters_variant():
    net = gluon_mgpu.resnet18(10)
    stem = net[0]
    assert isinstance(stem, nn.Conv2D)
    assert (stem._kwargs['kernel'], stem._kwargs['stride'], stem._kwargs['pad']) == \
        ((3, 3), (1, 1), (1, 1))
    assert [type(b).__name__ for b in net._children.values()] == [
        'Conv2D', 'BatchNorm', 'Activation', 'HybridSequential', 'HybridSequential',
        'HybridSequential', 'HybridSequential', 'GlobalAvgPool2D', 'Dense']
    stages = [net[i] for i in range(3, 7)]
    assert [len(s) for s in stages] == [2, 2, 2, 2]
    assert [s[0].conv1._channels for s in stages] == [64, 128, 256, 512]
    assert [s[0].conv3 is not None for s in stages] == [False, True, True, True]
    assert not any(isinstance(b, nn.MaxPool2D) for b in _walk(net))
    x = nd.zeros((1, 1, 28, 28))
    _initialized(net, x)
    # The resolution is kept by the stem and halved by stages 2-4: 28 -> 28, 14, 7, 4.
    h = net[2](net[1](net[0](x)))
    sizes = []
    for s in stages:
        h = s(h)
        sizes.append(h.shape[2:])
    assert sizes == [(28, 28), (14, 14), (7, 7), (4, 4)]
    n_params = sum(int(np.prod(p.shape)) for p in net.collect_params().values())
    theirs = _initialized(d2lzh.resnet18(10), x)
    assert n_params == sum(int(np.prod(p.shape)) for p in theirs.collect_params().values())


def _walk(block):
    yield block
    for child in block._children.values():
        yield from _walk(child)


def test_hybridized_gives_the_same_outputs_and_gradients():
    mx.random.seed(3)
    x = nd.random.uniform(shape=(4, 1, 28, 28))
    imperative = _initialized(gluon_mgpu.resnet18(10), x)
    hybrid = _initialized(gluon_mgpu.resnet18(10), x)
    _copy_params(imperative, hybrid)
    hybrid.hybridize()
    for train_mode in (True, False):
        y_i, g_i = _outputs_and_grads(imperative, x, train_mode)
        y_h, g_h = _outputs_and_grads(hybrid, x, train_mode)
        assert max_abs_diff(y_h, y_i) <= 1e-6
        assert max(max_abs_diff(a, b) for a, b in zip(g_h, g_i)) <= 1e-6


def _layers(block, kind):
    found = [block] if isinstance(block, kind) else []
    for child in block._children.values():
        found += _layers(child, kind)
    return found


def test_norm_layer_default_is_the_books_batchnorm():
    from mxnet.gluon.contrib.nn import SyncBatchNorm
    default, explicit = gluon_mgpu.resnet18(10), gluon_mgpu.resnet18(10, norm_layer=nn.BatchNorm)
    assert len(_layers(default, nn.BatchNorm)) == 17
    assert _layers(default, SyncBatchNorm) == []
    strip = [k.split('_', 1)[1] for k in default.collect_params()]
    assert strip == [k.split('_', 1)[1] for k in explicit.collect_params()]
    synced = gluon_mgpu.resnet18(10, norm_layer=gluon_mgpu.model.sync_batch_norm(3))
    layers = _layers(synced, SyncBatchNorm)
    assert len(layers) == 17 and len(_layers(synced, nn.BatchNorm)) == 17  # a subclass
    assert {layer._kwargs['ndev'] for layer in layers} == {3}


@pytest.mark.parametrize('bad', [0, 1.5, True])
def test_sync_batch_norm_needs_a_device_count(bad):
    with pytest.raises(ValueError, match=r'num_devices must be a whole number >= 1, got %r'
                                         % (bad,)):
        gluon_mgpu.model.sync_batch_norm(bad)


def test_lenet_is_the_books_without_batchnorm():
    net = gluon_mgpu.model.lenet()
    net.initialize(init.Normal(sigma=0.01))
    assert net(nd.zeros((2, 1, 28, 28))).shape == (2, 10)
    assert _layers(net, nn.BatchNorm) == []
    shapes = [p.shape for p in net.collect_params().values()]
    assert shapes == [(6, 1, 5, 5), (6,), (16, 6, 5, 5), (16,), (120, 256), (120,),
                      (84, 120), (84,), (10, 84), (10,)]


SYNC_BN_CHECK = r'''
import json
import gluon_mgpu
from gluon_mgpu.runtime.dispatch import call
import mxnet as mx
from mxnet import autograd, gluon, init, nd

devices = [mx.cpu(0), mx.cpu(1)]
mx.random.seed(0)
X = nd.random.uniform(shape=(8, 1, 28, 28))
ref = gluon_mgpu.resnet18(10)
ref.initialize(init.Normal(sigma=0.01), ctx=mx.cpu(0))
ref(X)
nets = {}
for name, norm in (('sync', gluon_mgpu.model.sync_batch_norm(2)), ('plain', None)):
    net = gluon_mgpu.resnet18(10, norm_layer=norm)
    net.initialize(init.Normal(sigma=0.01), ctx=devices)
    net(X[:4].as_in_context(devices[0]))  # prediction mode: shapes only, no synchronization
    for a, b in zip(ref.collect_params().values(), net.collect_params().values()):
        b.set_data(a.data())
    Xs = gluon.utils.split_and_load(X, devices)
    # Each device issued from its own thread, as train_batch does: a scratch pool per device.
    with autograd.record():
        outs = [call(d, net, x) for d, x in zip(devices, Xs)]
    for d, o in zip(devices, outs):
        call(d, o.backward)
    nets[name] = net
with autograd.record():
    out = ref(X)
out.backward()
nd.waitall()

def diffs(net):
    running = [p for p in net.collect_params().values() if p.grad_req == 'null']
    across = max(float((p.data(devices[0]) - p.data(devices[1])).abs().max().asscalar())
                 for p in running)
    refs = [p for p in ref.collect_params().values() if p.grad_req == 'null']
    to_ref = max(float((p.data(devices[1]) - r.data()).abs().max().asscalar())
                 for p, r in zip(running, refs))
    return len(running), across, to_ref

print(json.dumps({name: diffs(net) for name, net in nets.items()}))
'''


@pytest.mark.slow
def test_sync_bn_gives_every_device_the_whole_batch_statistics():
    """SyncBatchNorm on two CPU contexts, each issued from its own thread, MXNet's settings.

    The layer blocks each device's engine thread until the other arrives, holding a scratch
    buffer. Issued from one thread, the two CPU contexts share one pool of buffers and MXNet
    1.9.1 deadlocks (it ran only with MXNET_CPU_TEMP_COPY=1000 and bulk execution off); from
    their own threads (gluon_mgpu.runtime.dispatch) each has its own pool, as GPUs do.
    """
    env = {k: v for k, v in os.environ.items()
           if k not in ('MXNET_CPU_TEMP_COPY', 'MXNET_EXEC_BULK_EXEC_TRAIN', 'MXNET_ENGINE_TYPE')}
    env['GLUON_MGPU_CPU_DEVICES'] = '2'
    result = subprocess.run([sys.executable, '-c', SYNC_BN_CHECK], capture_output=True,
                            text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    count, across, to_ref = found['sync']
    assert count == 34 and across == 0.0
    # Equal to plain BatchNorm over the whole batch on one device (float rounding only).
    assert to_ref <= 1e-5
    # Plain BatchNorm keeps per-device statistics, which differ and miss the whole batch.
    _, plain_across, plain_to_ref = found['plain']
    assert plain_across > 1e-4 and plain_to_ref > 1e-4

