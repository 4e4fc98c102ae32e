"""Measure training, data and evaluation speed in ONE run and write docs/benchmarks.md.

    .venv/bin/python benchmarks/run.py            # about 10 minutes on 2 cores
    .venv/bin/python benchmarks/run.py --quick    # a smoke run with tiny step counts

Every measurement runs in a fresh process (benchmarks/worker.py), because MXNet reads its
thread settings once, at import. Configurations are interleaved and repeated, and the best of
the repeats is reported: the machine is noisy, so only ratios measured in the same run count.
"""
import argparse
import datetime
import json
import os
import platform
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
GLOBAL_BATCH = 256
GEMM_SIZE = 4096

# name -> (label, config). "book": the chapter's loop with d2lzh.resnet18, the DataLoader with
# ToTensor per image (4 workers, as d2lzh), and MXNet's default threads.
TRAIN = {
    'book-1': ('(a) book-style loop, d2lzh.resnet18, DataLoader, MXNet defaults, 1 device',
               dict(model='d2lzh', mode='imperative', loop='book', loader='book', threads='mxnet',
                    devices=1)),
    'book-2': ('(a) book-style loop, same, 2 devices',
               dict(model='d2lzh', mode='imperative', loop='book', loader='book', threads='mxnet',
                    devices=2)),
    'ours-imp-1': ('(b) ours, imperative (--no-hybridize), 1 device',
                   dict(model='ours', mode='imperative', loop='ours', loader='array',
                        threads='package', devices=1)),
    'ours-imp-2': ('(b) ours, imperative, 2 devices',
                   dict(model='ours', mode='imperative', loop='ours', loader='array',
                        threads='package', devices=2)),
    'ours-hyb-1': ('(c) ours, hybridized (default), 1 device',
                   dict(model='ours', mode='hybrid', loop='ours', loader='array',
                        threads='package', devices=1)),
    'ours-hyb-2': ('(c) ours, hybridized, 2 devices',
                   dict(model='ours', mode='hybrid', loop='ours', loader='array',
                        threads='package', devices=2)),
}
TORCH = {
    'torch-eager': ('(d) PyTorch edition resnet18, eager', dict(mode='eager')),
    'torch-cl': ('(d) PyTorch edition resnet18, eager, channels_last',
                 dict(mode='channels_last')),
    'torch-compile': ('(d) PyTorch edition resnet18, torch.compile', dict(mode='compile')),
}
OTHER = {
    'data-array': ('(e) data path alone: one float32 array, nd.take per batch',
                   dict(kind='data', loader='array', images=60000, threads='package')),
    'data-book': ("(e) data path alone: the book's DataLoader, ToTensor per image",
                  dict(kind='data', loader='book', images=10000, threads='package')),
    'eval-1': ('(g) evaluation, hybridized, 1 device',
               dict(kind='eval', devices=1, images=2048, threads='package')),
    'eval-1-mkldnn': ("(g) evaluation, the exported graph with MXNet's MKLDNN backend "
                      '(inference fusion), 1 device',
                      dict(kind='eval', devices=1, images=2048, threads='package',
                           backend='MKLDNN')),
}


def write_report(path, lines):
    """Write the report's lines to ``path`` and print them."""
    text = '\n'.join(lines) + '\n'
    with open(path, 'w') as f:
        f.write(text)
    print(text)


def measure(config):
    """Run one configuration in a fresh process; a "book" one gets MXNet's default threads."""
    env = dict(os.environ)
    if config.get('threads') == 'mxnet':
        env.pop('OMP_NUM_THREADS', None)
    env.update(config.get('env', {}))
    out = subprocess.run([sys.executable, os.path.join(HERE, 'worker.py'), json.dumps(config)],
                         capture_output=True, text=True, cwd=ROOT, env=env)
    if out.returncode != 0:
        raise RuntimeError('benchmark %s failed:\n%s' % (config, out.stderr[-3000:]))
    return json.loads(out.stdout.strip().splitlines()[-1])


def has_torch():
    try:
        import importlib.util
        return importlib.util.find_spec('torch') is not None
    except ValueError:
        return False


