"""One benchmark measurement, in a fresh process (so thread settings apply); prints JSON.

The JSON holds the result and how its timed interval went (benchmarks/measuring.py): wall and
CPU time, and the cores the rest of the machine kept busy meanwhile.

Run by benchmarks/run.py as ``python benchmarks/worker.py '<json config>'``. The import order
matters: MXNet reads OMP_NUM_THREADS once, at import. A "book" configuration imports MXNet
first and never lets gluon_mgpu choose threads (MXNet's defaults, as a book reader has them).
"""
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from measuring import Interval  # noqa: E402

CONFIG = json.loads(sys.argv[1])
if CONFIG.get('threads') == 'package':
    import gluon_mgpu  # noqa: F401  (chooses OMP_NUM_THREADS before MXNet starts)

import mxnet as mx  # noqa: E402
import numpy as np  # noqa: E402
from mxnet import autograd, gluon, nd  # noqa: E402
from mxnet.gluon import data as gdata, loss as gloss, utils as gutils  # noqa: E402

from gluon_mgpu import book, data, training  # noqa: E402

# The one timed interval of this measurement: every function below starts and stops it.
METER = Interval()


def _book_loader(images, labels, batch_size):
    """d2lzh.load_data_fashion_mnist's pipeline: ToTensor per image, DataLoader, 4 workers."""
    dataset = gdata.ArrayDataset(nd.array(images[:, :, :, None], dtype='uint8'),
                                 labels.astype(np.int32))
    return gdata.DataLoader(dataset.transform_first(gdata.vision.transforms.ToTensor()),
                            batch_size, shuffle=True, num_workers=4)


def _batches(cfg, n_images):
    images, labels = data.load_fashion_mnist_arrays('train')
    images, labels = images[:n_images], labels[:n_images]
    if cfg['loader'] == 'book':
        return _book_loader(images, labels, cfg['batch_size'])
    return data.ArrayBatches(images, labels, cfg['batch_size'], shuffle=True, seed=0)


class _ReluAsActivation:
    """``F`` whose ``relu`` is ``F.Activation(act_type='relu')``: the same values, but computed
    by oneDNN (eltwise, in its blocked layout) instead of MXNet's own kernel on plain NCHW."""

    def __init__(self, F):
        self._F = F

    def __getattr__(self, name):
        return getattr(self._F, name)

    def relu(self, x):
        return self._F.Activation(x, act_type='relu')


def _relu_through_onednn():
    """Make every ``Residual`` call ``F.Activation`` for its ReLUs (a benchmark-only candidate)."""
    from gluon_mgpu import model
    plain = model.Residual.hybrid_forward
    model.Residual.hybrid_forward = lambda self, F, X: plain(self, _ReluAsActivation(F), X)


def _network(devices, model='ours', hybrid=True):
    """The chapter's ResNet-18 (ours or d2lzh's) and its Trainer, set up as the book does."""
    if model == 'd2lzh':
        import d2lzh
        net = d2lzh.resnet18(10)
        if hybrid:
            net.hybridize(static_alloc=True)
    else:
        net = book.new_network('resnet18', hybrid)
    return net, book.init_training(net, devices, book.LR_PER_DEVICE, seed=0)


def train_speed(cfg):
    devices = [mx.cpu(i) for i in range(cfg['devices'])]
    if cfg.get('relu') == 'onednn':
        _relu_through_onednn()
    batch, warmup, steps = cfg['batch_size'], cfg['warmup'], cfg['steps']
    net, trainer = _network(devices, cfg['model'], cfg['mode'] == 'hybrid')
    loss = gloss.SoftmaxCrossEntropyLoss()
    it = iter(_batches(cfg, batch * (warmup + steps)))
    for i in range(warmup + steps):
        if i == warmup:
            nd.waitall()
            METER.start()
        X, y = next(it)
        if cfg['loop'] == 'book':
            # The chapter's loop, as printed.
            gpu_Xs = gutils.split_and_load(X, devices)
            gpu_ys = gutils.split_and_load(y, devices)
            with autograd.record():
                ls = [loss(net(gpu_X), gpu_y) for gpu_X, gpu_y in zip(gpu_Xs, gpu_ys)]
            for l in ls:
                l.backward()
            trainer.step(batch)
        else:
            training.train_batch(net, X, y, loss, trainer, devices)
    nd.waitall()
    return batch * steps / METER.stop()['wall']


def data_speed(cfg):
    images, labels = data.load_fashion_mnist_arrays('train')
    n = cfg['images']
    if cfg['loader'] == 'book':
        it = _book_loader(images[:n], labels[:n], 256)
    else:
        it = data.ArrayBatches(images[:n], labels[:n], 256, shuffle=True, seed=0)
        next(iter(it))  # the one-time conversion to float32 is not per-batch cost
    METER.start()
    count = 0
    for X, y in it:
        X.wait_to_read()
        count += X.shape[0]
    return count / METER.stop()['wall']


