"""One benchmark measurement, in a fresh process (so thread settings apply); prints JSON.

The JSON holds the result and how its timed interval went (lab/measuring.py): wall and
CPU time, and the cores the rest of the machine kept busy meanwhile.

Run by lab/run.py and scaling.py as ``python lab/worker.py '<json config>'``
(kind "dist": by every process of a dist_sync job). The import order matters: MXNet reads
OMP_NUM_THREADS once, at import. A "book" configuration imports MXNet first and never lets
gluon_mgpu choose threads (MXNet's defaults, as a book reader has them); a "d2lzh-first" one
imports d2lzh (hence MXNet) and then the package, the book's import order.
"""
import json
import os
import resource
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from measuring import Interval  # noqa: E402

CONFIG = json.loads(sys.argv[1])
if CONFIG.get('isa'):
    # oneDNN's instruction-set cap, read when MXNet starts: a CPU without some instructions.
    os.environ['DNNL_MAX_CPU_ISA'] = CONFIG['isa']
if CONFIG.get('threads') == 'd2lzh-first':
    # The book's first cell: d2lzh imports MXNet, which starts with its own thread count; the
    # package comes after (and warns). With omp_after, MXNet's MXSetNumOMPThreads is asked for
    # every core then: it sets the calling thread's OpenMP count, not the engine's workers'.
    import d2lzh  # noqa: F401
    import gluon_mgpu  # noqa: F401
    if CONFIG.get('omp_after'):
        import ctypes
        import mxnet
        mxnet.base.check_call(mxnet.base._LIB.MXSetNumOMPThreads(
            ctypes.c_int(len(os.sched_getaffinity(0)))))
elif CONFIG.get('threads') == 'package':
    # The choice `python -m gluon_mgpu.train --num-gpus N` makes for N simulated devices.
    os.environ.setdefault('GLUON_MGPU_CPU_DEVICES', str(CONFIG.get('devices', 1)))
    import gluon_mgpu  # noqa: F401  (chooses OMP_NUM_THREADS before MXNet starts)

import itertools  # noqa: E402

import mxnet as mx  # noqa: E402
import numpy as np  # noqa: E402
from mxnet import autograd, gluon, nd  # noqa: E402
from mxnet.gluon import data as gdata, loss as gloss, utils as gutils  # noqa: E402

from gluon_mgpu import (book_setting, evaluate_accuracy, init_training,  # noqa: E402
                        load_data_fashion_mnist, new_network, train_epoch)

# The one timed interval of this measurement: every function below starts and stops it.
METER = Interval()
LR = book_setting(1)[1]  # the book's learning rate on one device


def _book_loader(batches):
    """d2lzh.load_data_fashion_mnist's pipeline over the images of ``batches``: ToTensor per
    image, DataLoader, 4 workers."""
    dataset = gdata.ArrayDataset(nd.array(batches.images[:, :, :, None], dtype='uint8'),
                                 batches.labels.astype(np.int32))
    return gdata.DataLoader(dataset.transform_first(gdata.vision.transforms.ToTensor()),
                            batches.batch_size, shuffle=True, num_workers=4)


def _batches(cfg, n_images, batch_size=None, split='train'):
    """The first ``n_images`` of Fashion-MNIST's ``split`` in batches, the package's way
    (shuffled from seed 0 for training) or, ``cfg['loader']`` 'book', the book's."""
    batch_size = batch_size or cfg['batch_size']
    limit = {'train_limit': n_images} if split == 'train' else {'test_limit': n_images}
    batches = load_data_fashion_mnist(batch_size, seed=0, **limit)[split == 'test']
    return _book_loader(batches) if cfg.get('loader') == 'book' else batches


def _network(devices, model='ours', hybrid=True, dtype='float32', static_shape=False):
    """The chapter's ResNet-18 (ours or d2lzh's) and its Trainer, set up as the book does;
    ours also in bfloat16 (``--dtype``), and hybridized with ``static_shape`` (1 device only:
    docs/speed.md)."""
    if model == 'ours':
        net = new_network('resnet18', hybrid, dtype=dtype)
        if hybrid and static_shape:
            net.hybridize(static_alloc=True, static_shape=True)
        return net, init_training(net, devices, LR, seed=0, dtype=dtype)
    else:
        import d2lzh
        net = d2lzh.resnet18(10)
        if hybrid:
            net.hybridize(static_alloc=True)  # as new_network
    return net, init_training(net, devices, LR, seed=0)


def _training(cfg, num_batches):
    """``(devices, net, trainer, loss, batches)`` of a train configuration: ``num_batches``
    batches of ``cfg['batch_size']``."""
    devices = [mx.cpu(i) for i in range(cfg['devices'])]
    net, trainer = _network(devices, cfg['model'], cfg['mode'] == 'hybrid',
                            cfg.get('dtype', 'float32'), cfg.get('static_shape', False))
    loss = gloss.SoftmaxCrossEntropyLoss()
    return devices, net, trainer, loss, iter(_batches(cfg, cfg['batch_size'] * num_batches))


