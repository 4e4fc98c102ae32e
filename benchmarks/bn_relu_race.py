"""Why resnet18 does not use nn.BatchNormReLU: its running statistics race with later reads.

    .venv/bin/python benchmarks/bn_relu_race.py     # a few seconds; writes docs/bn-relu-race.md

One training step of ``nn.BatchNormReLU`` (imperative, the chapter's first-stage shape: 8 images
of 64 channels, 28x28), then ``running_mean`` is read, either at once or after
``nd.waitall()``. Counts how often the read still sees the initial zeros. nn.BatchNorm is the
control. The result varies from run to run (it is a race), so it is a script, not a test.
"""
import datetime
import os

import gluon_mgpu  # noqa: F401  (thread settings before MXNet starts)
import mxnet as mx
from mxnet import autograd, nd
from mxnet.gluon import nn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRIES = 20


def stale_reads(layer_type, wait):
    stale = 0
    for _ in range(TRIES):
        x = nd.random.uniform(shape=(8, 64, 28, 28))
        layer = layer_type()
        layer.initialize()
        with autograd.record():
            y = layer(x)
        y.backward()
        if wait:
            nd.waitall()
        stale += int((layer.running_mean.data().asnumpy() == 0).all())
    return stale


def main():
    lines = ['# nn.BatchNormReLU: running statistics read right after a step', '',
             'Written by `benchmarks/bn_relu_race.py` on %s (MXNet %s); do not edit by hand.'
             % (datetime.date.today().isoformat(), mx.__version__), '',
             'Reads (of %d) that still saw the initial running mean after one training step:'
             % TRIES, '', '| layer | read at once | read after nd.waitall() |',
             '| --- | ---: | ---: |']
    for layer_type in (nn.BatchNorm, nn.BatchNormReLU):
        lines.append('| %s | %d | %d |' % (layer_type.__name__, stale_reads(layer_type, False),
                                           stale_reads(layer_type, True)))
    text = '\n'.join(lines) + '\n'
    with open(os.path.join(ROOT, 'docs', 'bn-relu-race.md'), 'w') as f:
        f.write(text)
    print(text)


if __name__ == '__main__':
    main()
