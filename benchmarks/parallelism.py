"""The chapter's three ways to split training, on 2 devices: speed and bytes. Writes docs/parallelism.md.

    .venv/bin/python benchmarks/parallelism.py       # about 4 minutes on 2 cores

For each method it measures images/s of the training step (ResNet-18, global batch 64,
random 28x28 images; the book's LeNet for data parallelism from scratch), and takes from the
package the bytes of parameters and activations per device and the bytes copied between
devices per step. Each thread setting runs in a fresh process, because MXNet reads them once,
at start-up: the default; ``MXNET_CPU_TEMP_COPY=16`` (all CPU contexts share one pool of
scratch buffers, 4 by default, so two devices can wait for each other's); one OpenMP thread
per device (``OMP_NUM_THREADS=1``: each device computes on one core); and both.

The machine may be shared. Every measurement records its own process's CPU time against the
wall-clock time, and the CPU time the rest of the machine used meanwhile (from /proc/stat), so
a disturbed run shows in the table.
"""
import argparse
import datetime
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from measuring import Interval  # noqa: E402  (benchmarks/measuring.py)

SETTINGS = {'default': {}, 'MXNET_CPU_TEMP_COPY=16': {'MXNET_CPU_TEMP_COPY': '16'},
            'OMP_NUM_THREADS=1': {'OMP_NUM_THREADS': '1'},
            'both': {'MXNET_CPU_TEMP_COPY': '16', 'OMP_NUM_THREADS': '1'}}
METHODS = ('one device', 'data', 'layers', 'layers (4 micro-batches)', 'channels',
           'scratch (one device)', 'scratch')


def build(method, devices):
    """Return ``step(X, y)`` for ``method``, and the batch it trains on."""
    import gluon_mgpu
    from mxnet import autograd, gluon, init
    from mxnet.gluon import utils as gutils
    from gluon_mgpu.parallel import channels, init_one_device, layers, scratch

    def resnet():
        return init_one_device(gluon_mgpu.resnet18(10), devices[0])

    if method.startswith('scratch'):
        model = scratch.ScratchDataParallel(devices[:1] if 'one' in method else devices, lr=0.1)
        return model.train_batch
    if method in ('one device', 'data'):
        ctx = devices[:1] if method == 'one device' else devices
        net = gluon_mgpu.resnet18(10)
        net.initialize(init.Normal(sigma=0.01), ctx=ctx)
        net.hybridize()
        trainer = gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.1})
        loss = gluon.loss.SoftmaxCrossEntropyLoss()

        def step(X, y):  # the chapter's step
            Xs, ys = gutils.split_and_load(X, ctx), gutils.split_and_load(y, ctx)
            with autograd.record():
                ls = [loss(net(a), b) for a, b in zip(Xs, ys)]
            for l in ls:
                l.backward()
            trainer.step(X.shape[0])
        return step
    if method.startswith('layers'):
        model = layers.LayerSplit(resnet(), devices, 0.1,
                                  micro_batches=4 if 'micro' in method else 1)
    else:
        model = channels.ChannelSplitNet(resnet(), devices, 0.1)
    model.hybridize()
    return model.train_batch


def worker(args):
    """Measure every method in this process; print one JSON line each."""
    import gluon_mgpu  # noqa: F401  (first: it sets MXNet's thread count)
    import mxnet as mx
    from mxnet import nd
    devices = [mx.cpu(0), mx.cpu(1)]
    mx.random.seed(0)
    X = nd.random.uniform(shape=(args.batch_size, 1, 28, 28))
    y = nd.arange(args.batch_size) % 10
    for method in args.methods.split(','):
        step = build(method, devices)
        step(X, y)  # warm-up: memory, graphs
        nd.waitall()
        meter = Interval().start()
        for _ in range(args.steps):
            step(X, y)
        nd.waitall()
        r = meter.stop()
        print(json.dumps(dict(r, method=method, images_per_s=args.steps * args.batch_size
                              / r['wall'], omp=os.environ.get('OMP_NUM_THREADS'))), flush=True)


def summaries(batch_size):
    """Bytes per device and per step, from the package (they do not depend on the settings)."""
    import gluon_mgpu  # noqa: F401
    import mxnet as mx
    from mxnet import nd
    from gluon_mgpu.parallel import channels, data_parallel_summary, init_one_device, layers
    from gluon_mgpu.parallel import scratch
    devices = [mx.cpu(0), mx.cpu(1)]
    X = nd.zeros((batch_size, 1, 28, 28))
    out = {}
    for name, ctx in (('one device', devices[:1]), ('data', devices)):
        net = gluon_mgpu.resnet18(10)
        net.initialize(ctx=ctx)
        for d in ctx:
            net(X[:1].as_in_context(d))
        out[name] = data_parallel_summary(net, ctx, X)
    out['layers'] = layers.LayerSplit(init_one_device(gluon_mgpu.resnet18(10)), devices,
                                      0.1).summary(X)
    out['layers (4 micro-batches)'] = dict(out['layers'])
    out['channels'] = channels.ChannelSplitNet(init_one_device(gluon_mgpu.resnet18(10)),
                                               devices, 0.1).summary(X)
    out['scratch (one device)'] = scratch.ScratchDataParallel(devices[:1], 0.1).summary(X)
    out['scratch'] = scratch.ScratchDataParallel(devices, 0.1).summary(X)
    return out


