"""The research record and the accuracy table made of it: this project measuring itself, beside
``book_table.py``, which trains the runs and appends their lines. The record
(docs/records/book-table.jsonl) holds one JSON line per epoch of a full run with the book's
settings; ``read_records`` checks each line (its setting, its epoch's numbers and its machine).
``accuracy_cells`` judges the book's accuracy table against the published GPU runs
(docs/records/book-gpu-runs.csv) and our mean over seeds; ``training_rows`` puts the recorded
seconds per epoch and the speed-up beside the book's, as rows of ``python -m
gluon_mgpu.compare``'s table. Functions return data: ``book_table.py --tables`` writes it into
docs/book-comparison.md and both notebooks.
"""
import csv
import functools
import json
import operator
import os

import gluon_mgpu  # noqa: F401,I001  (first: it sets the threads MXNet starts with)
import numpy as np
from gluon_mgpu import UsageError, book_setting, open_input


# What the book prints of its training (d2l.ai's English MXNet page, two GPUs). In [7]:
# train(num_gpus=1, batch_size=256, lr=0.1); In [8]: num_gpus=2, 512, 0.2.
BOOK_TRAINING = {
    1: {'cell': 'In [7]', 'batch_size': 256, 'lr': 0.1,
        'seconds': (63.5, 60.8, 61.0, 61.1), 'test_acc': (0.86, 0.91, 0.91, 0.93)},
    2: {'cell': 'In [8]', 'batch_size': 512, 'lr': 0.2,
        'seconds': (32.3, 31.5, 31.2, 31.3), 'test_acc': (0.77, 0.86, 0.88, 0.89)},
}
# The newer PyTorch edition (Chinese page), 10 epochs, prints one summary line per run:
# "test acc: 0.92, 14.1 sec/epoch" on 1 GPU and "test acc: 0.87, 9.2 sec/epoch" on 2.
NEWER_EDITION = {1: {'sec_per_epoch': 14.1, 'test_acc': 0.92},
                 2: {'sec_per_epoch': 9.2, 'test_acc': 0.87}}
# A verdict needs a spread: with fewer seeds a row shows our values and is not judged.
MIN_SEEDS = 3


# The records of the full runs (lab/book_table.py writes them): one JSON line per epoch.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Every record of the book table's scripts is in docs/records/, beside no page.
RECORDS = os.path.join(ROOT, 'docs', 'records')
DEFAULT_RECORD = os.path.join(RECORDS, 'book-table.jsonl')
# The update the record's runs made (their checkpoints' "step", which book_table.py copies into
# each line): the gradients' sum divided by the nominal batch size, as the chapter's loop. The
# runs made with the old step, each batch's own size, up to commit 03b47ec, are kept apart.
STEP, OLD_STEP = 'trainer.step(batch_size)', 'trainer.step(X.shape[0])'
OLD_STEP_RECORD = os.path.join(RECORDS, 'book-table-old-step.jsonl')
RUN_EPOCHS = 4  # the book's
RECORD_LIMIT = 16 << 20  # bytes; a line is about 700


def plural(n, word):
    """``plural(1, 'seed')`` is ``1 seed``, ``plural(2, 'seed')`` is ``2 seeds``."""
    return '%d %s%s' % (n, word, '' if n == 1 else 's')


class RecordError(UsageError, ValueError):
    """The record file cannot be used: the message names the file, the line and the fix."""


def _whole(low, high):
    return (lambda v: type(v) is int and low <= v <= high,
            'a whole number from %d to %d' % (low, high))


def _number(low, high):
    return (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
            and low <= v <= high, 'a number from %g to %g' % (low, high))


