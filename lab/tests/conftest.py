"""The lab's tests (make lab-test): the fixtures they share with tests/, without its others."""
# gluon_mgpu first: it chooses MXNet's thread count, which MXNet reads once, on import.
import gluon_mgpu  # noqa: I001

import signal

import mxnet as mx
import numpy as np
import pytest

# Started in the background, a test run inherits SIGINT ignored; the tests of signals need
# Python's own handler here (tests/conftest.py says more).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture
def two_cpus():
    """Two distinct MXNet contexts on one CPU."""
    return [mx.cpu(0), mx.cpu(1)]


@pytest.fixture(scope='session')
def data_dir():
    """The real Fashion-MNIST folder; missing data is an error, never a skip."""
    return gluon_mgpu.find_data_dir()


def max_abs_diff(a, b):
    return float(np.max(np.abs(a.asnumpy().astype(np.float64) - b.asnumpy())))
