"""bfloat16 mixed precision (mxnet.contrib.amp) against float32 on the CPU: speed and accuracy.

    .venv/bin/python benchmarks/bf16.py     # about 10 minutes on 2 cores; writes docs/bf16.md

Each measurement runs in a fresh process (``amp.init`` changes MXNet for the whole process),
alternating float32 and bfloat16, and reports the best of the repeats; accuracy comes from the
same short training run on a real Fashion-MNIST slice for both.
"""
import datetime
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CHILD = r'''
import json, sys, time
import gluon_mgpu
import mxnet as mx
from mxnet import autograd, nd
from mxnet.gluon import loss as gloss
from mxnet.contrib import amp
dtype, task = sys.argv[1], sys.argv[2]
if dtype == 'bfloat16':
    amp.init(target_dtype='bfloat16')
net = gluon_mgpu.new_network('resnet18', hybridize=True)
trainer = gluon_mgpu.init_training(net, [mx.cpu()], 0.1, seed=0)
if dtype == 'bfloat16':
    amp.init_trainer(trainer)
loss = gloss.SoftmaxCrossEntropyLoss()
if task == 'speed':
    train_iter, _ = gluon_mgpu.load_data_fashion_mnist(256, train_limit=1024, test_limit=1,
                                                       seed=0)
    batches = list(train_iter)
    for i, (X, y) in enumerate(batches):
        if i == 1:
            nd.waitall()
            start = time.time()
        with autograd.record():
            l = loss(net(X), y)
        l.backward()
        trainer.step(X.shape[0])
    nd.waitall()
    print(json.dumps({'images_per_sec': 256 * 3 / (time.time() - start)}))
else:
    train_iter, test_iter = gluon_mgpu.load_data_fashion_mnist(32, train_limit=2000,
                                                               test_limit=1000, seed=0)
    history = gluon_mgpu.train(net, train_iter, test_iter, [mx.cpu()], num_epochs=1,
                               trainer=trainer, event_handlers=[])
    print(json.dumps({'test_acc': history[-1]['test_acc'],
                      'train_loss': history[-1]['train_loss']}))
'''


def child(dtype, task):
    out = subprocess.run([sys.executable, '-c', CHILD, dtype, task], capture_output=True,
                         text=True, check=True, cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    speed = {'float32': [], 'bfloat16': []}
    for _ in range(2):
        for dtype in speed:
            speed[dtype].append(child(dtype, 'speed')['images_per_sec'])
            print(dtype, 'speed', speed[dtype][-1], flush=True)
    acc = {dtype: child(dtype, 'accuracy') for dtype in speed}
    print(acc, flush=True)
    best = {k: max(v) for k, v in speed.items()}
    lines = [
        '# bfloat16 mixed precision on the CPU', '',
        'Written by `benchmarks/bf16.py` on %s (MXNet\'s `mxnet.contrib.amp`, '
        '`amp.init(target_dtype=\'bfloat16\')` and `amp.init_trainer`; hybridized ResNet-18, '
        '1 device, batch 256; best of 2 fresh processes each, alternating).' %
        datetime.date.today().isoformat(), '',
        '| | float32 | bfloat16 | bfloat16 / float32 |', '| --- | ---: | ---: | ---: |',
        '| training images/s | %.1f | %.1f | %.2f |' % (best['float32'], best['bfloat16'],
                                                       best['bfloat16'] / best['float32']),
        '| raw images/s | %s | %s | |' % (', '.join('%.1f' % v for v in speed['float32']),
                                         ', '.join('%.1f' % v for v in speed['bfloat16'])),
        '| test accuracy after 1 epoch on 2000 images (batch 32, 1000 test images) | %.3f | '
        '%.3f | |' % (acc['float32']['test_acc'], acc['bfloat16']['test_acc']),
        '| training loss of that epoch | %.4f | %.4f | |' % (
            acc['float32']['train_loss'], acc['bfloat16']['train_loss']), '']
    with open(os.path.join(ROOT, 'docs', 'bf16.md'), 'w') as f:
        f.write('\n'.join(lines))
    print('\n'.join(lines))


if __name__ == '__main__':
    main()