def eval_speed(cfg):
    """Evaluation (``training.evaluate_accuracy``) of the trained-shape ResNet-18: images/s.

    ``cfg['fold']``: through ``inference.fold_batchnorm``'s copy (BatchNorm folded into the
    convolutions), hybridized with ``static_alloc`` and ``cfg['static_shape']``, partitioned by
    ``cfg['backend']`` when given. Else ``cfg['backend']``: the exported graph, partitioned.
    """
    devices = [mx.cpu(i) for i in range(cfg['devices'])]
    net, _ = _network(devices)
    images, labels = data.load_fashion_mnist_arrays('test')
    warm = data.ArrayBatches(images[:256], labels[:256], 256)
    training.evaluate_accuracy(warm, net, devices)
    if cfg.get('fold'):
        from gluon_mgpu.inference import fold_batchnorm
        net = fold_batchnorm(net, hybridize=False)
        net.hybridize(static_alloc=True, static_shape=cfg.get('static_shape', False),
                      backend=cfg.get('backend'))
        training.evaluate_accuracy(warm, net, devices)
    elif cfg.get('backend'):
        # The same network and weights as an exported graph, partitioned by MXNet's backend
        # (oneDNN: BatchNorm folded into the convolutions, for inference only).
        import tempfile
        folder = tempfile.mkdtemp()
        net.export(os.path.join(folder, 'net'))
        net = gluon.SymbolBlock.imports(os.path.join(folder, 'net-symbol.json'), ['data'],
                                        os.path.join(folder, 'net-0000.params'), ctx=devices)
        net.hybridize(static_alloc=True, backend=cfg['backend'])
        training.evaluate_accuracy(warm, net, devices)
    it = data.ArrayBatches(images[:cfg['images']], labels[:cfg['images']], 256)
    METER.start()
    training.evaluate_accuracy(it, net, devices)
    return cfg['images'] / METER.stop()['wall']


def gemm_flops(cfg):
    """FP32 FLOP/s of a large square matrix product: MXNet (oneDNN inner product) and numpy."""
    n = cfg['size']
    a = nd.random.uniform(shape=(n, n))
    w = nd.random.uniform(shape=(n, n))
    an, wn = a.asnumpy(), w.asnumpy()

    def best(product):
        product()  # warm-up
        fastest = float('inf')
        for _ in range(cfg['repeats']):
            start = time.time()
            product()
            fastest = min(fastest, time.time() - start)
        return 2.0 * n ** 3 / fastest
    METER.start()
    flops = {'mxnet': best(lambda: nd.FullyConnected(a, w, num_hidden=n,
                                                     no_bias=True).wait_to_read()),
             'numpy': best(lambda: an @ wn.T)}
    METER.stop()
    return dict(flops, value=flops['mxnet'])


def torch_speed(cfg):
    import torch
    from torch import nn
    from torch.nn import functional as F
    torch.set_num_threads(len(os.sched_getaffinity(0)))

    class Residual(nn.Module):  # the PyTorch edition's d2l.Residual
        def __init__(self, cin, cout, use_1x1conv=False, strides=1):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, padding=1, stride=strides)
            self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
            self.conv3 = nn.Conv2d(cin, cout, 1, stride=strides) if use_1x1conv else None
            self.bn1, self.bn2 = nn.BatchNorm2d(cout), nn.BatchNorm2d(cout)

        def forward(self, X):
            Y = F.relu(self.bn1(self.conv1(X)))
            Y = self.bn2(self.conv2(Y))
            if self.conv3:
                X = self.conv3(X)
            return F.relu(Y + X)

    def block(cin, cout, n, first=False):
        return nn.Sequential(*[Residual(cin if i == 0 else cout, cout, use_1x1conv=True,
                                        strides=2) if i == 0 and not first
                               else Residual(cout, cout) for i in range(n)])

    net = nn.Sequential(nn.Conv2d(1, 64, 3, 1, 1), nn.BatchNorm2d(64), nn.ReLU(),
                        block(64, 64, 2, True), block(64, 128, 2), block(128, 256, 2),
                        block(256, 512, 2), nn.AdaptiveAvgPool2d((1, 1)), nn.Flatten(),
                        nn.Linear(512, 10))
    batch = cfg['batch_size']
    X, y = torch.rand(batch, 1, 28, 28), torch.randint(0, 10, (batch,))
    if cfg['mode'] == 'channels_last':
        net, X = net.to(memory_format=torch.channels_last), X.to(
            memory_format=torch.channels_last)
    model = torch.compile(net) if cfg['mode'] == 'compile' else net
    opt = torch.optim.SGD(net.parameters(), 0.1)
    lossf = nn.CrossEntropyLoss()
    for i in range(cfg['warmup'] + cfg['steps']):
        if i == cfg['warmup']:
            METER.start()
        opt.zero_grad()
        lossf(model(X), y).backward()
        opt.step()
    return batch * cfg['steps'] / METER.stop()['wall']


if __name__ == '__main__':
    kind = CONFIG['kind']
    value = {'train': train_speed, 'data': data_speed, 'eval': eval_speed, 'torch': torch_speed,
             'gemm': gemm_flops}[kind](CONFIG)
    result = value if isinstance(value, dict) else {'value': value}
    result.update(METER.record)
    result['omp_num_threads'] = os.environ.get('OMP_NUM_THREADS')
    result['engine'] = os.environ.get('MXNET_ENGINE_TYPE', 'ThreadedEnginePerDevice')
    print(json.dumps(result))
