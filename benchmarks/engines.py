"""Two simulated devices on one CPU: do MXNet's engine or thread settings make them cheaper?

    .venv/bin/python benchmarks/engines.py      # about 6 minutes on 2 cores; writes docs/engines.md

Two CPU contexts share the same cores. By default MXNet runs each context's operations on its
own engine worker, each with OMP_NUM_THREADS threads, so the two devices' operations can run at
the same time and compete for the cores. This measures the hybridized training step (global
batch 256, as benchmarks/run.py) on 1 device with the package's settings, against 2 devices with
the package's settings and with the alternatives: one OpenMP thread per device, MXNet's pooled
engine with one CPU worker (the devices' operations run one at a time, each on all cores), and
the synchronous NaiveEngine. Each measurement is a fresh process; settings alternate.
"""
import argparse
import datetime
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import run  # noqa: E402  (benchmarks/run.py: measure, machine)

BASE = dict(kind='train', model='ours', mode='hybrid', loop='ours', loader='array',
            threads='package', batch_size=run.GLOBAL_BATCH)
SETTINGS = {
    '1 device, package settings (OMP_NUM_THREADS = cores)': dict(devices=1),
    '2 devices, package settings': dict(devices=2),
    '2 devices, OMP_NUM_THREADS=1 (one thread per device)': dict(
        devices=2, env={'OMP_NUM_THREADS': '1'}),
    '2 devices, MXNET_ENGINE_TYPE=ThreadedEngine, MXNET_CPU_WORKER_NTHREADS=1': dict(
        devices=2, env={'MXNET_ENGINE_TYPE': 'ThreadedEngine', 'MXNET_CPU_WORKER_NTHREADS': '1'}),
    '2 devices, MXNET_ENGINE_TYPE=NaiveEngine': dict(
        devices=2, env={'MXNET_ENGINE_TYPE': 'NaiveEngine'}),
}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--repeats', type=int, default=2, help='repeats per setting (default: 2)')
    p.add_argument('--steps', type=int, default=3, help='timed steps per measurement (default: 3)')
    p.add_argument('--out', default=os.path.join(run.ROOT, 'docs', 'engines.md'))
    args = p.parse_args(argv)
    results = {name: [] for name in SETTINGS}
    for r in range(args.repeats):
        for name, cfg in SETTINGS.items():
            value = run.measure(dict(BASE, steps=args.steps, warmup=1, **cfg))['value']
            results[name].append(value)
            print('%-75s run %d: %6.1f images/s' % (name, r + 1, value), flush=True)
    best = {k: max(v) for k, v in results.items()}
    base = best['1 device, package settings (OMP_NUM_THREADS = cores)']
    info = run.machine()
    lines = ['# Two simulated devices: engine and thread settings', '',
             'Written by `benchmarks/engines.py` on %s; do not edit by hand.'
             % datetime.date.today().isoformat(), '',
             'Machine: %(cpu)s, %(cores)d usable cores; MXNet %(mxnet)s. Load average at the '
             'end: %(load)s (the machine is shared).' % info, '',
             'Hybridized ResNet-18 training step, global batch %d, %d timed steps after 1 '
             'warm-up, images/s, best of %d fresh processes (raw numbers last); ratio to 1 '
             'device with the package\'s settings, measured in this same run.'
             % (run.GLOBAL_BATCH, args.steps, args.repeats), '',
             '| setting | images/s | x 1 device | raw |', '| --- | ---: | ---: | --- |']
    for name in SETTINGS:
        lines.append('| %s | %.1f | %.2f | %s |' % (name, best[name], best[name] / base,
                                                    ', '.join('%.1f' % v for v in results[name])))
    run.write_report(args.out, lines)


if __name__ == '__main__':
    main()