def machine():
    model = ''
    try:
        with open('/proc/cpuinfo') as f:
            model = next(l.split(':', 1)[1].strip() for l in f if l.startswith('model name'))
    except (OSError, StopIteration):
        pass
    import mxnet
    torch = ''
    if has_torch():
        import torch as _torch
        torch = ', PyTorch %s' % _torch.__version__
    return {'cpu': model or platform.processor(), 'cores': len(os.sched_getaffinity(0)),
            'python': platform.python_version(), 'mxnet': mxnet.__version__, 'torch': torch,
            'platform': platform.platform(),
            'load': ', '.join('%.1f' % x for x in os.getloadavg())}


# A training step of the chapter's ResNet-18 on a 28x28 image: forward 0.456 GMAC (counted from
# the layer shapes, see flops_per_image), backward twice that: 2.73 GFLOP.
def flops_per_image():
    """FLOP of one training step per image: 3 x 2 x the MACs of every convolution and dense layer."""
    import gluon_mgpu  # noqa: F401
    from mxnet import init, nd
    from mxnet.gluon import nn
    net = gluon_mgpu.resnet18(10)
    net.initialize(init.Normal(sigma=0.01))
    macs = []

    def hook(block, inputs, output):
        weight = block.weight.data()
        macs.append(output.size * (weight.size // weight.shape[0]))

    def walk(block):
        for child in block._children.values():
            if isinstance(child, (nn.Conv2D, nn.Dense)):
                child.register_forward_hook(hook)
            walk(child)
    walk(net)
    net(nd.zeros((1, 1, 28, 28)))
    return 6.0 * sum(macs)


def run(quick=False, repeats=2):
    steps, warmup = (1, 1) if quick else (3, 1)
    results, extra = {}, {}
    order = list(TRAIN) + (list(TORCH) if has_torch() else []) + list(OTHER)
    for r in range(1 if quick else repeats):
        for name in order:
            if name in TRAIN:
                cfg = dict(TRAIN[name][1], kind='train', batch_size=GLOBAL_BATCH,
                           steps=steps, warmup=warmup)
            elif name in TORCH:
                cfg = dict(TORCH[name][1], kind='torch', batch_size=GLOBAL_BATCH,
                           steps=steps, warmup=warmup + (1 if 'compile' in name else 0))
            else:
                cfg = dict(OTHER[name][1])
                if quick:
                    cfg['images'] = min(cfg['images'], 1024)
            value = measure(cfg)['value']
            results.setdefault(name, []).append(value)
            print('%-14s run %d: %8.1f images/s' % (name, r + 1, value), flush=True)
        gemm = measure(dict(kind='gemm', threads='package', size=GEMM_SIZE,
                            repeats=3 if quick else 10))
        extra.setdefault('gemm', []).append(gemm)
        print('fp32 gemm      run %d: MXNet %6.1f, numpy %6.1f GFLOP/s'
              % (r + 1, gemm['mxnet'] / 1e9, gemm['numpy'] / 1e9), flush=True)
    extra['flops_per_image'] = flops_per_image()
    return results, extra


def targets(best, extra):
    """The issue's targets, each as (target, measured, met?)."""
    rows = []

    def add(text, ratio, goal, fmt='%.2fx'):
        rows.append((text, fmt % ratio, ratio >= goal))
    add('ours (hybridized, 1 device) >= 2.5x the book-style loop (1 device)',
        best['ours-hyb-1'] / best['book-1'], 2.5)
    add('ours (hybridized, 2 devices) >= 2.5x the book-style loop (2 devices)',
        best['ours-hyb-2'] / best['book-2'], 2.5)
    if 'torch-compile' in best:
        add('ours (1 device) >= torch.compile', best['ours-hyb-1'] / best['torch-compile'], 1.0)
        add('ours (1 device) >= 1.6x PyTorch eager', best['ours-hyb-1'] / best['torch-eager'],
            1.6)
    add('2 simulated devices cost <= 10% against 1 (ratio 2 / 1 devices >= 0.90)',
        best['ours-hyb-2'] / best['ours-hyb-1'], 0.90)
    add('data path >= 100x the training rate', best['data-array'] / best['ours-hyb-1'], 100)
    add('evaluation >= 4x the training rate', best['eval-1'] / best['ours-hyb-1'], 4)
    add('evaluation with the MKLDNN backend >= 4x the training rate',
        best['eval-1-mkldnn'] / best['ours-hyb-1'], 4)
    return rows


def report(results, extra, info, date, quick=False):
    """Render docs/benchmarks.md from the raw results (best of the repeats)."""
    best = {k: max(v) for k, v in results.items()}
    labels = {k: v[0] for k, v in list(TRAIN.items()) + list(TORCH.items()) + list(OTHER.items())}
    base = best['book-1']
    lines = ['# Benchmarks', '',
             'Written by `benchmarks/run.py`%s on %s; do not edit by hand.'
             % (' --quick (NOT representative)' if quick else '', date), '',
             'Machine: %(cpu)s, %(cores)d usable cores; Python %(python)s, MXNet %(mxnet)s%(torch)s; '
             '%(platform)s. Load average at the end: %(load)s (the machine is shared).' % info, '',
             'The chapter\'s ResNet-18, one training step = forward, backward and '
             '`trainer.step`, global batch %d, images per second, best of the repeats '
             '(raw numbers in the last column). Every measurement is a fresh process; the '
             'settings alternate, so slow phases of the machine hit them alike. Ratios are to the '
             'book-style loop on 1 device, measured in this same run.' % GLOBAL_BATCH, '',
             '| setting | images/s | x book-style | raw |', '| --- | ---: | ---: | --- |']
    for name in results:
        lines.append('| %s | %.1f | %s | %s |' % (
            labels[name], best[name],
            '%.2f' % (best[name] / base) if name in TRAIN or name in TORCH else '',
            ', '.join('%.1f' % v for v in results[name])))
    if not any(n in results for n in TORCH):
        lines += ['', '(d) not measured: torch is not installed (`pip install torch==2.13.0`, '
                  'optional, for this benchmark only).']
    gemm = {lib: max(g[lib] for g in extra['gemm']) for lib in ('mxnet', 'numpy')}
    peak = max(gemm.values())
    limit = peak / extra['flops_per_image']
    lines += ['', '(f) The replica check has its own benchmark: benchmarks/replica_check.py, '
              'docs/replica-check.md.',
              '', '## Targets', '', '| target | measured | met |', '| --- | ---: | --- |']
    for text, measured, met in targets(best, extra):
        lines.append('| %s | %s | %s |' % (text, measured, 'yes' if met else '**no**'))
    lines += ['', '## How far from the FP32 limit', '',
              'A training step costs %.2f GFLOP per image (forward multiply-adds counted from '
              'the layer shapes, times 2 for FLOP, times 3 for forward plus backward). The '
              'fastest FP32 matrix product measured here (%d x %d, best of the repeats) reaches '
              '%.0f GFLOP/s with MXNet\'s oneDNN inner product and %.0f GFLOP/s with numpy '
              '(raw, MXNet / numpy: %s). Convolutions computed as matrix products cannot go '
              'faster, so about %.0f images/s is the FP32 limit of this step here (an algorithm '
              'that does fewer multiplications, such as Winograd, could pass it). Ours reaches '
              '%.1f images/s on 1 device: %.0f%% of that limit%s.'
              % (extra['flops_per_image'] / 1e9, GEMM_SIZE, GEMM_SIZE, gemm['mxnet'] / 1e9,
                 gemm['numpy'] / 1e9,
                 ', '.join('%.0f / %.0f' % (g['mxnet'] / 1e9, g['numpy'] / 1e9)
                           for g in extra['gemm']), limit, best['ours-hyb-1'],
                 100 * best['ours-hyb-1'] / limit,
                 '; torch.compile reaches %.0f%%' % (100 * best['torch-compile'] / limit)
                 if 'torch-compile' in best else '')]
    return '\n'.join(lines) + '\n'


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--quick', action='store_true', help='tiny step counts (smoke run)')
    p.add_argument('--repeats', type=int, default=2, help='repeats per setting (default: 2)')
    p.add_argument('--out', default=os.path.join(ROOT, 'docs', 'benchmarks.md'),
                   help='where to write the report (default: docs/benchmarks.md)')
    args = p.parse_args(argv)
    results, extra = run(args.quick, args.repeats)
    text = report(results, extra, machine(), datetime.date.today().isoformat(), args.quick)
    with open(args.out, 'w') as f:
        f.write(text)
    print(text)


if __name__ == '__main__':
    main()
