"""Cheap candidates for a faster step, measured side by side. Writes docs/candidates.md.

    .venv/bin/python benchmarks/candidates.py                 # about 7 minutes on 2 cores
    .venv/bin/python benchmarks/candidates.py --group 1       # the 1-device ones only
    .venv/bin/python benchmarks/candidates.py --group bnrelu  # BatchNorm+ReLU fused, 1 device
    .venv/bin/python benchmarks/candidates.py --report-only   # the report from the records

The raw records are kept in docs/records/candidates.json; ``--group`` measures one group again and
keeps the other's records, so the report can be made in two runs of a few minutes each.

Each candidate is an MXNet environment variable, so nothing in the package changes to try it:

- ``MXNET_OPTIMIZER_AGGREGATION_SIZE=32``: SGD updates 32 parameters per ``multi_sgd_update``
  call instead of 4 (1 device: the Trainer updates; on 2 devices the kvstore updates each
  parameter alone, so it cannot matter there).
- engine bulking: ``MXNET_EXEC_BULK_EXEC_TRAIN=0`` (off; on by default) and
  ``MXNET_EXEC_BULK_EXEC_MAX_NODE_TRAIN_FWD/BWD=1000`` (segments of up to 1000 operators
  instead of 15).
- Residual's ReLUs (group ``relu``): the package computes them as ``F.Activation(x,
  act_type='relu')`` (oneDNN); a patch in benchmarks/worker.py puts back the book's ``F.relu``
  (the same values, MXNet's own kernel) to show what that choice is worth.
- Threads and scratch buffers for 2 simulated devices (group ``threads``): one OpenMP thread per
  device with a larger scratch-buffer pool, against the package's settings.
- BatchNorm+ReLU as one oneDNN operator (group ``bnrelu``; benchmarks/bnrelu.py, with the
  fence after every backward that its running statistics need, docs/bn-relu-race.md).
- 2 simulated devices: ``MXNET_CPU_TEMP_COPY=16`` (all CPU contexts share one pool of scratch
  buffers, 4 by default), alone and with one OpenMP thread per device (``OMP_NUM_THREADS=1``).

The hybridized training step of benchmarks/run.py (ResNet-18, global batch 256, the package's
threads unless the setting says otherwise), one fresh process per measurement, the settings
interleaved; each records its CPU time against the wall time and the others' load
(benchmarks/measuring.py), and a disturbed one is measured again (``--retries``).
"""
import argparse
import itertools
import json
import os
import sys
from statistics import median

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import run  # noqa: E402  (benchmarks/run.py: config, measure_until_quiet, machine, write_report)
from measuring import TABLE_HEADER, TABLE_LEGEND, summarize, table_row  # noqa: E402

CORES = len(os.sched_getaffinity(0))
BULK_OFF = {'env': {'MXNET_EXEC_BULK_EXEC_TRAIN': '0'}}
BULK_BIG = {'env': {'MXNET_EXEC_BULK_EXEC_MAX_NODE_TRAIN_FWD': '1000',
                    'MXNET_EXEC_BULK_EXEC_MAX_NODE_TRAIN_BWD': '1000'}}


def _one_thread(env):
    """2 devices issued from one thread (the book's loop), with environment ``env``."""
    return {'devices': 2, 'loop': 'book', 'env': env}


def _with(config, env):
    """``config`` with more environment variables."""
    return dict(config, env=dict(config['env'], **env))


