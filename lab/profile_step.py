"""Where a training step's time goes, operator by operator. Writes docs/profile.md.

    .venv/bin/python lab/profile_step.py        # about 3 minutes on 2 cores

The chapter's ResNet-18, hybridized (the package's default), global batch 256 on 1 device and
on 2 simulated devices ([cpu(0), cpu(1)]), the package's thread settings, one fresh process
each. Two passes per device count, each in its own process:

- MXNet's profiler (``mx.profiler``, ``aggregate_stats``): every operator's count and time, over
  ``--steps`` steps after a warm-up step. The same process first times ``--steps`` steps with
  the profiler off, so the profiler's own cost shows.
- oneDNN's verbose mode (``DNNL_VERBOSE=1``): every oneDNN primitive executed in one step, with
  its time. Layout reorders (``reorder``) are not MXNet operators, so the profiler counts them
  inside the operators that need them; this pass shows them apart.

Every timed interval records the process's CPU time against the wall time and the cores the
rest of the machine kept busy meanwhile (lab/measuring.py).
"""
import argparse
import collections
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from measuring import DISTURBED_CORES, Interval  # noqa: E402

MARK = 'PROFILE-STEP-MARK'

# Operator name -> what it is in the chapter's step. Anything else: "other".
CATEGORIES = [
    ('convolution, forward', ('Convolution',)),
    ('convolution, backward', ('_backward_Convolution',)),
    ('BatchNorm, forward', ('BatchNorm',)),
    ('BatchNorm, backward', ('_backward_BatchNorm',)),
    ('activation (ReLU), forward and backward', ('Activation', '_backward_Activation', 'relu',
                                                 '_backward_relu')),
    ('residual add, forward', ('elemwise_add', '_plus', 'broadcast_add', '_add')),
    ('sums of gradients (branches; on 2 devices also the reduction)',
     ('ElementwiseSum', 'add_n', '_grad_add', '_backward_add')),
    ('SGD update', ('sgd_update', 'multi_sgd_update', 'preloaded_multi_sgd_update',
                    'sgd_mom_update', 'multi_sgd_mom_update')),
    ('copies', ('CopyCPU2CPU', '_copyto', '_copy', '_backward_copy', 'Reshape', '_mkldnn_reorder')),
    ('pooling, dense layer, loss', ('Pooling', '_backward_Pooling', 'FullyConnected',
                                    '_backward_FullyConnected', 'log_softmax',
                                    '_backward_log_softmax', 'pick', '_backward_pick',
                                    'SoftmaxOutput', '_backward_SoftmaxOutput', 'mean',
                                    '_backward_mean', 'negative', '_backward_negative')),
]


def category(op):
    for name, ops in CATEGORIES:
        if op in ops:
            return name
    return 'other'


def worker(args):
    """One pass in this process; prints one JSON line (profiler) or verbose lines + JSON."""
    import gluon_mgpu  # noqa: F401  (first: it sets MXNet's thread count)
    import mxnet as mx
    from mxnet import nd
    from mxnet.gluon import loss as gloss
    devices = [mx.cpu(i) for i in range(args.devices)]
    net = gluon_mgpu.new_network('resnet18', True)
    trainer = gluon_mgpu.init_training(net, devices, gluon_mgpu.book_setting(1)[1], seed=0)
    loss = gloss.SoftmaxCrossEntropyLoss()
    batches, _ = gluon_mgpu.load_data_fashion_mnist(
        args.batch_size, train_limit=args.batch_size * (1 + 2 * args.steps), test_limit=1, seed=0)
    it = iter(batches)

    def steps(count):  # what train() runs on these devices (train_epoch's step), count times
        meter = Interval().start()
        gluon_mgpu.train_epoch(net, itertools.islice(it, count), loss, trainer, devices)
        nd.waitall()
        record = meter.stop()
        return dict(record, images_per_s=args.batch_size * count / record['wall'])

    steps(1)  # warm-up: memory, the graph, oneDNN's primitives
    if args.pass_ == 'verbose':
        import ctypes
        libc = ctypes.CDLL(None)
        libc.fflush(None)
        print(MARK, flush=True)
        timed = steps(1)
        libc.fflush(None)
        print(MARK, flush=True)
        print(json.dumps({'timed': timed}), flush=True)
        return
    plain = steps(args.steps)
    mx.profiler.set_config(profile_all=True, aggregate_stats=True,
                           filename=os.path.join(tempfile.mkdtemp(), 'profile.json'))
    mx.profiler.set_state('run')
    profiled = steps(args.steps)
    mx.profiler.set_state('stop')
    stats = json.loads(mx.profiler.dumps(format='json'))
    print(json.dumps({'plain': plain, 'profiled': profiled,
                      'operators': stats['Time'].get('operator', {}),
                      'api': stats['Time'].get('MXNET_C_API', {})}), flush=True)


