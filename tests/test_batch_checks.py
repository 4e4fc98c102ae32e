"""A user's iterator whose first batch the network cannot take: one ValueError naming the batch,
what is wrong and the fix, before any step (training.check_batch)."""
import mxnet as mx
import numpy as np
import pytest
from mxnet import gluon, init, nd

import gluon_mgpu
from gluon_mgpu import training
from gluon_mgpu import train_checks

DEVICES = [mx.cpu(0), mx.cpu(1)]
B = 8


def _good():
    return nd.random.uniform(shape=(B, 1, 28, 28)), nd.array(np.arange(B) % 10, dtype='int32')


def _net():
    net = gluon_mgpu.resnet18(10)
    trainer = training.init_training(net, DEVICES, 0.1, seed=0)
    return net, trainer


def _weights(net):
    return {k: p.list_data()[0].asnumpy().copy() for k, p in net.collect_params().items()
            if p._data is not None}


X, Y = _good()
# (X, y, what the message says after "the first batch of train_iter: ")
CASES = [
    (X, nd.array(np.arange(100, 108)), 'y holds labels from 100 to 107, but the network has 10 '
     'classes (0 to 9); map the labels to 0..9, or build the network with as many outputs as '
     'classes'),
    (X, Y.reshape((B, 1)), 'y has shape (8, 1), but labels must be 1-D, one class index per '
     'image; flatten them, for example y.reshape((-1,))'),
    (X.astype('float64'), Y, "X has type float64, but the network computes in float32; convert "
     "the images, for example X.astype('float32')"),
    (X.reshape((B, 28, 28)), Y, 'X has shape (8, 28, 28), but the network takes 4-D images '
     '(batch, channels, height, width); add the channel axis, for example '
     'X.reshape((-1, 1) + X.shape[1:])'),
    (X, Y[:6], 'X holds 8 images but y holds 6 labels; pass one label per image'),
    (X, nd.array([0, 1, 2.5, 3, 4, 5, 6, 7]), 'y holds 2.5, which is not a class index; labels '
     'are whole numbers 0 to 9'),
    (X.asnumpy(), Y, 'X is a numpy.ndarray, not an mxnet NDArray; convert it, for example '
     'nd.array(X)'),
]


@pytest.mark.parametrize('X,y,message', CASES)
def test_train_refuses_a_bad_first_batch_before_any_step(X, y, message, capsys):
    net, trainer = _net()
    net(nd.zeros((1, 1, 28, 28), ctx=DEVICES[0]))  # parameters made, to check nothing changed
    nd.waitall()
    before = _weights(net)
    with pytest.raises(ValueError) as e:
        gluon_mgpu.train(net, [(X, y)], [_good()], DEVICES, trainer=trainer, num_epochs=1,
                         event_handlers=[])
    assert str(e.value) == 'the first batch of train_iter: ' + message
    after = _weights(net)
    assert all(np.array_equal(before[k], after[k]) for k in before)


def test_train_batch_and_evaluate_accuracy_name_their_batch():
    net, trainer = _net()
    loss = gluon.loss.SoftmaxCrossEntropyLoss()
    bad = (X, nd.array(np.arange(100, 108)))
    with pytest.raises(ValueError, match=r'^the batch given to train_batch: y holds labels from '
                                         r'100 to 107, but the network has 10 classes'):
        training.train_batch(net, *bad, loss, trainer, DEVICES)
    with pytest.raises(ValueError, match=r'^the first batch of data_iter: y holds labels from '
                                         r'100 to 107'):
        training.evaluate_accuracy([bad], net, DEVICES)
    with pytest.raises(ValueError, match=r'^the first batch of train_iter: y has shape \(8, 1\)'):
        training.train_epoch(net, [(X, Y.reshape((B, 1)))], loss, trainer, DEVICES)


def test_train_batch_checks_only_the_first_batch_it_gets_for_a_network(monkeypatch):
    net, trainer = _net()
    loss = gluon.loss.SoftmaxCrossEntropyLoss()
    calls = []
    check = train_checks.check_batch
    monkeypatch.setattr(train_checks, 'check_batch', lambda *a: calls.append(a[3]) or check(*a))
    for _ in range(3):
        training.train_batch(net, X, Y, loss, trainer, DEVICES)
    assert calls == ['the batch given to train_batch']


def test_channels_are_checked_once_the_network_knows_them():
    net, _ = _net()
    net(nd.zeros((1, 1, 28, 28), ctx=DEVICES[0]))
    with pytest.raises(ValueError, match=r"^the first batch of data_iter: X has 3 channels "
                                         r"\(shape \(8, 3, 28, 28\)\), but the network's first "
                                         r"layer takes 1; pass images with 1 channels$"):
        training.evaluate_accuracy([(nd.zeros((B, 3, 28, 28)), Y)], net, DEVICES)


@pytest.mark.parametrize('loader', ['array', 'gluon'])
def test_what_the_loaders_yield_passes_whole_float_labels_too(loader, data_dir):
    # The package's batches and the book's pipeline (d2lzh's DataLoader with ToTensor) give
    # float32 images and int32 labels; labels as float32 whole numbers, as nd.array(list) gives
    # them, are class indices too.
    net, _ = _net()
    train_iter, _ = gluon_mgpu.load_data_fashion_mnist(B, data_dir=data_dir, train_limit=16,
                                                       test_limit=16, loader=loader)
    Xl, yl = next(iter(train_iter))
    assert (Xl.dtype, yl.dtype) == (np.float32, np.int32)
    for batch in ((Xl, yl), (Xl, yl.astype('float32'))):
        training.check_batch(*batch, net)


def test_a_network_without_a_dense_layer_still_gets_every_other_check():
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Conv2D(4, 3), gluon.nn.GlobalAvgPool2D(), gluon.nn.Flatten())
    net.initialize(init.Xavier())
    training.check_batch(X, nd.array(np.arange(100, 108)), net)  # classes unknown: any >= 0
    with pytest.raises(ValueError, match=r'^the first batch: y holds labels from -1 to 6, but '
                                         r'the network has its classes \(0 to the number of '
                                         r'classes - 1\)'):
        training.check_batch(X, nd.array(np.arange(-1, 7)), net)