_ACCURACY = _number(0, 1)
# The setting, the epoch and the diagnosis of a line, as strict as the flags that made it
# (--seed, ...) and the train command's epoch record (docs/metrics-schema.md, history[]).
_FIELDS = {'devices': _whole(1, 1024), 'seed': _whole(0, 2 ** 31 - 1),
           'epoch': _whole(1, 10 ** 6), 'seconds': _number(1e-9, 1e9),
           'images_per_sec': _number(1e-9, 1e12), 'train_acc': _ACCURACY, 'test_acc': _ACCURACY,
           'train_loss': (lambda v: v is None or _number(0, 1e30)[0](v),
                          'a number from 0 to 1e+30 or null'),
           'warmup_steps': _whole(0, 10 ** 9), 'batch_size': _whole(1, 10 ** 9),
           'lr': _number(1e-30, 1e30), 'acc_precise_bn': _ACCURACY, 'acc_batch_stats': _ACCURACY,
           'acc_running': (lambda v: isinstance(v, list) and all(_ACCURACY[0](a) for a in v),
                           'a list of accuracies')}
_LIMITS = {'train_limit': _whole(1, 10 ** 9), 'test_limit': _whole(1, 10 ** 9)}


def _check_line(record, path, number, step):
    def refuse(what):
        raise RecordError('%s, line %d: %s; fix or delete that line (the epoch is then trained '
                          'again)' % (path, number, what))
    if not isinstance(record, dict):
        refuse('not a JSON object')
    if record.get('step', OLD_STEP) != step:
        raise RecordError('%s, line %d: trained with %s, not %s; a record holds the runs of one '
                          'step only: keep the line in a record of its own (the old step\'s are '
                          'in %s)' % (path, number, str(record.get('step', OLD_STEP))[:40],
                                      step, os.path.relpath(OLD_STEP_RECORD, ROOT)))
    for name, (test, kind) in list(_FIELDS.items()) + list(_LIMITS.items()):
        if name not in record and name not in _LIMITS:
            refuse('it lacks %s' % name)
        value = record.get(name)
        if not (value is None and name in _LIMITS) and not test(value):
            refuse('%s is %s, not %s' % (name, _shown(value), kind))
    if (record['batch_size'], record['lr']) != book_setting(record['devices']):
        refuse('batch_size %s and lr %s are not the book\'s for %s (%s and %s)' % (
            record['batch_size'], record['lr'], plural(record['devices'], 'device'),
            *book_setting(record['devices'])))
    if len(record['acc_running']) != record['devices']:
        refuse('acc_running holds %d accuracies for %d devices'
               % (len(record['acc_running']), record['devices']))
    names = record.get('device_names', [])
    if not (isinstance(names, list) and len(names) <= record['devices']
            and all(isinstance(n, str) and len(n) <= 40 for n in names)):
        refuse('device_names is %s, not a list of device names' % _shown(names))
    problem = machine_problem(record)
    if problem:
        refuse(problem)
    if record.get('dtype', 'float32') not in ('float32', 'bfloat16'):
        refuse('dtype is %s, not "float32" or "bfloat16"' % _shown(record['dtype']))


def machine_problem(record):
    """What is wrong with a line's machine fields (``machine_of`` names each value's machine
    from them; book_table.py writes them, older lines lack some), or None: ``cpu_flags`` a list
    of flags, ``cpu`` and ``dnnl_max_cpu_isa`` names, ``threads`` a whole number, each absent
    or None where a line has no such field."""
    flags = record.get('cpu_flags', [])
    if not (isinstance(flags, list) and all(isinstance(f, str) and 0 < len(f) <= 40
                                            for f in flags)):
        return 'cpu_flags is %s, not a list of CPU flags' % _shown(flags)
    for name in ('cpu', 'dnnl_max_cpu_isa'):
        if not (record.get(name) is None or isinstance(record[name], str)
                and 0 < len(record[name]) <= 100):
            return '%s is %s, not a name' % (name, _shown(record[name]))
    if not (record.get('threads') is None or _whole(1, 10 ** 6)[0](record['threads'])):
        return 'threads is %s, not a whole number from 1 to 1000000' % _shown(record['threads'])
    return None


def _shown(value):
    if isinstance(value, int) and abs(value) >= 2 ** 63:
        return 'a whole number of %d digits' % len(str(abs(value)))
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + '...'