def train_speed(cfg, setup=None):
    """Images/s of ``cfg['steps']`` steps after ``cfg['warmup']``, timed by METER, no waits in
    between; ``setup`` as ``_training`` returns it (default: a fresh one). The package's steps
    are ``train_epoch``'s, what ``train()`` runs (each device's calls from a thread of its own
    on simulated devices, the epoch's loss and accuracy sums included)."""
    batch, warmup, steps = cfg['batch_size'], cfg['warmup'], cfg['steps']
    devices, net, trainer, loss, it = setup or _training(cfg, warmup + steps)

    def run(n):
        if cfg['loop'] != 'book':
            return train_epoch(net, itertools.islice(it, n), loss, trainer, devices)
        for X, y in itertools.islice(it, n):  # the chapter's loop, as printed
            gpu_Xs = gutils.split_and_load(X, devices)
            gpu_ys = gutils.split_and_load(y, devices)
            with autograd.record():
                ls = [loss(net(gpu_X), gpu_y) for gpu_X, gpu_y in zip(gpu_Xs, gpu_ys)]
            for l in ls:
                l.backward()
            trainer.step(batch)
    if warmup:
        run(warmup)
    nd.waitall()
    METER.start()
    run(steps)
    nd.waitall()
    return batch * steps / METER.stop()['wall']


class _Phases:
    """Times one step of ``train_epoch`` phase by phase, each after ``nd.waitall()``:
    ``times[phase]``, a list with one entry per step.

    ``split`` is the step's ``split_f``: the two halves of ``split_and_load`` (``split_data``,
    then ``as_in_context`` per slice), phases ``split`` and ``copies``. The object stands in for
    the trainer: forward and backward have been issued on every device when the step calls its
    ``step``, which runs ``finish``, ``(phase, f)`` pairs, each called as ``f(batch_size)``.
    """

    def __init__(self, finish):
        self.finish, self.times = finish, {}

    def lap(self, phase):
        nd.waitall()
        now = time.perf_counter()
        self.times.setdefault(phase, []).append(now - self._start)
        self._start = now

    def split(self, X, y, devices):
        self._start = time.perf_counter()
        Xs = gutils.split_data(X, len(devices), even_split=False)
        ys = gutils.split_data(y, len(devices), even_split=False)
        self.lap('split')
        Xs = [X_d.as_in_context(d) for X_d, d in zip(Xs, devices)]
        ys = [y_d.as_in_context(d) for y_d, d in zip(ys, devices)]
        self.lap('copies')
        return Xs, ys

    def step(self, batch_size):
        self.lap('forward+backward')
        for phase, f in self.finish:
            f(batch_size)
            self.lap(phase)


def _phases(cfg, setup, finish):
    """Phase times of ``cfg['phase_steps']`` steps after an untimed one, and their interval."""
    devices, net, _, loss, batches = setup
    phases = _Phases(finish)

    def step():  # one step of train_epoch, timed phase by phase
        train_epoch(net, [next(batches)], loss, phases, devices, split_f=phases.split)
    step()
    phases.times, meter = {}, Interval().start()
    for _ in range(cfg['phase_steps']):
        step()
    return phases.times, meter.stop()


def _with_phases(value, times, interval):
    """The result of a phased measurement: disturbed if either of its intervals was."""
    return {'value': value, 'phases': times, 'phase_interval': interval,
            'disturbed': METER.record['disturbed'] or interval['disturbed']}


def phase_speed(cfg):
    """Images/s of the package's step (``train_speed``), then its phases with waits.

    The package's Trainer is made with ``update_on_kvstore=False`` (``init_training``), so its
    step is two calls that are timed apart: the gradient sum (``allreduce_grads``: the kvstore
    adds the devices' gradients and hands the sum back to every device) and the update
    (``update``: every device updates its replica).
    """
    setup = _training(cfg, cfg['warmup'] + cfg['steps'] + 1 + cfg['phase_steps'])
    value = train_speed(cfg, setup)
    trainer = setup[2]
    finish = [('gradient sum', lambda n: trainer.allreduce_grads()), ('update', trainer.update)]
    return _with_phases(value, *_phases(cfg, setup, finish))


def dist_speed(cfg):
    """One worker of a ``dist_sync`` job (or of a Horovod job, ``cfg['engine']``): the job's
    images/s, then the phases with waits.

    Joins the job, takes its share of every global batch of ``cfg['batch_size']``, and trains
    the package's way (``init_training`` with the job's kvstore, one device). Images/s are the
    global batch times the steps over this worker's time (the workers move in lock step).
    Phase ``push/pull`` is ``trainer.step``: push the gradients to the server, which adds up
    the workers' and updates, and pull the new weights; with Horovod ``allreduce+update``, the
    same call: the ring sums the workers' gradients, every worker updates its own replica.
    """
    if cfg.get('engine') == 'horovod':
        # init_training joins the job horovodrun started; this process's place in it:
        kv, phase = 'horovod', 'allreduce+update'
        rank, workers = int(os.environ['HOROVOD_RANK']), int(os.environ['HOROVOD_SIZE'])
    else:
        kv, phase = mx.kv.create('dist_sync'), 'push/pull'  # joins: waits for every process
        rank, workers = kv.rank, kv.num_workers
    devices = [mx.cpu(0)]
    net = new_network(cfg['model'], cfg['mode'] == 'hybrid')
    trainer = init_training(net, devices, LR, seed=0, kvstore=kv)
    batches = _batches(cfg, cfg['batch_size'] * (cfg['warmup'] + cfg['steps'] + 1
                                                 + cfg['phase_steps']))
    batches.set_part(workers, rank)
    setup = (devices, net, trainer, gloss.SoftmaxCrossEntropyLoss(), iter(batches))
    value = train_speed(cfg, setup)
    result = _with_phases(value, *_phases(cfg, setup, [(phase, trainer.step)]))
    return dict(result, rank=rank, num_workers=workers)


