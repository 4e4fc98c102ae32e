"""How much `make demo`'s accuracies move with the CPU's kernels (issue 46, item 4).

In float32 a run's numbers depend, beyond the code and the seed, on the instructions oneDNN may
use and on its thread count (docs/book-comparison.md). This script trains a candidate demo
setting (``python -m gluon_mgpu.train`` in a fresh process) under four kernel settings:

- ``avx2-1t``, ``avx2-2t``: oneDNN capped at AVX2 (``DNNL_MAX_CPU_ISA=AVX2``), 1 or 2 OpenMP
  threads per simulated device (``OMP_NUM_THREADS``);
- ``native-1t``, ``native-2t``: no cap (on an AVX-512 CPU, its AVX-512 kernels), 1 or 2 threads;

for one or more seeds, appends one JSON line per run to ``docs/records/demo-spread.jsonl`` (with
the CPU model, its flags and the instruction set oneDNN reported using), and writes
``docs/demo-spread.md`` from those lines.

    .venv/bin/python lab/demo_spread.py run --candidate demo-old --seeds 0 1
    .venv/bin/python lab/demo_spread.py report

A run already in the records (same candidate, arguments, setting, seed and CPU: its family,
model and stepping) is not trained again. The accuracies are deterministic for a given setting
on a given CPU, so one run per cell is enough; the seconds depend on the machine's load and are
kept only as an indication. The notebook's candidates set no seed (a reader's run draws its data
order), so each of their runs is a new sample: ``--runs N`` trains until the records hold N of
them per setting on this CPU.

    .venv/bin/python lab/demo_spread.py run --candidate notebook-quick-lr0.0125-b16-2000 \
        --settings native-2t --runs 3
"""
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from measuring import (cpu_generation, cpu_id, cpu_model, kernel_setting,  # noqa: E402
                       onednn_isa)
from gluon_mgpu import Parser, UsageError, run_command  # noqa: E402
from book_records import plural  # noqa: E402

PROG = 'lab/demo_spread.py'

RECORDS = os.path.join(ROOT, 'docs', 'records', 'demo-spread.jsonl')
REPORT = os.path.join(ROOT, 'docs', 'demo-spread.md')

# Each candidate: the training command's arguments, without --seed.
CANDIDATES = {
    # The demo before issue 46 (Makefile DEMO_ARGS).
    'demo-old': '--num-gpus 2 --epochs 2 --batch-size 32 --lr 0.1 --train-limit 3000 '
                '--test-limit 1000',
    # A smaller step for the same data and batch.
    'demo-lr0.05-b64': '--num-gpus 2 --epochs 2 --batch-size 64 --lr 0.05 --train-limit 3000 '
                       '--test-limit 1000',
    # The same step size per image as the batch of 64 at 0.05, twice the steps per epoch.
    'demo-lr0.025-b32': '--num-gpus 2 --epochs 2 --batch-size 32 --lr 0.025 --train-limit 3000 '
                        '--test-limit 1000',
    # The same step size per image as the old demo's batch of 32, but 64 images per device's
    # BatchNorm, and a few warmup steps.
    'demo-lr0.1-b128-w20': '--num-gpus 2 --epochs 2 --batch-size 128 --lr 0.1 --train-limit 3000 '
                           '--test-limit 1000 --warmup-steps 20',
    # The notebooks' quick mode before issue 46, as the command line (the notebook trains 1
    # device then 2, from MXNet's default seed).
    'quick-old-1dev': '--num-gpus 1 --epochs 2 --batch-size 32 --lr 0.1 --train-limit 256 '
                      '--test-limit 100',
    'quick-old-2dev': '--num-gpus 2 --epochs 2 --batch-size 64 --lr 0.2 --train-limit 256 '
                      '--test-limit 100',
}

