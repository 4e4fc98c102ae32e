# gluon_mgpu first: it chooses MXNet's thread count, which MXNet reads once, on import.
import gluon_mgpu  # noqa: I001

import signal

import mxnet as mx
import numpy as np
import pytest

# A test run started in the background (`make test &`, nohup) inherits SIGINT ignored, and then
# neither this process nor the commands it starts would see a Ctrl-C. The tests of Ctrl-C need
# what a terminal gives: Python's own handler here, the default in every child.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture
def two_cpus():
    """Two distinct MXNet contexts on one CPU: real replicas, real split, real reduction."""
    return [mx.cpu(0), mx.cpu(1)]


@pytest.fixture(scope='session')
def data_dir():
    """The real Fashion-MNIST folder. Missing data is an error here, never a skip:
    `make test` installs it (apt-get install dataset-fashion-mnist)."""
    return gluon_mgpu.find_data_dir()


def max_abs_diff(a, b):
    return float(np.max(np.abs(a.asnumpy().astype(np.float64) - b.asnumpy())))