def data_speed(cfg):
    it = _batches(cfg, cfg['images'], 256)
    if cfg['loader'] != 'book':
        next(iter(it))  # the one-time conversion to float32 is not per-batch cost
    METER.start()
    count = 0
    for X, y in it:
        X.wait_to_read()
        count += X.shape[0]
    return count / METER.stop()['wall']


def eval_speed(cfg):
    """Evaluation (``evaluate_accuracy``) of the trained-shape ResNet-18: images/s.

    ``cfg['fold']``: through ``fold_batchnorm``'s copy (lab/fold.py: BatchNorm folded into
    the convolutions), hybridized with ``static_alloc`` and ``cfg['static_shape']``, partitioned by
    ``cfg['backend']`` when given. Else ``cfg['backend']``: the exported graph, partitioned.
    """
    devices = [mx.cpu(i) for i in range(cfg['devices'])]
    net, _ = _network(devices, dtype=cfg.get('dtype', 'float32'))
    warm = _batches(cfg, 256, 256, 'test')
    evaluate_accuracy(warm, net, devices)
    if cfg.get('fold'):
        from fold import fold_batchnorm
        net = fold_batchnorm(net, hybridize=False)
        net.hybridize(static_alloc=True, static_shape=cfg.get('static_shape', False),
                      backend=cfg.get('backend'))
        evaluate_accuracy(warm, net, devices)
    elif cfg.get('backend'):
        # The same network and weights as an exported graph, partitioned by MXNet's backend
        # (oneDNN: BatchNorm folded into the convolutions, for inference only).
        import tempfile
        folder = tempfile.mkdtemp()
        net.export(os.path.join(folder, 'net'))
        net = gluon.SymbolBlock.imports(os.path.join(folder, 'net-symbol.json'), ['data'],
                                        os.path.join(folder, 'net-0000.params'), ctx=devices)
        net.hybridize(static_alloc=True, backend=cfg['backend'])
        evaluate_accuracy(warm, net, devices)
    it = _batches(cfg, cfg['images'], 256, 'test')
    METER.start()
    evaluate_accuracy(it, net, devices)
    return cfg['images'] / METER.stop()['wall']


def gemm_flops(cfg):
    """FLOP/s of a large square matrix product: MXNet (oneDNN inner product) and numpy, in
    FP32; with ``cfg['dtype']`` bfloat16, MXNet's on bfloat16 operands (as AMP gives the
    convolutions and dense layers) and numpy's FP32 for reference."""
    n = cfg['size']
    a = nd.random.uniform(shape=(n, n))
    w = nd.random.uniform(shape=(n, n))
    an, wn = a.asnumpy(), w.asnumpy()
    if cfg.get('dtype') == 'bfloat16':
        from mxnet.contrib.amp.amp import bfloat16
        a, w = nd.amp_cast(a, dtype=bfloat16), nd.amp_cast(w, dtype=bfloat16)

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
    # bfloat16: autocast, PyTorch's mixed precision (float32 parameters, as MXNet's AMP).
    bf16 = cfg.get('dtype') == 'bfloat16'
    for i in range(cfg['warmup'] + cfg['steps']):
        if i == cfg['warmup']:
            METER.start()
        opt.zero_grad()
        with torch.autocast('cpu', dtype=torch.bfloat16, enabled=bf16):
            l = lossf(model(X), y)
        l.backward()
        opt.step()
    return batch * cfg['steps'] / METER.stop()['wall']


if __name__ == '__main__':
    kind = CONFIG['kind']
    value = {'train': train_speed, 'data': data_speed, 'eval': eval_speed, 'torch': torch_speed,
             'gemm': gemm_flops, 'phases': phase_speed, 'dist': dist_speed}[kind](CONFIG)
    result = dict(METER.record)
    result.update(value if isinstance(value, dict) else {'value': value})
    result['omp_num_threads'] = os.environ.get('OMP_NUM_THREADS')
    result['engine'] = os.environ.get('MXNET_ENGINE_TYPE', 'ThreadedEnginePerDevice')
    # Peak memory of the process (Linux reports kilobytes): the scratch-buffer pool shows here.
    result['max_rss_mb'] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(json.dumps(result))
