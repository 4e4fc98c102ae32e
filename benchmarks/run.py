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
    'torch-compile': ('(d) PyTorch edition resnet18, torch.compile', dict(mode='compile')),
}
OTHER = {
    'data-array': ('(e) data path alone: one float32 array, nd.take per batch',
                   dict(kind='data', loader='array', images=60000, threads='package')),
    'data-book': ("(e) data path alone: the book's DataLoader, ToTensor per image",
                  dict(kind='data', loader='book', images=10000, threads='package')),
    'eval-1': ('(g) evaluation, hybridized, 1 device',
               dict(kind='eval', devices=1, images=2048, threads='package')),
}


def measure(config):
    """Run one configuration in a fresh process; a "book" one gets MXNet's default threads."""
    env = dict(os.environ)
    if config.get('threads') == 'mxnet':
        env.pop('OMP_NUM_THREADS', None)
    out = subprocess.run([sys.executable, os.path.join(HERE, 'worker.py'), json.dumps(config)],
                         capture_output=True, text=True, cwd=ROOT, check=True, env=env)
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
    return {'cpu': model or platform.processor(), 'cores': len(os.sched_getaffinity(0)),
            'python': platform.python_version(), 'mxnet': mxnet.__version__,
            'platform': platform.platform()}


def run(quick=False, repeats=2):
    steps, warmup = (1, 1) if quick else (3, 1)
    results = {}
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
            result = measure(cfg)
            results.setdefault(name, []).append(result['images_per_sec'])
            print('%-14s run %d: %8.1f images/s' % (name, r + 1, result['images_per_sec']),
                  flush=True)
    return results


def report(results, info, date, quick=False):
    """Render docs/benchmarks.md from the raw results (best of the repeats)."""
    best = {k: max(v) for k, v in results.items()}
    labels = {k: v[0] for k, v in list(TRAIN.items()) + list(TORCH.items()) + list(OTHER.items())}
    base = best['book-1']
    lines = ['# Benchmarks', '',
             'Written by `benchmarks/run.py`%s on %s.' % (' --quick (NOT representative)'
                                                            if quick else '', date), '',
             'Machine: %(cpu)s, %(cores)d usable cores; Python %(python)s, MXNet %(mxnet)s; '
             '%(platform)s.' % info, '',
             'The chapter\'s ResNet-18, one training step = forward, backward and '
             '`trainer.step`, global batch %d, images per second, best of the repeats '
             '(raw numbers in the last column). Ratios are to the book-style loop on 1 device, '
             'measured in this same run.' % GLOBAL_BATCH, '',
             '| setting | images/s | x book-style | raw |', '| --- | ---: | ---: | --- |']
    for name in results:
        lines.append('| %s | %.1f | %s | %s |' % (
            labels[name], best[name],
            '%.2f' % (best[name] / base) if name in TRAIN or name in TORCH else '',
            ', '.join('%.1f' % v for v in results[name])))
    return '\n'.join(lines) + '\n'


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--quick', action='store_true', help='tiny step counts (smoke run)')
    p.add_argument('--repeats', type=int, default=2, help='repeats per setting (default: 2)')
    p.add_argument('--out', default=os.path.join(ROOT, 'docs', 'benchmarks.md'),
                   help='where to write the report (default: docs/benchmarks.md)')
    args = p.parse_args(argv)
    results = run(args.quick, args.repeats)
    text = report(results, machine(), datetime.date.today().isoformat(), args.quick)
    with open(args.out, 'w') as f:
        f.write(text)
    print(text)


if __name__ == '__main__':
    main()
