"""Shared by the tests of gluon_mgpu.parallel: twin networks and gradients by .params name."""
import mxnet as mx
import numpy as np
from mxnet import autograd, gluon, nd

from gluon_mgpu.model import resnet18
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


def stepped(make_split, devices, tmp_path):
    """ResNet-18 split by ``make_split(net, devices)``, after one training step; ``(split, X)``."""
    net, _, _ = twins(lambda: resnet18(10), tmp_path)
    split = make_split(net, devices)
    X, y = batch()
    split.train_batch(X, y)
    return split, X


def assert_lives_on(block, device):
    """Every parameter of ``block`` lives on ``device`` only, and so does every gradient."""
    for p in block.collect_params().values():
        assert p.list_ctx() == [device], p.name
        if p.grad_req != 'null':
            assert [g.context for g in p.list_grad()] == [device], p.name


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


def train_and_reload(split, make, tmp_path):
    """One training step of ``split``, saved and read into a plain ``make()`` on cpu(0).

    Returns ``(X, plain)``: the batch trained on, and the one-device network read from the file.
    """
    X, y = batch()
    split.train_batch(X, y)
    saved = str(tmp_path / 'split.params')
    split.save_parameters(saved)
    plain = make()
    plain.load_parameters(saved, ctx=mx.cpu(0))  # an ordinary file: every name and shape
    return X, plain


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


def float64_gap(n, seed, tmp_dir):
    """Largest per-layer relative gradient gap of a float64 channel split over ``n`` devices.

    Run in a process of its own with ``MXNET_ENGINE_TYPE=NaiveEngine``: MXNet's float64
    convolution goes through OpenBLAS, which has hung when two CPU contexts call it at once.
    Prints ``loss gap, gradient gap`` (both relative to the one-device float64 network).
    """
    import pathlib
    from gluon_mgpu.model import resnet18
    from gluon_mgpu.parallel import channels
    net, reference, _ = twins(lambda: resnet18(10), pathlib.Path(tmp_dir), seed=seed)
    net.cast('float64')
    reference.cast('float64')
    split = channels.ChannelSplitNet(net, [mx.cpu(i) for i in range(n)], 0.1)
    X, y = batch(4, seed=seed + 10)
    X, y = X.astype('float64'), y.astype('float64')
    ours, theirs = backward(split.net, X, y), backward(reference, X, y)
    print(abs(ours - theirs) / abs(theirs), layer_gap(split, reference))


def layer_gap(split, reference):
    """Largest over the split layers of max |gradient gap| / max |gradient| of the layer."""
    theirs = named(reference)
    gaps = []
    for path, layer in split.layers:
        names = [n for n in layer.param_names if not n.startswith('running')]
        ours = {n: np.concatenate([getattr(p, n).grad(d).asnumpy()
                                   for p, d in zip(layer.pieces, layer.devices)]) for n in names}
        scale = max(np.abs(theirs[path + n].grad().asnumpy()).max() for n in names)
        gaps.append(max(np.abs(ours[n] - theirs[path + n].grad().asnumpy()).max()
                        for n in names) / scale)
    return max(gaps)