# The notebooks' quick mode: the English notebook's code cells run in order in a fresh process
# with GLUON_MGPU_QUICK=1 (no seed: MXNet's default, as in the notebook), its quick line (the
# one assigning num_epochs in the branch for QUICK == '1') replaced by the candidate's (None: the
# notebook's own). Recorded: the 1-device and then the 2-device run.
NOTEBOOK = os.path.join(ROOT, 'notebooks', 'multiple-gpus-gluon.ipynb')
QUICK_LINE = '    num_epochs, batch_per_device, '
NOTEBOOK_CANDIDATES = {
    # The quick mode before issue 46: 2, 32, 256, 100 (lr 0.1 per device, the book's).
    'notebook-quick': None,
    'notebook-quick-lr0.025-1024': 'num_epochs, batch_per_device, lr_per_device, train_limit, '
                                   'test_limit = 2, 32, 0.025, 1024, 500',
    # Per device what the demo's batch of 32 at 0.025 gives each of its 2 devices.
    'notebook-quick-lr0.0125-b16-2000': 'num_epochs, batch_per_device, lr_per_device, '
                                        'train_limit, test_limit = 2, 16, 0.0125, 2000, 500',
}

NOTEBOOK_RUNNER = r'''
import json, sys
nb = json.load(open(sys.argv[1]))
quick = sys.argv[2]
namespace = {}
for cell in nb['cells']:
    if cell['cell_type'] != 'code':
        continue
    source = ''.join(cell['source'])
    if 'settings' in cell['metadata'].get('tags', []) and quick:
        lines = source.splitlines()
        found = [i for i, line in enumerate(lines) if line.startswith(%r)]
        assert len(found) == 1, 'no quick line'
        lines[found[0]] = '    ' + quick
        source = '\n'.join(lines) + '\n'
    exec(compile(source, 'cell', 'exec'), namespace)
print('RESULT ' + json.dumps({'history_1': namespace['history_1'],
                              'history_2': namespace['history_2'],
                              'threads': namespace['gluon_mgpu'].thread_settings()}))
''' % QUICK_LINE

CHOSEN, CHOSEN_QUICK = 'demo-lr0.025-b32', 'notebook-quick-lr0.0125-b16-2000'

# name -> (DNNL_MAX_CPU_ISA or None, OMP_NUM_THREADS per device)
SETTINGS = {
    'avx2-1t': ('AVX2', 1),
    'avx2-2t': ('AVX2', 2),
    'native-1t': (None, 1),
    'native-2t': (None, 2),
}


def child_env(setting):
    isa, threads = SETTINGS[setting]
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS=str(threads))
    for name in ('DNNL_MAX_CPU_ISA', 'MKLDNN_MAX_CPU_ISA', 'GLUON_MGPU_CHOSE', 'DNNL_VERBOSE',
                 'MKLDNN_VERBOSE', 'MXNET_OMP_MAX_THREADS'):
        env.pop(name, None)
    if isa:
        env['DNNL_MAX_CPU_ISA'] = isa
    return env


# What a record line holds, checked as it is read: a line cut short, {} or NaN is named.
_FIELDS = {'candidate': str, 'args': (str, type(None)), 'setting': str, 'test_acc': list,
           'train_loss': list, 'seconds': list, 'cpu_model': str, 'cpu_flags': list,
           'onednn_isa': str, 'threads': dict, 'versions': dict, 'date': str}


def _no_constant(name):
    raise ValueError('%s is not a number a run gives' % name)


def _problem(r):
    """What makes ``r`` not a run's record line, or None."""
    if not isinstance(r, dict):
        return 'is not a JSON object'
    wrong = [k for k, kind in _FIELDS.items() if not isinstance(r.get(k), kind)]
    if wrong:
        return 'has no %s of the kind a run writes' % wrong[0]
    if r['setting'] not in SETTINGS:
        return 'setting is %r, not one of %s' % (r['setting'], ', '.join(SETTINGS))
    if r.get('seed') is not None and type(r.get('seed')) is not int:
        return 'seed is %r, not a whole number or null' % (r.get('seed'),)
    numbers = r['test_acc'] + r['train_loss'] + r['seconds']
    if not r['test_acc'] or any(type(v) not in (int, float) for v in numbers) \
            or not all(0 <= a <= 1 for a in r['test_acc']):
        return 'test_acc, train_loss and seconds are not lists of numbers (accuracies 0 to 1)'
    return None


def read_records(path=RECORDS):
    """The record's runs, one per line (none if the file does not exist); ``UsageError``
    names a line that is not a run's."""
    if not os.path.exists(path):
        return []
    records = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line.rstrip('\n'), parse_constant=_no_constant)
                problem = _problem(record)
            except ValueError as e:
                problem = 'is not a JSON line (%s)' % e
            if problem:
                raise UsageError('%s, line %d: %s; fix or delete that line (each is one run)'
                                 % (os.path.relpath(path, ROOT), n, problem))
            records.append(record)
    return records