# The package's settings for 2 devices before the thread choice and the per-device issuing.
EARLIER = _one_thread({'OMP_NUM_THREADS': str(CORES)})
# group -> [(setting, what it adds to the worker's configuration)]; the first is the baseline.
# An environment variable goes in 'env'.
GROUPS = {
    '1': [('1 device, the package\'s settings', {}),
          ('1 device, MXNET_OPTIMIZER_AGGREGATION_SIZE=32',
           {'env': {'MXNET_OPTIMIZER_AGGREGATION_SIZE': '32'}}),
          ('1 device, MXNET_EXEC_BULK_EXEC_TRAIN=0 (no bulking)', BULK_OFF),
          ('1 device, MXNET_EXEC_BULK_EXEC_MAX_NODE_TRAIN_FWD/BWD=1000', BULK_BIG)],
    # Measured with the package's settings of the time, which these configurations pin: all
    # cores per device, and every device issued from one thread (the book's loop).
    '2': [('2 devices, the package\'s settings', EARLIER),
          ('2 devices, MXNET_CPU_TEMP_COPY=16',
           _with(EARLIER, {'MXNET_CPU_TEMP_COPY': '16'})),
          ('2 devices, MXNET_CPU_TEMP_COPY=16, OMP_NUM_THREADS=1 (one thread per device)',
           _with(EARLIER, {'MXNET_CPU_TEMP_COPY': '16', 'OMP_NUM_THREADS': '1'})),
          ('2 devices, MXNET_EXEC_BULK_EXEC_MAX_NODE_TRAIN_FWD/BWD=1000',
           _with(EARLIER, BULK_BIG['env']))],
    # Not an environment variable: Residual's ReLUs as the book writes them, F.relu (MXNet's own
    # kernel on plain NCHW, so every one costs two layout reorders around it; docs/profile.md),
    # against the package's F.Activation (oneDNN, in the convolutions' blocked layout).
    'relu': [('1 device, the package\'s settings (ReLU as F.Activation, oneDNN)', {}),
             ('1 device, the book\'s F.relu in Residual (a patch in worker.py)', {'relu': 'book'}),
             ('2 devices, the package\'s settings (F.Activation)', {'devices': 2}),
             ('2 devices, the book\'s F.relu', {'relu': 'book', 'devices': 2})],
    # Threads and scratch buffers for 2 simulated devices at the same global batch: MXNet runs
    # each CPU context on its own worker thread, but all of them draw scratch buffers from one
    # pool (MXNET_CPU_TEMP_COPY, 4 by default), and an operator holding a buffer makes any
    # other that drew the same one wait: with few buffers the devices take turns. Measured
    # while the package issued every device from one thread (the book's loop, pinned here).
    'threads': [('1 device, the package\'s settings (OMP_NUM_THREADS = cores)', {}),
                ('2 devices, the package\'s settings (cores // 2 threads each, '
                 'MXNET_CPU_TEMP_COPY=256)', _one_thread({'MXNET_CPU_TEMP_COPY': '256'})),
                ('2 devices, as before: all cores per device, MXNET_CPU_TEMP_COPY=4 (MXNet\'s)',
                 _one_thread({'OMP_NUM_THREADS': str(CORES), 'MXNET_CPU_TEMP_COPY': '4'})),
                ('2 devices, cores // 2 threads each, MXNET_CPU_TEMP_COPY=4 (MXNet\'s)',
                 _one_thread({'MXNET_CPU_TEMP_COPY': '4'})),
                ('2 devices, cores // 2 threads each, MXNET_CPU_TEMP_COPY=64',
                 _one_thread({'MXNET_CPU_TEMP_COPY': '64'})),
                ('2 devices, all cores per device, MXNET_CPU_TEMP_COPY=64',
                 _one_thread({'OMP_NUM_THREADS': str(CORES), 'MXNET_CPU_TEMP_COPY': '64'}))],
    # The same for the network run line by line (--no-hybridize), where Python dispatches
    # every operator of every device from one thread.
    'threads-imperative': [
        ('1 device, not hybridized, the package\'s settings', {'mode': 'imperative'}),
        ('2 devices, not hybridized, the package\'s settings (cores // 2 threads each)',
         dict(_one_thread({'MXNET_CPU_TEMP_COPY': '256'}), mode='imperative')),
        ('2 devices, not hybridized, all cores per device, MXNET_CPU_TEMP_COPY=4',
         dict(_one_thread({'OMP_NUM_THREADS': str(CORES), 'MXNET_CPU_TEMP_COPY': '4'}),
              mode='imperative'))],
    # Scratch buffers: MXNet keeps one pool for all CPU contexts per *issuing* thread, and gives
    # every graph node that asks for scratch space a fixed buffer of it, in turn, grown to what
    # oneDNN asked for on that thread. The package issues each device's calls from its own
    # thread (gluon_mgpu.runtime.dispatch): a pool of MXNet's 4 buffers per device. The book's loop
    # issues both devices from one thread: they share one pool, and need a big one (a buffer
    # per node) not to wait for each other, which costs memory and cache even on one device.
    'pool': [('1 device, the package\'s settings (MXNet\'s 4 scratch buffers)', {}),
             ('2 devices, the package\'s settings (each device issued from its own thread, '
              '4 buffers each)', {'devices': 2}),
             ('2 devices, issued from one thread (the book\'s loop), MXNET_CPU_TEMP_COPY=256 '
              '(the package\'s earlier setting)',
              {'devices': 2, 'loop': 'book', 'env': {'MXNET_CPU_TEMP_COPY': '256'}}),
             ('2 devices, issued from one thread (the book\'s loop), 4 buffers (MXNet\'s)',
              {'devices': 2, 'loop': 'book'}),
             ('1 device, MXNET_CPU_TEMP_COPY=256',
              {'env': {'MXNET_CPU_TEMP_COPY': '256'}}),
             ('1 device, not hybridized', {'mode': 'imperative'}),
             ('2 devices, not hybridized, the package\'s settings',
              {'mode': 'imperative', 'devices': 2})],
    # Not an environment variable: BatchNorm+ReLU as one oneDNN operator (benchmarks/bnrelu.py:
    # the stem's and every block's first), with the fence its running statistics need
    # (docs/bn-relu-race.md) after every backward.
    'bnrelu': [('1 device, the package\'s settings (BatchNorm, then F.Activation)', {}),
               ('1 device, BatchNorm+ReLU fused (_contrib_BatchNormWithReLU) and fenced',
                {'model': 'bnrelu'})],
}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--group', choices=list(GROUPS) + ['all'], default='all',
                   help='one group of candidates: 1 or 2 devices, ReLU, BatchNorm+ReLU, the '
                        'threads of 2 devices hybridized or not (default: all)')
    p.add_argument('--repeats', type=int, default=2, help='repeats per setting (default: 2)')
    p.add_argument('--retries', type=int, default=1,
                   help='measure a disturbed run again, at most this many times (default: 1)')
    p.add_argument('--report-only', action='store_true',
                   help='measure nothing; rewrite the report from the raw records')
    p.add_argument('--out', default=os.path.join(run.ROOT, 'docs', 'candidates.md'))
    args = p.parse_args(argv)
    groups = [] if args.report_only else list(GROUPS) if args.group == 'all' else [args.group]
    raw_path = run.records_of(args.out)
    raw = {'records': {}, 'runs': {}}
    if (args.report_only or args.group != 'all') and os.path.exists(raw_path):
        with open(raw_path) as f:
            raw = json.load(f)
    records = {}
    for g in groups:
        start = run.utc_now()
        for r, (name, extra) in itertools.product(range(args.repeats), GROUPS[g]):
            cfg = dict(run.config('ours-hyb-%s' % ('2' if g == '2' else '1')), **extra)
            for record in run.measure_until_quiet(cfg, args.retries):
                records.setdefault(name, []).append(dict(record, utc=run.utc_now()))
                print('%-80s run %d: %6.1f images/s, CPU/wall %.2f, others %.2f%s'
                      % (name, r + 1, record['value'], record['cpu_per_wall'],
                         record['others_cores'],
                         ' DISTURBED' if record['disturbed'] else ''), flush=True)
        raw['runs'][g] = '%s to %s' % (start, run.utc_now())
    raw['records'].update(records)
    with open(raw_path, 'w') as f:
        json.dump(raw, f, indent=1)
    records = raw['records']
    groups = [g for g in GROUPS if g in raw['runs']]
    info = run.machine()
    every = [rec for rs in records.values() for rec in rs]
    lines = ['# Cheap candidates for a faster step', '',
             'Written by `benchmarks/candidates.py` from the raw records in [%s](%s); do not '
             'edit by hand.' % ((run.records_link(args.out, raw_path),) * 2), '',
             '- machine: %(cpu)s, %(cores)d usable cores; MXNet %(mxnet)s. Load average when this '
             'report was written: %(load)s.' % info,
             '- %d measurements, %d disturbed (each measured again, up to %d more times).'
             % (len(every), sum(r['disturbed'] for r in every), args.retries),
             '- hybridized ResNet-18 training step, global batch %d, %d timed steps after %d '
             'warm-up steps (1 in the groups 1 and 2, measured before run.py took 2), images/s; '
             'in rounds (as many as n in the spread column), the settings of a table '
             'interleaved, one fresh process each. Ratios are of medians, to the first row of '
             'the same table. %s'
             % (run.GLOBAL_BATCH, run.config('ours-hyb-1')['steps'],
                run.config('ours-hyb-1')['warmup'], TABLE_LEGEND)]
    for g in groups:
        base = summarize(records[GROUPS[g][0][0]])['median']
        title = {'1': '1 device',
                 '2': '2 simulated devices (measured with the package\'s earlier thread '
                      'settings: all cores per device, 4 scratch buffers)',
                 'relu': 'ReLU: oneDNN (the package) against the book\'s F.relu',
                 'bnrelu': 'BatchNorm+ReLU fused',
                 'threads': 'Threads and scratch buffers for 2 simulated devices (measured '
                            'while the package issued every device from one thread and set '
                            'MXNET_CPU_TEMP_COPY=256: "the package\'s settings" here)',
                 'threads-imperative': 'The same, not hybridized (idem)',
                 'pool': 'A scratch-buffer pool per device: each device issued from its own '
                         'thread'}[g]
        lines += ['', '## %s (measured %s)' % (title, raw['runs'][g]), '',
                  TABLE_HEADER[0] % 'x first row', TABLE_HEADER[1]]
        lines += [table_row(name, records[name], base) for name, _ in GROUPS[g]]
        memory = [(name, [r['max_rss_mb'] for r in records[name] if 'max_rss_mb' in r])
                  for name, _ in GROUPS[g]]
        if all(m for _, m in memory):
            lines += ['', 'Peak memory of the measured process (max RSS, median), row by row: '
                      + ', '.join('%.1f' % (median(m) / 1024) for _, m in memory) + ' GB.']
    lines += ['', 'Reproduce: `.venv/bin/python benchmarks/candidates.py` (or one `--group` at '
              'a time).']
    run.write_report(args.out, lines)


if __name__ == '__main__':
    main()
