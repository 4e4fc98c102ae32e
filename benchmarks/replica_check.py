"""What does checking the replicas every step cost? Writes docs/replica-check.md.

    OMP_NUM_THREADS=2 python benchmarks/replica_check.py

Trains the chapter's ResNet-18 (hybridized, as ``python -m gluon_mgpu.train`` does) on two CPU
contexts with real Fashion-MNIST batches, and times ``train_epoch`` over a few steps with and
without ``assert_replicas_match`` after every step (``--check-replicas 1``). The two variants
alternate (plain, checked, checked, plain, ...) in one run on one network, so slow phases of a
shared machine hit both alike. It also times the check on its own.
"""
import argparse
import datetime
import os
import platform
import statistics
import sys
import time

import gluon_mgpu  # noqa: I001  (first: it sets MXNet's thread count)

import mxnet as mx
import numpy as np
from mxnet import nd
from mxnet.gluon import loss as gloss

from gluon_mgpu import data
from measuring import cpu_model
from gluon_mgpu.handlers.events import Events, TrainingState

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Fewer pairs than this cannot resolve 5% when other jobs make step times vary by 10% or more.
MIN_PAIRS = 10


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--batch-sizes', default='64,512',
                   help='global batch sizes to measure, comma-separated (default: 64,512; '
                        '512 is the chapter\'s 256 per device on 2 devices)')
    p.add_argument('--pairs', default='20,4',
                   help='alternating plain/checked pairs per batch size (default: 20,4)')
    p.add_argument('--steps', default='1,1',
                   help='training steps per timed train_epoch call, per batch size '
                        '(default: 1,1)')
    p.add_argument('--check-repeats', type=int, default=10,
                   help='how many times to time the check alone (default: 10)')
    p.add_argument('--out', default=os.path.join(ROOT, 'docs', 'replica-check.md'))
    return p.parse_args(argv)


def measure(batch_size, pairs, steps, check_repeats, devices, images, labels):
    """Per-step seconds without and with a check after every step, alternating."""
    net = gluon_mgpu.new_network('resnet18', hybridize=True)
    trainer = gluon_mgpu.init_training(net, devices, 0.1, seed=0)
    loss = gloss.SoftmaxCrossEntropyLoss()
    batches = [(nd.array(images[i * batch_size:(i + 1) * batch_size]),
                nd.array(labels[i * batch_size:(i + 1) * batch_size]))
               for i in range(steps)]

    check = gluon_mgpu.ReplicaCheck(1, verbose=False)

    def per_step(handlers):
        # train_epoch ends with nd.waitall(), so both clocks see all the work.
        events = Events(handlers, TrainingState(net, trainer, loss, devices, batches, [], 1))
        cpu = time.process_time()
        wall = gluon_mgpu.train_epoch(net, batches, loss, trainer, devices,
                                      events=events)['seconds']
        return wall / steps, (time.process_time() - cpu) / steps

    per_step([])  # warm-up: deferred initialization, graph compilation, memory pools
    gluon_mgpu.assert_replicas_match(net)
    plain, checked, plain_cpu, checked_cpu = [], [], [], []
    for i in range(pairs):
        for handlers in (([], [check]) if i % 2 == 0 else ([check], [])):
            wall, cpu = per_step(handlers)
            (checked if handlers else plain).append(wall)
            (checked_cpu if handlers else plain_cpu).append(cpu)

    nd.waitall()
    alone = []
    for _ in range(check_repeats):
        start = time.time()
        report = gluon_mgpu.assert_replicas_match(net)
        alone.append(time.time() - start)
    return {'batch_size': batch_size, 'steps': steps, 'pairs': pairs, 'plain': plain,
            'checked': checked, 'plain_cpu': plain_cpu, 'checked_cpu': checked_cpu,
            'alone': alone, 'summary': gluon_mgpu.format_replica_summary(report)}


def _paired(plain, checked):
    """Per-pair ratios checked / plain: (median, first quartile, third quartile)."""
    ratios = [c / p for p, c in zip(plain, checked)]
    if len(ratios) < 2:
        return ratios[0], ratios[0], ratios[0]
    q1, _, q3 = statistics.quantiles(ratios, n=4)
    return statistics.median(ratios), q1, q3