def _timed(argv, env, what):
    """Run the training process ``argv`` in ``env``; return it, done, and its wall seconds. A
    failure ends this script, naming ``what``."""
    start = time.time()
    done = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True)
    wall = time.time() - start
    if done.returncode != 0:
        raise SystemExit('%s failed (exit %d): %s' % (what, done.returncode, done.stderr[-2000:]))
    return done, wall


def train_once(candidate, setting, seed):
    args = CANDIDATES[candidate].split() + ['--seed', str(seed), '--quiet']
    with tempfile.TemporaryDirectory() as tmp:
        metrics = os.path.join(tmp, 'run.json')
        command = [sys.executable, '-m', 'gluon_mgpu.train'] + args + ['--metrics-json', metrics]
        wall = _timed(command, child_env(setting), '%s %s seed %d' % (candidate, setting, seed))[1]
        with open(metrics) as f:
            run = json.load(f)
    return run, wall


def claim(candidate, setting, seed, k=0):
    """Whether this process may train the ``k``-th run: False when another instance of the script
    has claimed it already (instances may share the machine's cores, each with other settings)."""
    folder = os.path.join(tempfile.gettempdir(), 'demo-spread-claims')
    os.makedirs(folder, exist_ok=True)
    name = '%s_%s_%s_%d_%d' % (cpu_id(), candidate, setting, seed, k)
    try:
        os.close(os.open(os.path.join(folder, re.sub(r'[^\w.-]', '_', name)),
                         os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def notebook_once(candidate, setting):
    done, wall = _timed([sys.executable, '-c', NOTEBOOK_RUNNER, NOTEBOOK,
                         NOTEBOOK_CANDIDATES[candidate] or ''],
                        dict(child_env(setting), GLUON_MGPU_QUICK='1'),
                        '%s %s' % (candidate, setting))
    line = [out for out in done.stdout.splitlines() if out.startswith('RESULT ')][-1]
    return json.loads(line[len('RESULT '):]), wall


def run(candidates, seeds, settings, path=RECORDS, runs=1):
    ident = cpu_id()
    isa = {}
    for candidate in candidates:
        for seed in seeds:
            for setting in settings:
                notebook = candidate in NOTEBOOK_CANDIDATES
                if notebook and seed != seeds[0]:
                    continue  # the notebook sets no seed
                args = NOTEBOOK_CANDIDATES[candidate] if notebook else CANDIDATES[candidate]
                run_seed = None if notebook else seed
                have = [r for r in read_records(path)
                        if (r['candidate'], r['args'], r['setting'], r['seed'], r.get('cpu_id'))
                        == (candidate, args, setting, run_seed, ident)]
                for k in range(len(have), runs if notebook else 1):
                    if claim(candidate, setting, -1 if notebook else seed, k):
                        _run_once(path, candidate, args, setting, seed, run_seed, isa)


def _run_once(path, candidate, args, setting, seed, run_seed, isa):
    """Train one run and append its record to ``path``."""
    if setting not in isa:
        isa[setting] = onednn_isa(child_env(setting), ROOT)
    if candidate in NOTEBOOK_CANDIDATES:
        out, wall = notebook_once(candidate, setting)
        result = {'history': out['history_1'] + out['history_2'],
                  'threads': out['threads'], 'versions': {}}
    else:
        result, wall = train_once(candidate, setting, seed)
    record = {
        'candidate': candidate, 'args': args, 'setting': setting,
        'dnnl_max_cpu_isa': SETTINGS[setting][0],
        'omp_num_threads': SETTINGS[setting][1], 'seed': run_seed,
        'test_acc': [h['test_acc'] for h in result['history']],
        'train_loss': [h['train_loss'] for h in result['history']],
        'seconds': [round(h['seconds'], 1) for h in result['history']],
        'wall_seconds': round(wall, 1), 'cpu_model': cpu_model(),
        'cpu_flags': kernel_setting()['cpu_flags'], 'cpu_id': cpu_id(),
        'onednn_isa': isa[setting],
        'threads': result['threads'], 'versions': result['versions'],
        'date': time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime()),
    }
    with open(path, 'a') as f:
        f.write(json.dumps(record, sort_keys=True) + '\n')
    print('%s %s seed %s: test_acc %s (%.0f s)'
          % (candidate, setting, run_seed,
             ' '.join('%.3f' % a for a in record['test_acc']), wall), flush=True)


def candidate_section(candidate, records, cpus):
    """The report's section of ``candidate``; ``cpus`` names each ``(cpu_model, cpu_flags)``."""
    notebook = candidate in NOTEBOOK_CANDIDATES
    rows = sorted(records, key=lambda r: (r['seed'] or 0, r.get('cpu_id') or '',
                                          list(SETTINGS).index(r['setting']), r['date']))
    epochs = max(len(r['test_acc']) for r in rows)
    if notebook:
        half = epochs // 2
        heads = ['%s, epoch %d' % (plural(n, 'device'), e + 1) for n in (1, 2)
                 for e in range(half)]
        command = ('the English notebook\'s code cells with `GLUON_MGPU_QUICK=1`, %s'
                   % ('its own quick settings' if rows[0]['args'] is None else
                      'the quick line `%s`' % rows[0]['args']))
    else:
        heads = ['epoch %d' % (e + 1) for e in range(epochs)]
        command = '`python -m gluon_mgpu.train %s --seed S`' % rows[0]['args']
    lines = ['### `%s`' % candidate, '', command, '',
             '| seed | CPU | kernels | threads per device | oneDNN reported | %s | train loss, '
             'last epoch | s per epoch |' % ' | '.join('test acc, ' + h for h in heads),
             '|' + '---|' * (7 + epochs)]
    for r in rows:
        lines.append('| %s | %s | %s | %d | %s | %s | %.3f | %s |' % (
            'MXNet default' if r['seed'] is None else r['seed'],
            cpus[r['cpu_model'], tuple(r['cpu_flags'])],
            'AVX2 (`DNNL_MAX_CPU_ISA=AVX2`)' if r['dnnl_max_cpu_isa'] else 'no cap',
            r['omp_num_threads'], r['onednn_isa'] or '?',
            ' | '.join('%.3f' % a for a in r['test_acc']), r['train_loss'][-1],
            ' '.join('%.0f' % s for s in r['seconds'])))
    lines.append('')
    seeds = sorted({r['seed'] for r in rows}, key=lambda s: -1 if s is None else s)
    for e, head in enumerate(heads):
        accs = [r['test_acc'][e] for r in rows]
        per_seed = []
        if len(seeds) > 1:
            for seed in seeds:
                these = [r['test_acc'][e] for r in rows if r['seed'] == seed]
                per_seed.append('seed %s: %.3f-%.3f (spread %.3f, %s)'
                                % (seed, min(these), max(these), max(these) - min(these),
                                   plural(len(these), 'setting')))
        lines.append('- %s: %s %.3f-%.3f (spread %.3f, mean %.3f)%s.'
                     % (head, plural(len(accs), 'run'), min(accs), max(accs),
                        max(accs) - min(accs), statistics.mean(accs),
                        ''.join('; ' + p for p in per_seed)))
    if not notebook:
        rise = [r['test_acc'][-1] - r['test_acc'][0] for r in rows]
        lines.append('- rise from epoch 1 to epoch %d: %+.3f to %+.3f.'
                     % (epochs, min(rise), max(rise)))
    lines.append('')
    return lines


def _settings_run(candidate, records):
    """Which of ``SETTINGS`` ``records`` hold a run of ``candidate`` under, and which not, in
    words: ``'under avx2-1t and avx2-2t only (not run: native-1t, native-2t)'``."""
    run = [s for s in SETTINGS if any(r['candidate'] == candidate and r['setting'] == s
                                      for r in records)]
    missing = [s for s in SETTINGS if s not in run]
    if not missing:
        return 'under all four'
    if not run:
        return 'under none of them'
    said = ', '.join(run[:-1]) + (' and ' if len(run) > 1 else '') + run[-1]
    return 'under %s only (not run: %s)' % (said, ', '.join(missing))


def report(path=RECORDS, out=REPORT):
    records = read_records(path)
    lines = ['# How `make demo` learns under different CPU kernels', '',
             '<!-- Written by `lab/demo_spread.py report` from '
             'docs/records/demo-spread.jsonl. -->',
             '',
             'Issue 46, item 4: the old demo printed 0.54 then 0.72 with oneDNN capped at AVX2 and '
             '0.38 then 0.48 with AVX-512 kernels, same command and seed. In float32, a run '
             'depends on the instructions oneDNN uses and on its thread count, so each candidate '
             'setting below was trained under up to four kernel settings (oneDNN capped at AVX2 '
             'or not capped, 1 or 2 OpenMP threads per simulated device), each run a '
             'fresh `python -m gluon_mgpu.train` process (`lab/demo_spread.py run`). '
             'The seconds are only an indication: the machine was shared with other jobs, '
             'at times 20 to 35 processes wanting its 2 cores.', '',
             'Chosen: `%s` for `make demo` (the Makefile\'s `DEMO_ARGS`, with `--seed 0`) and '
             '`%s` for the notebooks\' quick mode. A candidate was judged by how little its '
             'test accuracy after each epoch moves across the kernel settings while clearly '
             'rising; with the CPU budget at hand (a shared 2-core machine), only seed 0 was run '
             'under all four settings, a second seed under some, and the chosen quick mode %s. '
             'The notebook\'s runs set no seed for the data order, as a reader\'s do, so each '
             'is a sample of its own; on the AVX2 Zen 3 the quick mode ran under native-2t only, '
             'that machine\'s default setting, several times.'
             % (CHOSEN, CHOSEN_QUICK, _settings_run(CHOSEN_QUICK, records)), '']
    machines = sorted({(r['cpu_model'], tuple(r['cpu_flags'])) for r in records})
    cpus = {}  # each machine's short name for the tables: its generation, 'AMD Zen 3'
    for model, flags in machines:
        mine = [r for r in records if (r['cpu_model'], tuple(r['cpu_flags'])) == (model, flags)]
        isas = sorted({(r['setting'], r['onednn_isa']) for r in mine})
        ident = sorted({r['cpu_id'] for r in mine if r.get('cpu_id')})
        # The older records do not name the CPU's family and model: their machine's others do.
        cpus[model, flags] = ' or '.join(sorted({(cpu_generation(i) or i).split(' (')[0]
                                                 for i in ident})) or model
        ident += sorted({cpu_generation(i) for i in ident} - {None})
        lines += ['Machine: %s (%s; flags: %s; %s usable cores). oneDNN reported: %s.' % (
            model, ', '.join(ident), ', '.join(flags),
            '/'.join(sorted({str(r['threads']['cores']) for r in mine})),
            '; '.join('%s: %s' % (s, i) for s, i in isas)
            + ' (oneDNN names its kernels after Intel\'s instruction sets, on AMD as well)'), '']
    versions = sorted({json.dumps(r['versions'], sort_keys=True) for r in records
                       if r['versions']})
    lines += ['Software: %s.' % '; '.join(
        ', '.join('%s %s' % kv for kv in sorted(json.loads(v).items())) for v in versions), '']
    order = list(CANDIDATES) + list(NOTEBOOK_CANDIDATES)
    for candidate in sorted({r['candidate'] for r in records}, key=order.index):
        lines += candidate_section(candidate, [r for r in records if r['candidate'] == candidate],
                                   cpus)
    with open(out, 'w') as f:
        f.write('\n'.join(lines).rstrip('\n') + '\n')
    print('wrote %s (%d runs)' % (os.path.relpath(out, ROOT), len(records)))


def main(argv=None):
    """Train what is missing and write the report, or only write it; return the exit code (2
    for bad input or a bad record line, in one line)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    return run_command(PROG, argv, lambda: _main(argv))


def _main(argv):
    parser = Parser(prog=PROG, description=__doc__.split('\n\n')[0])
    sub = parser.add_subparsers(dest='command', required=True)
    r = sub.add_parser('run', help='train what is missing, then write the report')
    r.add_argument('--candidate', nargs='+', choices=list(CANDIDATES) + list(NOTEBOOK_CANDIDATES),
                   required=True)
    r.add_argument('--seeds', nargs='+', type=Parser.whole('--seeds', minimum=0, example=0),
                   default=[0])
    r.add_argument('--settings', nargs='+', choices=list(SETTINGS), default=list(SETTINGS))
    r.add_argument('--runs', type=Parser.whole('--runs', example=3), default=1,
                   help="the notebook's candidates (no seed): runs per setting on this CPU")
    sub.add_parser('report', help='write docs/demo-spread.md from the records')
    args = parser.parse_args(argv)
    if args.command == 'run':
        run(args.candidate, args.seeds, args.settings, runs=args.runs)
    report()


if __name__ == '__main__':
    sys.exit(main())
