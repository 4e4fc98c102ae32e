"""One training step of the chapter's ResNet-18 on [cpu(0), cpu(1)]; saves the parameters.

Run by test_gpu_build.py with the CPU build's Python and with the GPU build's: the step is the
book's (split_and_load, record, backward, Trainer.step) on the first 16 training images, so
the two builds must give the same parameters. ``python one_step.py OUT.npz``
"""
import sys

import gluon_mgpu  # noqa: I001  (first: it sets the thread count and prepares the GPU build)
import mxnet as mx
import numpy as np
from mxnet import autograd, gluon, init
from mxnet.gluon import utils as gutils


def main(out):
    devices = [mx.cpu(0), mx.cpu(1)]
    batch_size = 16
    train_iter, _ = gluon_mgpu.load_data_fashion_mnist(batch_size, train_limit=batch_size,
                                                       test_limit=batch_size, shuffle=False)
    X, y = next(iter(train_iter))
    mx.random.seed(0)
    net = gluon_mgpu.resnet18(10)
    net.initialize(init=init.Normal(sigma=0.01), ctx=devices)
    trainer = gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.1})
    loss = gluon.loss.SoftmaxCrossEntropyLoss()
    gpu_Xs = gutils.split_and_load(X, devices)
    gpu_ys = gutils.split_and_load(y, devices)
    with autograd.record():
        ls = [loss(net(gpu_X), gpu_y) for gpu_X, gpu_y in zip(gpu_Xs, gpu_ys)]
    for l in ls:
        l.backward()
    # The initial values (the parameters change only in trainer.step). An earlier version read
    # them right after a forward pass outside record(): once in six runs, with either build, the
    # tail of one convolution weight came out different (MKLDNN reorders weights in place in
    # inference mode, the likely cause). Read after waitall, without that pass: 11 of 11 equal.
    mx.nd.waitall()
    params = net.collect_params()
    arrays = {'init/' + name: p.data(devices[0]).asnumpy() for name, p in params.items()}
    trainer.step(batch_size)
    for i, d in enumerate(devices):
        arrays.update(('step%d/%s' % (i, name), p.data(d).asnumpy())
                      for name, p in params.items())
    np.savez(out, **arrays)


if __name__ == '__main__':
    main(sys.argv[1])
