"""Measure training, data and evaluation speed in ONE run and write docs/benchmarks.md.

    .venv/bin/python lab/run.py            # about 15 minutes on 2 cores
    .venv/bin/python lab/run.py --quick    # a smoke run with tiny step counts
    .venv/bin/python lab/run.py --only book-1,ours-hyb-1,gemm   # a part: a few minutes
    .venv/bin/python lab/run.py --only ours-hyb-1,ours-bf16-1,...,gemm,gemm-bf16 \
        --out docs/bf16.md --title "bfloat16 against float32"   # docs/bf16.md (issue 23)

Every measurement runs in a fresh process (lab/worker.py), because MXNet reads its
thread settings once, at import. Configurations are interleaved and repeated. Each measurement
records its own CPU time against the wall time and the load of the rest of the machine over the
same interval (lab/measuring.py); a disturbed one is repeated (``--retries``) and kept,
marked. The report gives the median of the undisturbed runs with their spread, next to the best.

The raw records are kept in docs/records/benchmarks.json. ``--only NAMES`` measures those settings
again, replaces their records there and rewrites the report from all records: so a long run
can be done in parts of a few minutes each, and a disturbed part done again.
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
sys.path.insert(0, HERE)
from measuring import (DISTURBED_CORES, FP32_FLOP_PER_CYCLE, KERNEL_FLAGS,  # noqa: E402
                       TABLE_HEADER, TABLE_LEGEND, core_clock, cpu_generation, cpu_id, cpu_model,
                       kernel_setting, onednn_isa, raw_values, summarize, table_row)

GLOBAL_BATCH = 256
GEMM_SIZE = 4096

# name -> (label, config). "book": the chapter's loop with d2lzh.resnet18, the DataLoader with
# ToTensor per image (4 workers, as d2lzh), and MXNet's default threads.
_OURS = dict(model='ours', mode='hybrid', loop='ours', loader='array', threads='package', devices=1)
_BOOK = dict(_OURS, model='d2lzh', mode='imperative', loop='book', loader='book', threads='mxnet')
TRAIN = {
    'book-1': ('(a) book-style loop, d2lzh.resnet18, DataLoader, MXNet defaults, 1 device',
               _BOOK),
    'book-2': ('(a) book-style loop, same, 2 devices', dict(_BOOK, devices=2)),
    'ours-imp-1': ('(b) ours, imperative (--no-hybridize), 1 device',
                   dict(_OURS, mode='imperative')),
    'ours-imp-2': ('(b) ours, imperative, 2 devices', dict(_OURS, mode='imperative', devices=2)),
    'ours-hyb-1': ('(c) ours, hybridized (default), 1 device', _OURS),
    'ours-hyb-2': ('(c) ours, hybridized, 2 devices', dict(_OURS, devices=2)),
    'order-d2lzh': ("(c) ours, hybridized, 1 device, in the book's import order: d2lzh (so "
                    'MXNet) imported before gluon_mgpu', dict(_OURS, threads='d2lzh-first')),
    'order-d2lzh-omp': ('(c) the same, then MXSetNumOMPThreads(cores) (mx.base._LIB)',
                        dict(model='ours', mode='hybrid', loop='ours', loader='array',
                             threads='d2lzh-first', omp_after=True, devices=1)),
    'ours-bf16-1': ('(h) ours, hybridized, --dtype bfloat16 (MXNet AMP), 1 device',
                    dict(_OURS, dtype='bfloat16')),
    'ours-bf16-2': ('(h) ours, hybridized, --dtype bfloat16, 2 devices',
                    dict(_OURS, devices=2, dtype='bfloat16')),
}
# (i) A CPU without bfloat16 instructions (as Skylake to Cascade Lake), emulated by capping
# oneDNN's instruction set at AVX-512 without them (DNNL_MAX_CPU_ISA). Capped at AVX2, bfloat16
# does not run at all (docs/precision.md).
for _dtype, _name in (('float32', 'ours-hyb-1-avx512_core'),
                      ('bfloat16', 'ours-bf16-1-avx512_core')):
    TRAIN[_name] = ('(i) ours, hybridized, %s, 1 device, oneDNN capped at AVX-512 without '
                    'bfloat16 (DNNL_MAX_CPU_ISA=AVX512_CORE)' % _dtype,
                    dict(_OURS, dtype=_dtype, isa='AVX512_CORE'))
# (j) Settings within MXNet 1.9.1 tried for a faster float32 step (issue 50, on an AVX2 CPU).
# MXNet's pip wheel runs OpenMP with GNU libgomp, so its variables (not KMP_*) apply.
SETTINGS_TRIED = {
    'ours-hyb-1-bind': ('OpenMP threads pinned to cores (OMP_PROC_BIND=true, OMP_PLACES=cores)',
                        {'env': {'OMP_PROC_BIND': 'true', 'OMP_PLACES': 'cores'}}),
    'ours-hyb-1-spin': ('OpenMP threads spin between operators (OMP_WAIT_POLICY=ACTIVE)',
                        {'env': {'OMP_WAIT_POLICY': 'ACTIVE'}}),
    'ours-hyb-1-static': ('hybridize(static_alloc=True, static_shape=True)',
                          {'static_shape': True}),
}
for _name, (_what, _change) in SETTINGS_TRIED.items():
    TRAIN[_name] = ('(j) ours, hybridized, 1 device, %s' % _what,
                    dict(TRAIN['ours-hyb-1'][1], **_change))
TORCH = {
    'torch-eager': ('(d) PyTorch edition resnet18, eager', dict(mode='eager')),
    'torch-cl': ('(d) PyTorch edition resnet18, eager, channels_last',
                 dict(mode='channels_last')),
    'torch-compile': ('(d) PyTorch edition resnet18, torch.compile', dict(mode='compile')),
    'torch-bf16-eager': ("(h) PyTorch edition resnet18, eager, autocast('cpu', bfloat16)",
                         dict(mode='eager', dtype='bfloat16')),
    'torch-bf16-compile': ('(h) PyTorch edition resnet18, torch.compile, autocast bfloat16',
                           dict(mode='compile', dtype='bfloat16')),
}
_EVAL = dict(kind='eval', devices=1, images=2048, threads='package')
OTHER = {
    'data-array': ('(e) data path alone: one float32 array, nd.take per batch',
                   dict(kind='data', loader='array', images=60000, threads='package')),
    'data-book': ("(e) data path alone: the book's DataLoader, ToTensor per image",
                  dict(kind='data', loader='book', images=10000, threads='package')),
    'eval-1': ('(g) evaluation, hybridized, 1 device', _EVAL),
    'eval-bf16-1': ('(h) evaluation, hybridized, bfloat16, 1 device',
                    dict(_EVAL, dtype='bfloat16')),
    'eval-2': ('(g) evaluation, hybridized, 2 devices', dict(_EVAL, devices=2)),
    'eval-bf16-2': ('(h) evaluation, hybridized, bfloat16, 2 devices',
                    dict(_EVAL, devices=2, dtype='bfloat16')),
    'eval-1-mkldnn': ("(g) evaluation, the exported graph with MXNet's MKLDNN backend "
                      '(inference fusion), 1 device', dict(_EVAL, backend='MKLDNN')),
    'eval-1-fold': ('(g) evaluation, BatchNorm folded into the convolutions, 1 device',
                    dict(_EVAL, fold=True)),
    'eval-1-fold-mkldnn': ("(g) evaluation, BatchNorm folded, then MXNet's MKLDNN backend "
                           '(ReLU and the sum fused into the convolutions), 1 device',
                           dict(_EVAL, fold=True, backend='MKLDNN')),
}


# The raw records of the reports in docs/ are in docs/records/, beside no page.
RECORDS = os.path.join(ROOT, 'docs', 'records')


def records_of(report_path):
    """The raw records of the report ``report_path``: ``docs/records/NAME.json`` for a page
    ``docs/NAME.md``, else ``NAME.json`` beside the report."""
    folder, name = os.path.split(os.path.splitext(os.path.abspath(report_path))[0])
    return os.path.join(RECORDS if folder == os.path.dirname(RECORDS) else folder, name + '.json')


def records_link(report_path, raw_path):
    """``raw_path`` as the report ``report_path`` links to it: relative to the report."""
    return os.path.relpath(os.path.abspath(raw_path), os.path.dirname(os.path.abspath(
        report_path)))


def write_report(path, text):
    """Write the report's ``text`` to ``path`` and print it."""
    with open(path, 'w') as f:
        f.write(text)
    print(text)


