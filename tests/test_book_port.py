"""The port is the book: the chapter's own loop and network against the package's step."""
import mxnet as mx
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