def record_key(record):
    """What makes a run of the table, everything but the epoch: ``(devices, seed,
    warmup_steps, train_limit, test_limit, dtype)``."""
    return (record['devices'], record['seed'], record['warmup_steps'],
            record.get('train_limit'), record.get('test_limit'), record.get('dtype', 'float32'))


def read_records(path, step=STEP):
    """Read a record file (JSON, one epoch per line; none if it does not exist); return the
    checked lines as dicts, in order. An epoch recorded twice (the same ``record_key`` and
    epoch) must carry the same accuracies (a run trained again on the same machine repeats
    itself bit for bit) and counts once, as its first line: so a cell of the table holds one
    value per seed, made by the machine its line names, and the same seed and epoch run on
    another machine, which differs, is refused (keep it in a record of its own, ``--record``).
    Every line must have been trained with ``step`` (a line without ``step`` was trained with
    ``OLD_STEP``).

    Raises
    ------
    RecordError
        Naming the file, the line and what is wrong.
    """
    try:
        with open_input(path) as f:
            data = f.read(RECORD_LIMIT + 1)
        if len(data) > RECORD_LIMIT:
            raise RecordError('%s holds more than %d MB; pass --record with a record of the '
                              'book table' % (path, RECORD_LIMIT >> 20))
        text = data.decode('utf-8')
    except (OSError, UnicodeDecodeError) as e:
        reason = getattr(e, 'reason', None)  # open_input's: what is there instead of a file
        if reason == 'does not exist':
            return []
        raise RecordError('%s %s; pass --record with a regular file' % (path, reason) if reason
                          else '%s cannot be read (%s); pass --record with a readable file'
                          % (path, getattr(e, 'strerror', None) or e)) from None
    records, seen = [], {}
    for number, line in enumerate(text.split('\n'), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line, parse_constant=lambda c: float('nan'))
        except (ValueError, RecursionError) as e:
            raise RecordError('%s, line %d: not JSON (%s); fix or delete that line'
                              % (path, number, str(e)[:80] or 'nested too deep')) from None
        _check_line(record, path, number, step)
        first = seen.setdefault((record_key(record), record['epoch']), record)
        if first is record:
            records.append(record)
        elif (first['test_acc'], first['acc_running']) != (record['test_acc'],
                                                           record['acc_running']):
            raise RecordError('%s, line %d: epoch %d of this run is recorded twice with '
                              'different accuracies (%s, then %s); keep one of the two lines'
                              % (path, number, record['epoch'], first['test_acc'],
                                 record['test_acc']))
    return records


def table_records(records, devices, warmup_steps=0, dtype='float32'):
    """The records of one configuration on the full data, ``{epoch: [record per seed]}``,
    epochs 1 to ``RUN_EPOCHS`` (a line beyond the run's epochs is no cell of the table)."""
    by_epoch = {}
    for r in records:
        key = record_key(r)
        if key[0] == devices and key[2:] == (warmup_steps, None, None, dtype) \
                and r['epoch'] <= RUN_EPOCHS:
            by_epoch.setdefault(r['epoch'], []).append(r)
    return by_epoch


# Each run's machine: what a line records of it. A float32 result depends on the CPU's kernels
# and threads (docs/book-comparison.md measured both), so the accuracy table names the machine
# of every value. Lines recorded before 2026-11-27 name the CPU only.
NOT_RECORDED = 'not recorded'


_KERNEL_WORDS = {
    'en': {'capped': 'capped at %s by DNNL_MAX_CPU_ISA (the CPU offers %s: %s)',
           'free': '%s (%s; no DNNL_MAX_CPU_ISA cap)', 'none': 'none of avx2, avx512f',
           'no AVX2': 'no AVX2', NOT_RECORDED: NOT_RECORDED},
    'zh': {'capped': '由 DNNL_MAX_CPU_ISA 限制为 %s（CPU 提供 %s：%s）',
           'free': '%s（%s；未设 DNNL_MAX_CPU_ISA 上限）', 'none': '没有 avx2、avx512f',
           'no AVX2': '没有 AVX2', NOT_RECORDED: '未记录'},
}


