"""Shared by the tests of gluon_mgpu.parallel: twin networks and gradients by .params name."""
import mxnet as mx
import numpy as np
from mxnet import autograd, gluon, nd

from gluon_mgpu.parallel import init_one_device


def twins(make, tmp_path, input_shape=(4, 1, 28, 28), seed=0):
    """Two networks from ``make()`` with the same parameters on cpu(0): one to split, one not."""
    mx.random.seed(seed)
    net = init_one_device(make(), mx.cpu(0), input_shape=input_shape)
    path = str(tmp_path / 'twin.params')
    net.save_parameters(path)
    reference = make()
    reference.load_parameters(path, ctx=mx.cpu(0))
    return net, reference, path


def batch(n=4, seed=1, shape=(1, 28, 28)):
    """``n`` random images and labels 0, 1, ..., on cpu(0)."""
    mx.random.seed(seed)
    return nd.random.uniform(shape=(n,) + shape), nd.arange(n) % 10


def backward(net, X, y, train_mode=True):
    """Loss sum of ``net`` on ``(X, y)`` after one backward pass (softmax cross-entropy)."""
    loss = gluon.loss.SoftmaxCrossEntropyLoss()
    with autograd.record(train_mode=train_mode):
        l = loss(net(X), y)
    l.backward()
    return l.sum().asscalar()


def named(net):
    """``{name in .params files: Parameter}``."""
    return dict(net._collect_params_with_prefix())


def value(param):
    """A parameter's data as numpy, from the one device it lives on."""
    return param.data(param.list_ctx()[0]).asnumpy()


def grad(param):
    """A parameter's gradient as numpy, from the one device it lives on."""
    return param.grad(param.list_ctx()[0]).asnumpy()


def max_diff(a, b):
    return float(np.max(np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64))))