def parse_verbose(text):
    """oneDNN verbose lines of the timed step -> {'primitive (implementation)': [count, ms]}
    (e.g. 'convolution (jit:avx2)': the kernels follow the CPU's instruction set), and the
    details of the reorders: {(source layout, destination layout): [count, ms]}."""
    inside = text.split(MARK)
    lines = inside[1].splitlines() if len(inside) >= 3 else []
    kinds = collections.defaultdict(lambda: [0, 0.0])
    reorders = collections.defaultdict(lambda: [0, 0.0])
    for line in lines:
        fields = line.split(',')
        if len(fields) < 6 or not fields[0].endswith('_verbose') or fields[1] != 'exec':
            continue
        try:
            ms = float(fields[-1])
        except ValueError:
            continue
        kind = '%s (%s)' % (fields[3], fields[4])
        kinds[kind][0] += 1
        kinds[kind][1] += ms
        if fields[3] == 'reorder':
            layouts = [f for f in fields if 'src_' in f or 'dst_' in f]
            key = layouts[0] if layouts else '?'
            reorders[key][0] += 1
            reorders[key][1] += ms
    return dict(kinds), dict(reorders)


def run_pass(devices, pass_, steps, batch_size):
    env = dict(os.environ)
    if pass_ == 'verbose':
        env.update(DNNL_VERBOSE='1', MKLDNN_VERBOSE='1', ONEDNN_VERBOSE='1')
    out = subprocess.run([sys.executable, __file__, '--worker', '--devices', str(devices),
                          '--pass', pass_, '--steps', str(steps),
                          '--batch-size', str(batch_size)],
                         capture_output=True, text=True, cwd=ROOT, env=env, timeout=900)
    if out.returncode != 0:
        raise RuntimeError('profile_step %s pass on %d device(s) failed:\n%s'
                           % (pass_, devices, out.stderr[-3000:]))
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if pass_ == 'verbose':
        result['kinds'], result['reorders'] = parse_verbose(out.stdout)
    return result