def kernels(record, lang='en'):
    """The oneDNN kernels a line's run could use, in words (``lang``: 'en' or 'zh'): the best
    of AVX-512 (``avx512f``) and AVX2 the CPU offered, the cap ``DNNL_MAX_CPU_ISA`` when one
    was set, and the flags; ``NOT_RECORDED`` (in its words) for a line without ``cpu_flags``."""
    words = _KERNEL_WORDS[lang]
    flags = record.get('cpu_flags')
    if flags is None:
        return words[NOT_RECORDED]
    best = 'AVX-512' if 'avx512f' in flags else 'AVX2' if 'avx2' in flags else words['no AVX2']
    cap = record.get('dnnl_max_cpu_isa')
    listed = ', '.join(flags) or words['none']
    if cap:
        return words['capped'] % (cap, best, listed)
    return words['free'] % (best, listed)


def machine_of(record):
    """What identifies a line's machine: ``(cpu, kernels, threads)``, each a text
    (``NOT_RECORDED`` where the line has no such field)."""
    threads = record.get('threads')
    return (record.get('cpu') or NOT_RECORDED, kernels(record),
            NOT_RECORDED if threads is None else 'OMP_NUM_THREADS=%d' % threads)


def machine_keys(records):
    """A short key per machine of ``records`` (``machine_of``), ``{machine: 'A', ...}``,
    lettered in the order of each machine's first line: lines appended later never rename
    the machines before them."""
    keys = {}
    for r in records:
        keys.setdefault(machine_of(r), _letters(len(keys)))
    return keys