def fmt(n):
    from gluon_mgpu.replicas.placement import format_bytes
    return format_bytes(n)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--steps', type=int, default=3, help='timed steps per method (default: 3)')
    p.add_argument('--batch-size', type=int, default=64, help='global batch (default: 64)')
    p.add_argument('--methods', default=','.join(METHODS))
    p.add_argument('--worker', action='store_true', help=argparse.SUPPRESS)
    p.add_argument('--out', default=os.path.join(ROOT, 'docs', 'parallelism.md'))
    args = p.parse_args(argv)
    if args.worker:
        return worker(args)
    start = time.time()
    results = {}
    for setting, env in SETTINGS.items():
        proc = subprocess.run([sys.executable, __file__, '--worker', '--steps', str(args.steps),
                               '--batch-size', str(args.batch_size), '--methods', args.methods],
                              env=dict(os.environ, **env), capture_output=True, text=True,
                              check=True)
        results[setting] = {r['method']: r for r in map(json.loads, proc.stdout.splitlines())}
        for r in results[setting].values():
            print('%-24s %-26s %6.1f images/s, CPU/wall %.2f, others %.2f cores'
                  % (setting, r['method'], r['images_per_s'], r['cpu'] / r['wall'],
                     r['others_cores']), flush=True)
    import run  # benchmarks/run.py: machine()
    info = run.machine()
    sizes = summaries(args.batch_size)
    methods = args.methods.split(',')
    lines = ['# Three ways to split training: speed and bytes on 2 devices', '',
             'Written by `benchmarks/parallelism.py` (one run, %.0f s); do not edit by hand.'
             % (time.time() - start), '',
             '- date: %s' % datetime.datetime.now(datetime.timezone.utc).strftime(
                 '%Y-%m-%d %H:%M UTC'),
             '- machine: %(cpu)s, %(cores)d usable cores, %(platform)s; Python %(python)s, '
             'MXNet %(mxnet)s' % info,
             '- **a shared machine**: other developers\' jobs ran at the same time. Each row '
             'gives this process\'s CPU time over the wall-clock time and the cores the rest of '
             'the machine kept busy meanwhile (from /proc/stat); rows with "others" well above '
             '0 were slowed down by them. Load average at the end: %(load)s.' % info,
             '- devices [cpu(0), cpu(1)] (simulated: both share the same cores); ResNet-18, '
             'global batch %d, random 28x28 images, SGD; hybridized (the splits: each part or '
             'piece); %d timed steps after one warm-up step, one fresh process per setting. '
             'Scratch rows train the book\'s LeNet.' % (args.batch_size, args.steps), '',
             '## Bytes (from the package; the same for every setting)', '',
             '| method | parameters per device | activations per device | copied per step |',
             '| --- | --- | --- | --- |']
    for m in methods:
        s = sizes[m]
        lines.append('| %s | %s | %s | %s |' % (
            m, ' / '.join(fmt(b) for b in s['parameter_bytes']),
            ' / '.join(fmt(b) for b in s['activation_bytes']), fmt(s['copied_bytes_per_step'])))
    lines += ['', 'Activations: the outputs of every layer of one forward pass, plus what a device '
              'receives from the other; copied per step: between the devices, forward and '
              'backward (data parallelism: the book\'s allreduce, every gradient to the first '
              'device and the sum back). Micro-batches keep every micro-batch\'s activations '
              'until its backward pass, so their bytes equal the plain layer split\'s.', '',
              '## Speed (images/s)', '',
              '| method | ' + ' | '.join(SETTINGS) + ' |',
              '| --- | ' + ' | '.join('---:' for _ in SETTINGS) + ' |']
    for m in methods:
        lines.append('| %s | %s |' % (m, ' | '.join(
            '%.1f (CPU/wall %.2f, others %.2f)' % (
                results[s][m]['images_per_s'], results[s][m]['cpu'] / results[s][m]['wall'],
                results[s][m]['others_cores']) for s in SETTINGS)))
    lines += ['', 'Reproduce: `.venv/bin/python benchmarks/parallelism.py --steps %d --batch-size '
              '%d`.' % (args.steps, args.batch_size)]
    run.write_report(args.out, lines)


if __name__ == '__main__':
    main()