def measure(config, timeout=900):
    """Run one configuration in a fresh process; a "book" one gets MXNet's default threads.

    Returns the worker's record: ``value`` and how its interval went (``wall``, ``cpu``,
    ``cpu_per_wall``, ``others_cores``, ``disturbed``; lab/measuring.py).
    """
    env = dict(os.environ)
    if config.get('threads') in ('mxnet', 'd2lzh-first'):
        env.pop('OMP_NUM_THREADS', None)
    env.update(config.get('env', {}))
    try:
        out = subprocess.run([sys.executable, os.path.join(HERE, 'worker.py'),
                              json.dumps(config)],
                             capture_output=True, text=True, cwd=ROOT, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RuntimeError('benchmark %s did not finish in %d s (a hang?)' % (config, timeout))
    if out.returncode != 0:
        raise RuntimeError('benchmark %s failed:\n%s' % (config, out.stderr[-3000:]))
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure_until_quiet(config, retries, measure_f=None):
    """``measure_f(config)`` (default ``measure``), again while disturbed, at most ``retries``
    more times: all records."""
    records = []
    for attempt in range(retries + 1):
        record = (measure_f or measure)(config)
        record['utc'] = utc_now()
        records.append(record)
        if not record['disturbed']:
            break
    return records


def utc_now():
    return datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')


def has_torch():
    try:
        import importlib.util
        return importlib.util.find_spec('torch') is not None
    except ValueError:
        return False


def machine():
    """This machine: the CPU (model, family, the vector instructions its kernels are picked by,
    what oneDNN and PyTorch say they run), cores, versions and the load average."""
    import mxnet
    torch, torch_isa = '', None
    if has_torch():
        import torch as _torch
        torch, torch_isa = ', PyTorch %s' % _torch.__version__, \
            _torch.backends.cpu.get_cpu_capability()
    return {'cpu': cpu_model(), 'cpu_id': cpu_id(), 'cpu_flags': kernel_setting()['cpu_flags'],
            'onednn_isa': onednn_isa(os.environ, ROOT), 'torch_isa': torch_isa,
            'cores': len(os.sched_getaffinity(0)), 'clock_ghz': core_clock(),
            'python': platform.python_version(), 'mxnet': mxnet.__version__, 'torch': torch,
            'platform': platform.platform(), 'load': load_average()}


def load_average():
    return ', '.join('%.1f' % x for x in os.getloadavg())


def cpu_line(info):
    """The CPU a report's figures were measured on, from ``machine()``'s record: its name,
    generation and vector instructions (float32 speed depends on them), or that a record made
    before they were kept does not say."""
    if 'cpu_flags' not in info:
        return '%s (its instruction set was not recorded by this run)' % info['cpu']
    flags = info['cpu_flags']
    said = [cpu_generation(info['cpu_id']) or info['cpu_id'],
            'vector instructions: %s' % (', '.join(flags) or 'none of %s' % ', '.join(
                KERNEL_FLAGS)) + ('' if 'avx512f' in flags else ', no AVX-512')]
    if info.get('onednn_isa'):
        said.append("MXNet's oneDNN runs %s" % info['onednn_isa'])
    if info.get('torch_isa'):
        said.append("PyTorch's kernels %s" % info['torch_isa'])
    return '%s (%s)' % (info['cpu'], '; '.join(s for s in said if s))


# A training step of the chapter's ResNet-18 on a 28x28 image: forward 0.456 GMAC (counted from
# the layer shapes, see flops_per_image), backward twice that: 2.73 GFLOP.
def flops_per_image():
    """FLOP of one training step per image: 3 x 2 x the MACs of each convolution and dense layer."""
    import gluon_mgpu  # noqa: F401
    from mxnet import init, nd
    from mxnet.gluon import nn
    net = gluon_mgpu.resnet18(10)
    net.initialize(init.Normal(sigma=0.01))
    macs = []

    def hook(block, inputs, output):
        if isinstance(block, (nn.Conv2D, nn.Dense)):
            weight = block.weight.data()
            macs.append(output.size * (weight.size // weight.shape[0]))
    net.apply(lambda block: block.register_forward_hook(hook))
    net(nd.zeros((1, 1, 28, 28)))
    return 6.0 * sum(macs)


GEMMS = {'gemm': 'float32', 'gemm-bf16': 'bfloat16'}
NAMES = list(TRAIN) + list(TORCH) + list(OTHER) + list(GEMMS)
# Measured on their own, next to ours-hyb-1, into docs/import-order.md (issue 21):
#   run.py --only ours-hyb-1,order-d2lzh,order-d2lzh-omp --out docs/import-order.md
IMPORT_ORDER = ('order-d2lzh', 'order-d2lzh-omp')


def config(name, quick=False):
    """The worker's configuration for setting ``name``."""
    # Two warm-up steps: after one, the next steps still ran 25% slower (oneDNN primitives and
    # the static graph's memory are set up over the first two).
    steps, warmup = (1, 1) if quick else (3, 2)
    if name in TRAIN:
        return dict(TRAIN[name][1], kind='train', batch_size=GLOBAL_BATCH, steps=steps,
                    warmup=warmup)
    if name in TORCH:
        return dict(TORCH[name][1], kind='torch', batch_size=GLOBAL_BATCH, steps=steps,
                    warmup=warmup + (1 if 'compile' in name else 0))
    if name in GEMMS:
        return dict(kind='gemm', threads='package', size=GEMM_SIZE, repeats=3 if quick else 10,
                    dtype=GEMMS[name])
    cfg = dict(OTHER[name][1])
    if quick:
        cfg['images'] = min(cfg['images'], 1024)
    return cfg


def run(names, quick=False, repeats=2, retries=1, save=None):
    """Measure ``names`` interleaved, ``repeats`` times; return every record (name, repeat).
    ``save(records)`` is called with the records so far after each measurement."""
    records = []
    for r in range(1 if quick else repeats):
        for name in names:
            for record in measure_until_quiet(config(name, quick), retries):
                records.append(dict(record, name=name, repeat=r + 1))
                print('%-18s run %d: %10.1f %s, CPU/wall %.2f, others %.2f cores%s'
                      % (name, r + 1, record['value'] / (1e9 if name in GEMMS else 1),
                         'GFLOP/s (MXNet)' if name in GEMMS else 'images/s',
                         record['cpu_per_wall'], record['others_cores'],
                         ' DISTURBED' if record['disturbed'] else ''), flush=True)
                if save:
                    save(records)
    return records


def targets(med, best):
    """The issue's targets, each as (target, measured on medians, on bests, met on medians?)."""
    rows = []

    def shown(ratio, goal):
        # A ratio that rounds to the goal is shown to 3 decimals: 0.995 is not "1.00x, no".
        return ('%.3fx' if '%.2f' % ratio == '%.2f' % goal else '%.2fx') % ratio

    def add(text, a, b, goal):
        if a in med and b in med:
            ratio = med[a] / med[b]
            rows.append((text, shown(ratio, goal), shown(best[a] / best[b], goal),
                         ratio >= goal))
    add('ours (hybridized, 1 device) >= 2.5x the book-style loop (1 device)',
        'ours-hyb-1', 'book-1', 2.5)
    add('ours (hybridized, 2 devices) >= 2.5x the book-style loop (2 devices)',
        'ours-hyb-2', 'book-2', 2.5)
    add('ours (1 device) >= torch.compile', 'ours-hyb-1', 'torch-compile', 1.0)
    add('ours (1 device) >= 1.6x PyTorch eager', 'ours-hyb-1', 'torch-eager', 1.6)
    add('2 simulated devices at least as fast as 1 at the same global batch (issue 15)',
        'ours-hyb-2', 'ours-hyb-1', 1.0)
    add("the book's import order (d2lzh first) as fast as the package first (issue 21)",
        'order-d2lzh', 'ours-hyb-1', 1.0)
    add('the same, then MXSetNumOMPThreads(cores)', 'order-d2lzh-omp', 'ours-hyb-1', 1.0)
    add('data path >= 100x the training rate', 'data-array', 'ours-hyb-1', 100)
    add('evaluation >= 3x the training rate (issue 15)', 'eval-1', 'ours-hyb-1', 3)
    add('evaluation with the MKLDNN backend >= 3x the training rate', 'eval-1-mkldnn',
        'ours-hyb-1', 3)
    add('evaluation, BatchNorm folded, >= 3x the training rate', 'eval-1-fold', 'ours-hyb-1', 3)
    add('evaluation, BatchNorm folded, MKLDNN backend, >= 3x the training rate',
        'eval-1-fold-mkldnn', 'ours-hyb-1', 3)
    add('ours bfloat16 (1 device) >= 1.5x ours float32 (1 device) (issue 23)', 'ours-bf16-1',
        'ours-hyb-1', 1.5)
    add('ours bfloat16 (2 devices) >= 1.5x ours float32 (2 devices) (issue 23)', 'ours-bf16-2',
        'ours-hyb-2', 1.5)
    add('ours bfloat16 (1 device) >= torch.compile with autocast bfloat16 (issue 23)',
        'ours-bf16-1', 'torch-bf16-compile', 1.0)
    add('evaluation bfloat16 >= 1.5x evaluation float32, 1 device', 'eval-bf16-1', 'eval-1',
        1.5)
    add('evaluation bfloat16 >= 1.5x evaluation float32, 2 devices', 'eval-bf16-2', 'eval-2',
        1.5)
    for name, (what, _) in SETTINGS_TRIED.items():
        add('ours (1 device) with %s faster than without' % what, name, 'ours-hyb-1', 1.0)
    # Not a goal: why --dtype bfloat16 refuses a CPU without bfloat16 instructions unless forced.
    add('bfloat16 >= float32 on a CPU without bfloat16 instructions (oneDNN capped at '
        'AVX512_CORE; --force-dtype)', 'ours-bf16-1-avx512_core', 'ours-hyb-1-avx512_core', 1.0)
    return rows


def import_order_line(path=os.path.join(RECORDS, 'import-order.json'), cpu=None):
    """The line of docs/benchmarks.md for the rows measured apart in docs/import-order.md; their
    figures only when they were measured on the CPU ``cpu`` names (a ``cpu_line``) if given."""
    line = ("(c) in the book's import order (d2lzh, so MXNet, imported before gluon_mgpu): "
            'measured on its own, next to (c) on 1 device, in [import-order.md](import-order.md)')
    try:
        with open(path) as f:
            raw = json.load(f)
        records = raw['records']
    except (OSError, ValueError, KeyError):
        return line + '.'
    if cpu is not None and cpu_line(raw.get('machine', {'cpu': '?'})) != cpu:
        return line + ', on another CPU.'
    med = {n: summarize([r for r in records if r['name'] == n])['median']
           for n in ('ours-hyb-1',) + IMPORT_ORDER if any(r['name'] == n for r in records)}
    if len(med) < 3:
        return line + '.'
    return line + (': %.1f images/s against %.1f with the package imported first, %.2fx; '
                   'MXSetNumOMPThreads(cores) after the import does not help: %.1f, %.2fx (%s).'
                   % (med['order-d2lzh'], med['ours-hyb-1'], med['order-d2lzh'] /
                      med['ours-hyb-1'], med['order-d2lzh-omp'],
                      med['order-d2lzh-omp'] / med['ours-hyb-1'], records[0]['utc']))


def current_parts(parts, replaced):
    """The earlier parts of a run that still hold records once the settings ``replaced`` are
    measured again (a part all of whose settings are measured again drops out of "when")."""
    def settings(part):
        return NAMES if part['what'] == 'all settings' else part['what'].split(', ')
    return [p for p in parts if any(n not in replaced for n in settings(p))]


def report(raw, raw_name='benchmarks.json'):
    """Render docs/benchmarks.md from the raw records (docs/records/benchmarks.json), linked as
    ``raw_name``."""
    by_name = {n: [r for r in raw['records'] if r['name'] == n] for n in NAMES}
    by_name = {n: rs for n, rs in by_name.items() if rs}
    stats = {n: summarize(rs) for n, rs in by_name.items()}
    med = {n: s['median'] for n, s in stats.items()}
    best = {n: s['best'] for n, s in stats.items()}
    labels = {k: v[0] for k, v in list(TRAIN.items()) + list(TORCH.items()) + list(OTHER.items())}
    info, runs = raw['machine'], raw['runs']
    every = raw['records']
    others = sorted(r['others_cores'] for r in every)
    n_disturbed = sum(r['disturbed'] for r in every)
    lines = ['# %s' % raw.get('title', 'Benchmarks'), '',
             'Written by `lab/run.py`%s from the raw records in '
             '[%s](%s); do not edit by hand.'
             % (' --quick (NOT representative)' if raw.get('quick') else '', raw_name, raw_name),
             '',
             '- when: %s, in %d part%s (%s)' % (
                 '%s to %s' % (runs[0]['start'], runs[-1]['end']), len(runs),
                 '' if len(runs) == 1 else 's',
                 '; '.join('%s to %s: %s' % (r['start'], r['end'], r['what']) for r in runs)),
             '- machine: %s, %d usable cores; Python %s, MXNet %s%s; %s' % (
                 cpu_line(info), info['cores'], info['python'], info['mxnet'], info['torch'],
                 info['platform']),
             '- **how quiet it was**: %d measurements, %d disturbed (the rest of the machine kept '
             'more than %.1f cores busy on average during the timed interval; each was measured '
             'again, up to %d more times). Others\' load per measurement: median %.2f, '
             'highest %.2f cores. Load average at the end of each part: %s. What /proc/stat '
             'cannot see is contention below this virtual machine (another one on the same '
             'physical cores, caches or memory): two quiet runs of one setting that differ, at '
             'the same CPU/wall, show it; read the spread.'
             % (len(every), n_disturbed, DISTURBED_CORES, raw['retries'],
                others[len(others) // 2], others[-1], '; '.join(r['load'] for r in runs)), '',
             'The chapter\'s ResNet-18, one training step = forward, backward and '
             '`trainer.step`, global batch %d, images per second. Every measurement is a fresh '
             'process; the settings alternate, so slow phases of the machine hit them alike. '
             '%s Ratios are of medians, to the book-style loop on 1 device measured in this '
             'same run.' % (GLOBAL_BATCH, TABLE_LEGEND), '',
             TABLE_HEADER[0] % 'x book-style', TABLE_HEADER[1]]
    base = med.get('book-1')
    for name, rs in by_name.items():
        if name not in GEMMS:
            lines.append(table_row(labels[name], rs,
                                   base if name in TRAIN or name in TORCH else None))
    per_core = per_core_line(stats)
    if per_core:
        lines += ['', per_core]
    if not any(n in by_name for n in TORCH) and not has_torch():
        lines += ['', '(d) not measured: torch is not installed (`pip install torch==2.13.0`, '
                  'optional, for this benchmark only).']
    missing = [n for n in NAMES if n not in by_name and n not in IMPORT_ORDER]
    if missing:
        lines += ['', '**Not measured in this run**: %s.' % ', '.join(missing)]
    if not any(n in by_name for n in IMPORT_ORDER):
        lines += ['', import_order_line(cpu=cpu_line(info))]
    lines += ['', '(f) The replica check has its own benchmark: benchmarks/replica_check.py, '
              '[replica-check.md](replica-check.md).',
              '', '## Targets', '',
              'Ratios of medians (the verdict) and of bests.', '',
              '| target | medians | bests | met |', '| --- | ---: | ---: | --- |']
    for text, m, b, met in targets(med, best):
        lines.append('| %s | %s | %s | %s |' % (text, m, b, 'yes' if met else '**no**'))
    if 'gemm' in by_name:
        gemm = by_name['gemm']
        g = stats['gemm']
        numpy = summarize([dict(r, value=r['numpy']) for r in gemm])
        limit = g['best'] / raw['flops_per_image']
        ours = stats.get('ours-hyb-1')
        lines += ['', '## Against the FP32 matrix product and the physical peak', '',
                  'A training step costs %.2f GFLOP per image (forward multiply-adds counted from '
                  'the layer shapes, times 2 for FLOP, times 3 for forward plus backward). The '
                  'fastest FP32 matrix product measured here (%d x %d, the best of several '
                  'products in each '
                  'process) reaches %.0f GFLOP/s with MXNet\'s oneDNN inner product (median '
                  '%.0f, CPU/wall %.2f, others %.2f; raw %s) and %.0f GFLOP/s with numpy (median '
                  '%.0f). At that rate this step would run at %.0f images/s: one program\'s rate, '
                  'not a limit (convolutions in other kernels can pass it; the physical peak, '
                  'when the run recorded the clock, is the limit).'
                  % (raw['flops_per_image'] / 1e9, GEMM_SIZE, GEMM_SIZE, g['best'] / 1e9,
                     g['median'] / 1e9, g['cpu_per_wall'], g['others_cores'], raw_values(gemm, 1e9),
                     numpy['best'] / 1e9, numpy['median'] / 1e9, limit)]
        if ours:
            lines[-1] += (' Ours reaches %.1f images/s on 1 device (median; best %.1f): %.0f%% '
                          'of that rate%s.' % (
                              ours['median'], ours['best'], 100 * ours['median'] / limit,
                              '; torch.compile %.0f%%' % (100 * med['torch-compile'] / limit)
                              if 'torch-compile' in med else ''))
        per_cycle = next((v for k, v in FP32_FLOP_PER_CYCLE.items()
                          if (info.get('cpu_id', '') + ',').startswith(k + ',')), None)
        if info.get('clock_ghz') and per_cycle:  # recorded since 2026-12-02
            peak = info['cores'] * info['clock_ghz'] * per_cycle
            lines += ['', 'The physical peak: %d cores x %.2f GHz (a core\'s clock while it '
                      'works, measured at the start of this run: lab/measuring.py core_clock) x %d '
                      'float32 FLOP per cycle (measuring.FP32_FLOP_PER_CYCLE) = %.0f GFLOP/s, %.0f '
                      'images/s. The matrix product reaches %.0f%% of it%s.' % (
                          info['cores'], info['clock_ghz'], per_cycle, peak,
                          peak * 1e9 / raw['flops_per_image'], 100 * g['best'] / 1e9 / peak,
                          ', ours %.0f%% (median)' % (100 * ours['median'] * raw['flops_per_image']
                                                      / 1e9 / peak) if ours else '')]
    for name in GEMMS:
        if name in by_name and all(r['disturbed'] for r in by_name[name]):
            lines += ['', '**%s was disturbed in every run** (its CPU/wall is below the cores '
                      'this machine has), so its GFLOP/s and the limit drawn from it are too low; '
                      'the ratio of two products measured at the same share of the machine still '
                      'holds.' % name]
    if 'gemm-bf16' in by_name:
        g16, rs = stats['gemm-bf16'], by_name['gemm-bf16']
        limit16 = g16['best'] / raw['flops_per_image']
        lines += ['', '## Against the bfloat16 matrix product', '',
                  'The same %d x %d product on bfloat16 operands (MXNet\'s oneDNN inner '
                  'product, which computes the convolutions and dense layers under '
                  '`--dtype bfloat16`) reaches %.0f GFLOP/s (best; median %.0f, CPU/wall %.2f, '
                  'others %.2f; raw %s)%s. At that rate the step\'s multiply-adds would take '
                  '%.0f images/s in bfloat16: one program\'s rate, not a limit (BatchNorm, '
                  'ReLU, the casts and the float32 update come on top of it).'
                  % (GEMM_SIZE, GEMM_SIZE, g16['best'] / 1e9, g16['median'] / 1e9,
                     g16['cpu_per_wall'], g16['others_cores'], raw_values(rs, 1e9),
                     ': %.2fx the FP32 product of this run' % (g16['best'] / stats['gemm']['best'])
                     if 'gemm' in stats else '', limit16)]
        ours16 = stats.get('ours-bf16-1')
        if ours16:
            lines[-1] += (' Ours in bfloat16 reaches %.1f images/s on 1 device (median; best '
                          '%.1f): %.0f%% of that rate%s.' % (
                              ours16['median'], ours16['best'], 100 * ours16['median'] / limit16,
                              '; torch.compile with autocast %.0f%%' % (
                                  100 * med['torch-bf16-compile'] / limit16)
                              if 'torch-bf16-compile' in med else ''))
    return '\n'.join(lines) + '\n'


def per_core_line(stats):
    """When every measurement was disturbed (a loaded machine), each training setting's median
    per core it got (images/s over CPU/wall): what the code does with a core, which the load
    changes less than its share of the machine; '' otherwise."""
    rows = [(n, s) for n, s in stats.items() if n in TRAIN or n in TORCH]
    if not rows or not all(s['all_disturbed'] for s in stats.values()):
        return ''
    return ('Every measurement was disturbed, so the images/s above are of a share of the '
            'machine. Per core used (median images/s over median CPU/wall; a rough guide, as a '
            'core shared with other jobs also loses cache): %s.' % ', '.join(
                '%s %.1f' % (n, s['median'] / s['cpu_per_wall']) for n, s in rows))


def load_raw(parser, path, keep, required):
    """The raw records at ``path`` when ``keep``, else empty ones; a missing file is empty
    unless ``required`` (``--report-only``): then ``parser`` exits with code 2, naming it."""
    if keep:
        fix = 'restore it (git checkout %s) or delete it and measure every setting again' % path
        try:
            with open(path) as f:
                raw = json.load(f)
        except FileNotFoundError:
            if required:
                parser.exit(2, '%s: error: no raw records at %s: run without --report-only\n'
                            % (parser.prog, path))
        except (OSError, ValueError) as e:  # not JSON, not UTF-8, unreadable
            parser.exit(2, '%s: error: %s cannot be read as raw records (%s); %s\n'
                        % (parser.prog, path, ' '.join(str(e).split())[:120], fix))
        else:
            if not (isinstance(raw, dict) and isinstance(raw.get('records'), list)
                    and isinstance(raw.get('runs'), list)
                    and all(isinstance(r, dict) for r in raw['records'] + raw['runs'])):
                parser.exit(2, '%s: error: %s holds no raw records (a JSON object with lists '
                               '"records" and "runs" of objects); %s\n' % (parser.prog, path, fix))
            return raw
    return {'records': [], 'runs': []}


def main(argv=None):
    p = argparse.ArgumentParser(prog='run.py', description=__doc__.splitlines()[0])
    p.add_argument('--quick', action='store_true', help='tiny step counts (smoke run)')
    p.add_argument('--repeats', type=int, default=2, help='repeats per setting (default: 2)')
    p.add_argument('--retries', type=int, default=1,
                   help='measure a disturbed run again, at most this many times (default: 1)')
    p.add_argument('--only', help='comma-separated settings to measure, in this order '
                   '(default: all): %s'
                   % ','.join(NAMES))
    p.add_argument('--report-only', action='store_true',
                   help='measure nothing; rewrite the report from the raw records')
    p.add_argument('--out', default=os.path.join(ROOT, 'docs', 'benchmarks.md'),
                   help='where to write the report (default: docs/benchmarks.md)')
    p.add_argument('--title', default=None,
                   help='the report\'s heading (default: the one recorded, or Benchmarks)')
    p.add_argument('--raw', default=None,
                   help='the raw records, read with --only, written always (default: '
                   'docs/records/NAME.json for a report docs/NAME.md, else the report\'s path '
                   'with .json)')
    args = p.parse_args(argv)
    if args.repeats < 1 or args.retries < 0:  # --repeats 0 measured nothing and dropped records
        p.exit(2, '%s: error: --repeats %d --retries %d: pass --repeats 1 or more and '
               '--retries 0 or more\n' % (p.prog, args.repeats, args.retries))
    raw_path = args.raw or records_of(args.out)
    names = [n for n in NAMES if n not in TORCH or has_torch()]
    if args.only:
        asked = args.only.split(',')
        unknown = [n for n in asked if n not in NAMES]
        if unknown:
            p.exit(2, 'run.py: error: --only: unknown setting %s; choose from %s\n'
                   % (', '.join(unknown), ','.join(NAMES)))
        names = list(dict.fromkeys(asked))  # interleaved in the order asked
    raw = load_raw(p, raw_path, args.only or args.report_only, args.report_only)
    if args.title:
        raw['title'] = args.title
    if not args.report_only:
        start = utc_now()
        # Before machine(), which imports MXNet: gluon_mgpu must choose the threads first.
        raw.update(flops_per_image=flops_per_image(), machine=machine(), quick=args.quick,
                   retries=args.retries)
        kept = [r for r in raw['records'] if r['name'] not in names]
        parts = current_parts(raw['runs'], names)

        def save(records):
            # After every measurement: a run stopped midway keeps what it measured.
            raw['machine']['load'] = load_average()
            raw['records'] = kept + records
            raw['runs'] = parts + [{'start': start, 'end': utc_now(),
                                    'load': raw['machine']['load'],
                                    'what': ', '.join(names) if args.only else 'all settings'}]
            with open(raw_path, 'w') as f:
                json.dump(raw, f, indent=1)
        save(run(names, args.quick, args.repeats, args.retries, save))
    write_report(args.out, report(raw, records_link(args.out, raw_path)))


if __name__ == '__main__':
    main()