def _letters(i):
    return chr(ord('A') + i) if i < 26 else _letters(i // 26 - 1) + chr(ord('A') + i % 26)


def book_cell_records(records):
    """The lines the accuracy table is made of, in record order: 1 and 2 devices, no warmup,
    float32, the full data, epochs 1 to ``RUN_EPOCHS``."""
    chosen = {id(r) for n in (1, 2) for rs in table_records(records, n).values() for r in rs}
    return [r for r in records if id(r) in chosen]


def machine_legend(records):
    """The machines of the accuracy table's lines, one dict each in key order: ``key``,
    ``cpu``, ``kernels``, ``threads`` (``machine_of``), ``kernels_zh`` (the kernels in
    Chinese, for the Chinese notebook), ``made``, what its lines are, as
    ``(devices, seeds, first epoch, last epoch)`` tuples (consecutive epochs with the same
    seeds joined), and ``recorded``, the dates of its first and last line (``(first, last)``,
    None when no line has one)."""
    table = book_cell_records(records)
    legend = []
    for machine, key in machine_keys(table).items():
        mine = [r for r in table if machine_of(r) == machine]
        made = []
        for n in (1, 2):
            seeds = {}
            for r in mine:
                if r['devices'] == n:
                    seeds.setdefault(r['epoch'], set()).add(r['seed'])
            for e in sorted(seeds):
                group = (n, tuple(sorted(seeds[e])))
                if made and made[-1][:2] == group and made[-1][3] == e - 1:
                    made[-1] = group + (made[-1][2], e)
                else:
                    made.append(group + (e, e))
        dates = sorted(r['recorded'][:10] for r in mine if isinstance(r.get('recorded'), str))
        legend.append({'key': key, 'cpu': machine[0], 'kernels': machine[1],
                       'kernels_zh': kernels(mine[0], 'zh'), 'threads': machine[2], 'made': made,
                       'recorded': (dates[0], dates[-1]) if dates else None})
    return legend


def total(values):
    """``sum(values)`` added left to right on every Python: from 3.12 on, ``sum`` compensates
    the rounding of floats, which moves last digits of the pages that 3.11 made."""
    return functools.reduce(operator.add, values, 0)


def summarize(values):
    """``{'n', 'mean', 'low', 'high'}`` of a list of numbers (None for an empty list)."""
    if not values:
        return None
    return {'n': len(values), 'mean': total(values) / len(values), 'low': min(values),
            'high': max(values)}


# Published GPU runs of the chapter's training cells (docs/book-gpu-runs.md): the spread the
# book's printed table and ours are judged against.
GPU_RUNS = os.path.join(RECORDS, 'book-gpu-runs.csv')


SAME_CODE = 'd2l-zh 1.x (d2lzh, MXNet nd)'  # the chapter's exact code, 4 epochs


LATER = '(MXNet np)'  # the later MXNet editions of the same experiment (10 epochs)


def read_gpu_runs(path=GPU_RUNS, whole=False):
    """The GPU runs' test accuracies: ``{('same', gpus, epoch): [...], ('later', gpus, epoch):
    [...]}`` for gpus 1, 2 and epochs 1-4 (the PyTorch edition's runs are left out); with
    ``whole``, the runs that reached epoch 4, one tuple of epochs 1-4 each: ``{('same', gpus):
    [(e1, e2, e3, e4), ...], ('later', gpus): [...]}``.

    Raises
    ------
    ValueError
        Naming the file and line of a value that is not an accuracy.
    """
    with open_input(path) as f:
        lines = f.read().decode('utf-8').splitlines()
    runs = {}
    for number, row in enumerate(csv.DictReader(lines), 2):
        edition = row.get('edition') or ''
        group = 'same' if edition == SAME_CODE else 'later' if edition.endswith(LATER) else None
        if group is None:
            continue
        values = []
        for e in range(1, RUN_EPOCHS + 1):
            text = row.get('acc_e%d' % e) or ''
            if not text:
                break  # a run of fewer epochs
            try:
                value = float(text)
            except ValueError:
                value = float('nan')
            if not 0 <= value <= 1 or row.get('gpus') not in ('1', '2'):
                raise ValueError('%s, line %d: acc_e%d is %r with gpus %r, not an accuracy '
                                 'from 0 to 1 on 1 or 2 GPUs' % (path, number, e, text,
                                                                 row.get('gpus')))
            values.append(value)
        if whole and len(values) == RUN_EPOCHS:
            runs.setdefault((group, int(row['gpus'])), []).append(tuple(values))
        for e, value in enumerate(values if not whole else (), 1):
            runs.setdefault((group, int(row['gpus']), e), []).append(value)
    return runs


def gpu_summary(values):
    """``{'n', 'median', 'p10', 'p90', 'low', 'high'}`` of a list of accuracies."""
    v = np.asarray(values, dtype=np.float64)
    return {'n': len(v), 'median': float(np.median(v)), 'p10': float(np.percentile(v, 10)),
            'p90': float(np.percentile(v, 90)), 'low': float(v.min()), 'high': float(v.max())}


def accuracy_cells(records, runs):
    """The book's table judged against the GPU runs: one dict per setting (1, 2 devices) and
    epoch, with ``devices``, ``epoch``, ``book`` (its printed value), ``same`` and ``later``
    (``gpu_summary`` of the same-code runs and the later editions), ``ours`` and ``precise``
    (``summarize`` over seeds of device 0's test accuracy, the book's measure, and of precise
    BatchNorm's; None when not run), ``verdict`` and ``status``.

    ``runs`` lists each seed's value of ``ours`` with its machine's key (``machine_keys``):
    ``[{'seed', 'acc', 'machine'}]`` by seed.

    A cell is judged with ``MIN_SEEDS`` seeds or more: our mean, printed to two digits as the
    runs are, must lie in the same-code runs' range (lowest-highest); at the last epoch it is
    also compared with their median.
    """
    cells = []
    keys = machine_keys(book_cell_records(records))
    for n in (1, 2):
        by_epoch = table_records(records, n)
        for e, book in enumerate(BOOK_TRAINING[n]['test_acc'], 1):
            rs = by_epoch.get(e, [])
            cell = {'devices': n, 'epoch': e, 'book': book,
                    'same': gpu_summary(runs['same', n, e]),
                    'later': gpu_summary(runs['later', n, e]),
                    'ours': summarize([r['acc_running'][0] for r in rs]),
                    'precise': summarize([r['acc_precise_bn'] for r in rs]),
                    'runs': [{'seed': r['seed'], 'acc': r['acc_running'][0],
                              'machine': keys[machine_of(r)]}
                             for r in sorted(rs, key=lambda r: r['seed'])]}
            cell['verdict'], cell['status'] = _gpu_verdict(cell, e == len(
                BOOK_TRAINING[n]['test_acc']))
            cells.append(cell)
    return cells


def _gpu_verdict(cell, last):
    ours, same = cell['ours'], cell['same']
    if ours is None:
        return 'not run (lab/book_table.py)', 'not run'
    if ours['n'] < MIN_SEEDS:
        return ('not judged: %s so far, %d needed' % (plural(ours['n'], 'seed'), MIN_SEEDS),
                'not judged')
    mean = round(ours['mean'], 2)
    where = ('inside' if same['low'] <= mean <= same['high'] else
             'BELOW' if mean < same['low'] else 'ABOVE')
    verdict = '%s the same-code GPU runs\' range (%.2f-%.2f)' % (where, same['low'],
                                                                 same['high'])
    near = abs(ours['mean'] - same['median']) <= 0.01 + 1e-9
    if last:
        verdict += '; %s 0.01 of their median %.3f' % ('within' if near else 'NOT within',
                                                       same['median'])
    return verdict, 'match' if where == 'inside' and (near or not last) else 'mismatch'


def _median_range(s):
    return '%.2f (%.2f-%.2f)' % (s['median'], s['low'], s['high'])


def _median_p10_p90(s):
    return '%.3f (%.3f-%.3f)' % (s['median'], s['p10'], s['p90'])


def mean_low_high(s, digits=2):
    """``'mean (lowest-highest)'`` of a ``summarize`` to ``digits`` decimals; ``'-'`` for None."""
    if s is None:
        return '-'
    return '%.*f (%.*f-%.*f)' % (digits, s['mean'], digits, s['low'], digits, s['high'])


def each_seed(cell):
    """A cell's values seed by seed with their machines' keys: ``'s0 0.800 A, s1 0.725 A'``;
    ``'-'`` for none."""
    return ', '.join('s%d %.3f %s' % (r['seed'], r['acc'], r['machine'])
                     for r in cell['runs']) or '-'


ACCURACY_TITLES = ['setting', 'epoch', 'book', 'same code on GPUs: median (range)',
                   'later MXNet editions on GPUs: median (10th-90th pct.)',
                   'ours: mean (lowest-highest)', 'seeds',
                   'each seed: device 0 and machine (legend below)', 'ours, precise BatchNorm',
                   'verdict']


def format_accuracy_cells(cells):
    """``accuracy_cells`` as lists of cell texts, headed by ``ACCURACY_TITLES``."""
    return [ACCURACY_TITLES] + [
        [plural(c['devices'], 'device'), str(c['epoch']), '%.2f' % c['book'],
         _median_range(c['same']), _median_p10_p90(c['later']), mean_low_high(c['ours']),
         str(c['ours']['n'] if c['ours'] else 0), each_seed(c), mean_low_high(c['precise'], 3),
         c['verdict']] for c in cells]


MACHINE_TITLES = ['machine', 'CPU (model name)', 'oneDNN kernels', 'threads',
                  'its values in the table', 'recorded']
# A legend's words in each notebook's language (the page's are English). The CPU's name and
# the kernels as recorded stay as they are.
LEGEND_WORDS = {
    'en': {'line': '- %s: %s; oneDNN kernels: %s; threads: %s; %s; recorded %s',
           'made': '%s, %s %s, %s', 'seed': ('seed', 'seeds'), 'join': '; ',
           'epoch': 'epoch %d', 'epochs': 'epochs %d-%d', 'to': '%s to %s',
           NOT_RECORDED: NOT_RECORDED},
    'zh': {'line': '- %s：%s；oneDNN 内核：%s；线程：%s；%s；记录于 %s',
           'made': '%s，%s %s，%s', 'seed': ('随机种子', '随机种子'), 'join': '；',
           'epoch': '第 %d 个迭代周期', 'epochs': '第 %d-%d 个迭代周期', 'to': '%s 至 %s',
           NOT_RECORDED: '未记录'},
}


def _made(made, lang):
    words = LEGEND_WORDS[lang]
    return words['join'].join(words['made'] % (
        plural(n, 'device') if lang == 'en' else '%d 个设备' % n,
        words['seed'][len(seeds) > 1], ' '.join(map(str, seeds)),
        words['epoch'] % a if a == b else words['epochs'] % (a, b))
        for n, seeds, a, b in made)


def _recorded(recorded, lang):
    words = LEGEND_WORDS[lang]
    if recorded is None:
        return words[NOT_RECORDED]
    return recorded[0] if recorded[0] == recorded[1] else words['to'] % recorded


def format_machine_legend(legend):
    """``machine_legend`` as lists of cell texts, headed by ``MACHINE_TITLES``."""
    return [MACHINE_TITLES] + [[m['key'], m['cpu'], m['kernels'], m['threads'],
                                _made(m['made'], 'en'), _recorded(m['recorded'], 'en')]
                               for m in legend]


def notebook_legend(legend, lang='en'):
    """The notebooks' legend of ``machine_legend``: one Markdown list line per machine, in the
    notebook's language (``lang``)."""
    words = LEGEND_WORDS[lang]

    def said(text):
        return words[NOT_RECORDED] if text == NOT_RECORDED else text
    return [words['line'] % (m['key'], said(m['cpu']),
                             m['kernels'] if lang == 'en' else m['kernels_%s' % lang],
                             said(m['threads']),
                             _made(m['made'], lang), _recorded(m['recorded'], lang))
            for m in legend]


# The notebooks' verdict words (the rows' titles are each notebook's own).
VERDICT_WORDS = {'en': {'inside': 'inside', 'BELOW': 'BELOW', 'ABOVE': 'ABOVE'},
                 'zh': {'inside': '范围内', 'BELOW': '低于范围', 'ABOVE': '高于范围'}}


def notebook_table(cells, lang='en'):
    """The notebooks' table: per device count, the rows book, same-code GPU runs, later
    editions, ours, ours seed by seed with each value's machine (``each_seed``; the legend is
    ``notebook_legend``) and the verdict, one column per epoch, without the rows' titles (each
    notebook has its own, in its language; ``lang`` picks the verdict's words)."""
    words = VERDICT_WORDS[lang]
    rows = []
    for n in (1, 2):
        mine = [c for c in cells if c['devices'] == n]
        rows += [['%.2f' % c['book'] for c in mine],
                 [_median_range(c['same']) for c in mine],
                 [_median_p10_p90(c['later']) for c in mine],
                 [mean_low_high(c['ours']) for c in mine],
                 [each_seed(c) for c in mine],
                 [words[c['verdict'].split(' ')[0]] if c['status'] in ('match', 'mismatch')
                  else '-' for c in mine]]
    return rows


# Our 2-device speed-up divided by the book's 1.95x must fall in this range (1.46x to 2.15x).
SPEEDUP_BAND = (0.75, 1.10)


def _row(cell, what, book, ours, diff, verdict, status):  # as python -m gluon_mgpu.compare's
    return {'cell': cell, 'what': what, 'book': book, 'ours': ours, 'diff': diff,
            'verdict': verdict, 'status': status}


# The columns of python -m gluon_mgpu.compare's table, whose rows the page's tables show.
COLUMNS = (('cell', 'cell'), ('what', 'what'), ('book', "book's value"), ('ours', 'ours'),
           ('diff', 'difference'), ('verdict', 'verdict'))


def table_lines(rows):
    """``rows`` (``_row``'s, or the compare command's) as lines of cells, titles first."""
    return [[title for _, title in COLUMNS]] + [[str(r[key]) for key, _ in COLUMNS]
                                                for r in rows]


def training_rows(devices, records=()):
    """The seconds per epoch of the recorded runs beside the book's ``In [7]`` and ``In [8]``,
    and the speed-up; return rows (the test accuracies are ``accuracy_cells``).

    Parameters
    ----------
    devices : list of mxnet.Context
        The two devices of the 2-device runs: on simulated devices the speed-up row says why
        none is expected.
    records : list of dict
        The record's lines (``read_records``); those with the book's settings, no
        warmup and the full data make the rows.
    """
    rows, seconds, book_sec = [], {}, {}
    for n in (1, 2):
        book = BOOK_TRAINING[n]
        by_epoch = table_records(records, n)
        setting = plural(n, 'device')
        book_sec[n] = float(np.mean(book['seconds']))
        head = (book['cell'], 'sec/epoch (mean), %s' % setting, '%.1f' % book_sec[n])
        per_epoch = [r['seconds'] for rs in by_epoch.values() for r in rs]
        if not per_epoch:
            rows.append(_row(*head, 'not run', '', 'not run (lab/book_table.py)', 'not run'))
            continue
        seconds[n] = float(np.mean(per_epoch))
        names = ', '.join(by_epoch[min(by_epoch)][0].get('device_names', []))
        rows.append(_row(*head, '%.1f on %s (%s)' % (seconds[n], names,
                                                     plural(len(per_epoch), 'epoch')),
                         'x%.2f' % (seconds[n] / book_sec[n]),
                         'not comparable: depends on the hardware (the speed-up is)',
                         'not comparable'))

    book_speedup = book_sec[1] / book_sec[2]
    head = ('In [7]/[8]', 'speed-up, 2 devices', '%.2fx (PyTorch ed. %.2fx)' % (
        book_speedup, NEWER_EDITION[1]['sec_per_epoch'] / NEWER_EDITION[2]['sec_per_epoch']))
    why = ('%s are simulated devices: they share the same CPU cores, which one device already '
           'keeps busy, and add copies and a gradient reduction, so no speed-up is expected'
           % ', '.join(str(d) for d in devices)) if sum(
               str(d).startswith('cpu') for d in devices) > 1 else None
    if len(seconds) < 2:
        verdict = 'not run (lab/book_table.py)' + ('; ' + why if why else '')
        return rows + [_row(*head, 'not run', '', verdict, 'not run')]
    speedup = seconds[1] / seconds[2]
    ratio = speedup / book_speedup
    if why:
        verdict, status = 'not comparable: ' + why, 'not comparable'
    else:
        ok = SPEEDUP_BAND[0] <= ratio <= SPEEDUP_BAND[1]
        verdict = '%s (ours / book within %.2f to %.2f)' % (
            'within band' if ok else 'OUTSIDE band', *SPEEDUP_BAND)
        status = 'match' if ok else 'mismatch'
    return rows + [_row(*head, '%.2fx (%.1f / %.1f s)' % (speedup, seconds[1], seconds[2]),
                        'ours / book %.2f' % ratio, verdict, status)]


def notes():
    """Return the lines that say how the rows and cells made of the record are judged
    (the compare command's notes say it of the chapter's cells and the step)."""
    newer = NEWER_EDITION
    return [
        'test_acc: the book\'s measure (device 0\'s parameters and running statistics, '
        'evaluate_accuracy(test_iter, net, ctx[0])); ours is the mean over seeds with '
        'lowest-highest, beside the published GPU runs of the same code and of the later MXNet '
        'editions (docs/book-gpu-runs.md). With %d seeds or more a cell is judged: our mean, '
        'printed to two digits as the runs are, must lie in the same-code runs\' range, and '
        'at the last epoch within 0.01 of their median.' % MIN_SEEDS,
        'sec/epoch: depends on the hardware, shown only. The speed-up (mean seconds per epoch '
        'on 1 device over 2 devices) is judged: ours / book within %.2f to %.2f.' % SPEEDUP_BAND,
        'PyTorch ed.: the newer edition prints %.1f and %.1f s per epoch on 1 and 2 GPUs '
        '(10 epochs, test acc %.2f and %.2f).' % (newer[1]['sec_per_epoch'],
                                                  newer[2]['sec_per_epoch'],
                                                  newer[1]['test_acc'], newer[2]['test_acc']),
    ]
