"""One training step of the chapter's ResNet-18 on [cpu(0), cpu(1)]; saves the parameters.

Run by test_gpu_build.py with the CPU build's Python and with the GPU build's: the package's
step (``gluon_mgpu.train_epoch``: split the batch, record, backward, ``Trainer.step``) on the
first 16 training images, from the same initial values, so the two builds must end with the
same parameters. ``python one_step.py OUT.npz``
"""
import sys

import gluon_mgpu  # noqa: I001  (first: it sets the thread count and prepares the GPU build)
import mxnet as mx
import numpy as np
from mxnet import gluon, init


def main(out):
    devices = [mx.cpu(0), mx.cpu(1)]
    batch_size = 16
    train_iter, _ = gluon_mgpu.load_data_fashion_mnist(batch_size, train_limit=batch_size,
                                                       test_limit=batch_size, shuffle=False)
    mx.random.seed(0)
    net = gluon_mgpu.resnet18(10)
    net.initialize(init=init.Normal(sigma=0.01), ctx=devices)
    trainer = gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.1})
    record = gluon_mgpu.train_epoch(net, train_iter, gluon.loss.SoftmaxCrossEntropyLoss(),
                                    trainer, devices)
    arrays = {'train_loss': np.array(record['train_loss'])}
    for i, d in enumerate(devices):
        arrays.update(('device%d/%s' % (i, name), p.data(d).asnumpy())
                      for name, p in net.collect_params().items())
    np.savez(out, **arrays)


if __name__ == '__main__':
    main(sys.argv[1])