def interval_text(r):
    return '%.1f images/s (CPU/wall %.2f, others %.2f cores%s)' % (
        r['images_per_s'], r['cpu_per_wall'], r['others_cores'],
        ', **disturbed**' if r['disturbed'] else '')


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--steps', type=int, default=2, help='profiled steps (default: 2)')
    p.add_argument('--batch-size', type=int, default=256, help='global batch (default: 256)')
    p.add_argument('--out', default=os.path.join(ROOT, 'docs', 'profile.md'))
    p.add_argument('--device-counts', type=int, nargs='+', default=[1, 2], choices=[1, 2],
                   help='profile on these numbers of devices (default: 1 2)')
    # The worker's own: one pass on one device count.
    p.add_argument('--worker', action='store_true', help=argparse.SUPPRESS)
    p.add_argument('--devices', type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument('--pass', dest='pass_', default='profiler', help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if args.worker:
        return worker(args)
    start = time.time()
    results = {}
    for devices, pass_ in [(n, p) for n in args.device_counts for p in ('profiler', 'verbose')]:
        r = results[devices, pass_] = run_pass(devices, pass_, args.steps, args.batch_size)
        print('%d device(s), %s: %s' % (devices, pass_, interval_text(
            r['profiled'] if pass_ == 'profiler' else r['timed'])), flush=True)
    import run  # lab/run.py: machine, write_report
    info = run.machine()
    lines = ['# Where a training step\'s time goes', '',
             'Written by `lab/profile_step.py` (one run, %.0f s); do not edit by hand.'
             % (time.time() - start), '',
             '- date: %s' % run.utc_now(),
             '- machine: %s, %d usable cores, %s; Python %s, MXNet %s. Load average at the end: '
             '%s.' % (run.cpu_line(info), info['cores'], info['platform'], info['python'],
                      info['mxnet'], info['load']),
             '- the chapter\'s ResNet-18, hybridized (`static_alloc`), global batch %d, SGD, '
             'real Fashion-MNIST batches, the package\'s thread settings; one fresh process per '
             'pass, one warm-up step first. A timed interval is **disturbed** when the rest of '
             'the machine kept more than %.1f cores busy on average during it.'
             % (args.batch_size, DISTURBED_CORES), '']
    for devices in args.device_counts:
        prof, verbose = results[devices, 'profiler'], results[devices, 'verbose']
        ops = prof['operators']
        total = sum(o['Total'] for o in ops.values())
        wall_ms = 1000 * prof['profiled']['wall'] / args.steps
        lines += ['## %s' % ('1 device' if devices == 1 else '2 simulated devices, '
                             '[cpu(0), cpu(1)], %d images each' % (args.batch_size // 2)), '',
                  '- without the profiler: %s, %d steps' % (interval_text(prof['plain']),
                                                            args.steps),
                  '- with the profiler: %s, %d steps: %.0f ms per step, of which the '
                  'operators\' times add up to %.0f ms (%.0f%%%s)'
                  % (interval_text(prof['profiled']), args.steps, wall_ms,
                     total / args.steps, 100 * total / args.steps / wall_ms,
                     '; the two devices\' operators run at the same time, so they can add up '
                     'to more than the wall time' if devices > 1 else ''),
                  '- oneDNN verbose pass (1 step): %s' % interval_text(verbose['timed']), '',
                  'By what the operators do (ms per step, share of the operators\' total):', '',
                  '| what | ms per step | share | operators |', '| --- | ---: | ---: | --- |']
        by_cat = collections.defaultdict(lambda: [0.0, []])
        for op, o in ops.items():
            c = by_cat[category(op)]
            c[0] += o['Total']
            c[1].append(op)
        for name, (ms, names) in sorted(by_cat.items(), key=lambda kv: -kv[1][0]):
            lines.append('| %s | %.1f | %.1f%% | %s |' % (
                name, ms / args.steps, 100 * ms / total, ', '.join('`%s`' % n for n in names)))
        lines += ['', 'Every operator (the profiler\'s aggregate table, per step):', '',
                  '| operator | calls | ms | share | avg ms per call | what |',
                  '| --- | ---: | ---: | ---: | ---: | --- |']
        for op, o in sorted(ops.items(), key=lambda kv: -kv[1]['Total']):
            lines.append('| `%s` | %g | %.1f | %.1f%% | %.3f | %s |' % (
                op, o['Count'] / args.steps, o['Total'] / args.steps,
                100 * o['Total'] / total, o['Avg'], category(op)))
        kinds = verbose['kinds']
        ktotal = sum(ms for _, ms in kinds.values())
        lines += ['', 'oneDNN primitives in one step (verbose mode; its own cost is in the '
                  'times):', '']
        if not kinds:
            lines.append('(no oneDNN verbose lines were found: the verbose mode did not print)')
        else:
            lines += ['| primitive | calls | ms | share |', '| --- | ---: | ---: | ---: |']
            for kind, (count, ms) in sorted(kinds.items(), key=lambda kv: -kv[1][1]):
                lines.append('| %s | %d | %.1f | %.1f%% |' % (kind, count, ms, 100 * ms / ktotal))
            reorders = sorted(verbose['reorders'].items(), key=lambda kv: -kv[1][1])[:8]
            if reorders:
                lines += ['', 'The costliest reorders (source and destination layouts: '
                          'calls, ms):', '']
                lines += ['- `%s`: %d, %.1f ms' % (k, c, ms) for k, (c, ms) in reorders]
        lines.append('')
    lines += ['Reproduce: `.venv/bin/python lab/profile_step.py --steps %d --batch-size %d%s`.'
              % (args.steps, args.batch_size, '' if args.device_counts == [1, 2] else
                 ' --device-counts %s' % ' '.join(map(str, args.device_counts)))]
    run.write_report(args.out, '\n'.join(lines) + '\n')


if __name__ == '__main__':
    main()