def write_markdown(path, results, args, elapsed):
    now = datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count()
    lines = [
        '# Cost of `--check-replicas 1` (checking the replicas after every step)',
        '',
        'Written by `benchmarks/replica_check.py` (one run, %.0f s); do not edit by hand.'
        % elapsed,
        '',
        '- date: %s' % now,
        '- machine: %s, %s usable cores, %s; Python %s, MXNet %s, numpy %s'
        % (cpu_model(), cores, platform.platform(), platform.python_version(), mx.__version__,
           np.__version__),
        '- OMP_NUM_THREADS=%s; load average at the end: %s (the machine is shared: other '
        'people\'s jobs slow some steps down, which is why the variants alternate)'
        % (os.environ.get('OMP_NUM_THREADS', 'unset'),
           ', '.join('%.1f' % x for x in os.getloadavg())),
        '- setting: the chapter\'s ResNet-18, hybridized (`static_alloc=True`, the CLI\'s '
        'default), devices [cpu(0), cpu(1)], SGD lr 0.1, real Fashion-MNIST images',
        '- one timed unit: `train_epoch` over %s step(s) (per batch size), divided by the steps; '
        'plain and checked units alternate (plain, checked, checked, plain, ...) on the same '
        'network after one warm-up unit; wall-clock time and this process\'s CPU time'
        % args.steps,
        '- the check: `assert_replicas_match(net)` after every `trainer.step` (the `ReplicaCheck(1)` event handler): all '
        '110 parameter arrays of both devices copied to the host and compared with numpy',
        '',
        '| global batch (per device) | pairs | plain step | checked step | paired ratio, '
        'median [quartiles] | CPU time: paired ratio | ratio of medians | check alone | '
        'check alone / fastest plain step |',
        '| --- | --- | --- | --- | --- | --- | --- | --- | --- |',
    ]
    verdicts = []
    for r in results:
        plain, checked = statistics.median(r['plain']), statistics.median(r['checked'])
        paired, q1, q3 = _paired(r['plain'], r['checked'])
        cpu_paired, _, _ = _paired(r['plain_cpu'], r['checked_cpu'])
        alone = statistics.median(r['alone'])
        lines.append('| %d (%d) | %d | %.3f s | %.3f s | %.3f [%.3f, %.3f] | %.3f | %.3f | '
                     '%.1f ms | %.1f%% |'
                     % (r['batch_size'], r['batch_size'] // 2, r['pairs'], plain, checked,
                        paired, q1, q3, cpu_paired, checked / plain, alone * 1e3,
                        100 * alone / min(r['plain'])))
        fastest = min(r['plain'])
        direct = alone / fastest
        resolved = r['pairs'] >= MIN_PAIRS
        within = direct <= 0.05 and (not resolved or paired - 1 <= 0.05)
        verdicts.append(
            '- global batch %d: the check takes %.1f ms, %.1f%% of the fastest plain step '
            '(%.3f s); end to end, %s: %s the 5%% budget'
            % (r['batch_size'], alone * 1e3, 100 * direct, fastest,
               ('the median of %d paired ratios is %.3f (quartiles %.3f, %.3f)'
                % (r['pairs'], paired, q1, q3)) if resolved else
               ('%d pair(s) are too few to resolve 5%% on a shared machine (paired ratios %s), '
                'so this rests on the check\'s own time'
                % (r['pairs'], ', '.join('%.3f' % (c / p) for p, c in zip(r['plain'],
                                                                          r['checked'])))),
               'within' if within else 'OVER'))
    lines += ['', 'Times are medians of seconds per step (wall clock). Each pair ran back to back, '
              'so the paired ratio cancels the slow phases caused by other jobs on the machine; '
              'the ratio of the two medians does not (step times vary severalfold between quiet '
              'and busy phases, see the raw numbers, so the two medians can fall in different '
              'phases). "Check '
              'alone" is `assert_replicas_match(net)` timed %d times between steps; its cost '
              'depends on the number of parameters, not on the batch size. The check runs '
              'between two steps and waits for the first to finish, so what it adds is its own '
              'time plus the few milliseconds of Python that would otherwise overlap with the '
              'computation; compared with the fastest plain step that is a conservative '
              'estimate. The paired ratio measures everything end to end but needs many pairs '
              '(at least %d here) to resolve a few per cent.'
              % (args.check_repeats, MIN_PAIRS), '', '## Result', ''] + verdicts + [
              '', '## Raw numbers (seconds per step, pair by pair: the i-th plain and the i-th '
              'checked unit ran back to back)', '']
    for r in results:
        b = r['batch_size']
        for key, label in (('plain', 'plain, wall'), ('checked', 'checked, wall'),
                           ('plain_cpu', 'plain, CPU'), ('checked_cpu', 'checked, CPU')):
            lines.append('- batch %d, %s: %s' % (b, label, ', '.join('%.3f' % t for t in r[key])))
        lines.append('- batch %d, check alone (ms): %s'
                     % (b, ', '.join('%.1f' % (t * 1e3) for t in r['alone'])))
        lines.append('- batch %d, last report: `%s`' % (b, r['summary']))
    lines += ['', 'Reproduce: `OMP_NUM_THREADS=%s python benchmarks/replica_check.py '
              '--batch-sizes %s --pairs %s --steps %s`.'
              % (os.environ.get('OMP_NUM_THREADS', '2'), args.batch_sizes, args.pairs,
                 args.steps), '']
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, 'w') as f:
        f.write('\n'.join(lines))


def main(argv=None):
    args = parse_args(argv)
    batch_sizes = [int(b) for b in args.batch_sizes.split(',')]
    pairs = [int(p) for p in args.pairs.split(',')]
    steps = [int(s) for s in args.steps.split(',')]
    if not len(pairs) == len(steps) == len(batch_sizes):
        sys.exit('--pairs and --steps need one number per batch size, got %s and %s for %s'
                 % (args.pairs, args.steps, args.batch_sizes))
    devices = [mx.cpu(0), mx.cpu(1)]
    x, y = data.load_fashion_mnist_arrays('train')
    n = max(b * k for b, k in zip(batch_sizes, steps))
    images, labels = data.to_tensor(x[:n]), y[:n].astype('float32')
    start = time.time()
    results = []
    for batch_size, n_pairs, n_steps in zip(batch_sizes, pairs, steps):
        r = measure(batch_size, n_pairs, n_steps, args.check_repeats, devices, images, labels)
        results.append(r)
        print('batch %d: plain %s, checked %s, check alone %.1f ms'
              % (batch_size, statistics.median(r['plain']), statistics.median(r['checked']),
                 1e3 * statistics.median(r['alone'])), flush=True)
    write_markdown(args.out, results, args, time.time() - start)
    print('wrote', args.out)


if __name__ == '__main__':
    main()
