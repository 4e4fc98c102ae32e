"""Do our 2-device runs dip more often than the GPU runs? Each 2-device cell of the book's table
(epochs 1-4) holds every run of ours that reached it, measured as the later MXNet editions
measure on 2 GPUs (the test set split over both devices, each with its own running statistics:
the record's ``test_acc``), beside those editions' GPU runs (``book_records.read_gpu_runs``).
Per cell two exact odds (``gpu_run_odds``, every draw with replacement counted):

- how often as many GPU runs average as low as ours;
- how often as many GPU runs hold as many values below the GPU runs' own 10th percentile.

The runs are the record's (docs/records/book-table.jsonl, one per seed and epoch) and the other
runs of the same code whose epochs are not in it (docs/records/book-table-other-runs.jsonl: runs
of a seed the record holds from another machine at those epochs). The question is answered once every cell
holds ``MIN_DIP_SEEDS`` seeds of the record: our runs dip more often than the GPU runs when one
of the eight odds is below ``FAMILY_ODDS`` shared over the eight (Bonferroni), as the GPU runs
do otherwise. ``book_table.py --tables`` writes the answer into docs/book-comparison.md and
both notebooks; functions here return data and text.
"""
import json
import os
from fractions import Fraction

import book_records
from book_records import RecordError, machine_keys, machine_of, table_records
from gpu_run_odds import at_least_below, mean_at_most

OTHER_RUNS = os.path.join(book_records.RECORDS, 'book-table-other-runs.jsonl')
DEVICES = 2
MIN_DIP_SEEDS = 6
FAMILY_ODDS = Fraction(5, 100)  # shared by the cells' odds: 2 per epoch
OTHER_LIMIT = 1 << 20  # bytes
_MACHINE = ('cpu', 'cpu_flags', 'dnnl_max_cpu_isa', 'threads')
_OTHER_FIELDS = ('devices', 'seed', 'epoch', 'test_acc', 'note') + _MACHINE


def read_other_runs(path=None):
    """The other runs' epochs: one dict per JSON line with ``devices``, ``seed``, ``epoch``,
    ``test_acc`` (the split measure), ``note`` (where the value comes from) and the machine's
    fields of a record line (``cpu``; ``cpu_flags``, ``dnnl_max_cpu_isa``, ``threads`` where
    known). A missing file is no runs. ``path`` defaults to ``OTHER_RUNS``.

    Raises
    ------
    RecordError
        Naming the file, the line and what is wrong.
    """
    path = path or OTHER_RUNS

    def refuse(number, what):
        raise RecordError('%s, line %d: %s; fix the line or restore the file: git checkout %s'
                          % (path, number, what, os.path.relpath(path, book_records.ROOT)))
    try:
        with book_records.open_input(path) as f:
            data = f.read(OTHER_LIMIT + 1)
    except book_records.InputError as e:
        if e.reason == 'does not exist':
            return []
        raise RecordError('%s %s; restore it: git checkout %s' % (
            path, e.reason, os.path.relpath(path, book_records.ROOT))) from None
    if len(data) > OTHER_LIMIT:
        raise RecordError('%s holds more than %d MB; restore it: git checkout %s' % (
            path, OTHER_LIMIT >> 20, os.path.relpath(path, book_records.ROOT)))
    runs = []
    for number, line in enumerate(data.decode('utf-8', 'replace').split('\n'), 1):
        if not line.strip():
            continue
        try:
            run = json.loads(line, parse_constant=lambda c: float('nan'))
        except (ValueError, RecursionError):
            refuse(number, 'not JSON')
        if not isinstance(run, dict):
            refuse(number, 'not a JSON object')
        unknown = sorted(set(run) - set(_OTHER_FIELDS))
        if unknown:
            refuse(number, 'unknown field %s' % book_records._shown(unknown[0]))
        for name, (test, kind) in (('devices', book_records._whole(1, 1024)),
                                   ('seed', book_records._whole(0, 2 ** 31 - 1)),
                                   ('epoch', book_records._whole(1, book_records.RUN_EPOCHS)),
                                   ('test_acc', book_records._ACCURACY)):
            if not test(run.get(name)):
                refuse(number, '%s is %s, not %s' % (name, book_records._shown(run.get(name)),
                                                     kind))
        for name in ('cpu', 'note'):  # required here: the cpu names the run's machine
            if not (isinstance(run.get(name), str) and 0 < len(run[name]) <= 200):
                refuse(number, '%s is %s, not a text' % (name, book_records._shown(
                    run.get(name))))
        problem = book_records.machine_problem(run)
        if problem:
            refuse(number, problem)
        runs.append(run)
    return runs


def cell_runs(records, other_runs, devices=DEVICES, path=None):
    """Every run of ours per epoch, ``{epoch: [{'seed', 'acc', 'machine', 'recorded'}]}``
    (``acc`` the split measure, ``machine`` the legend's key, ``recorded`` False for an other
    run), the record's first, each ordered by seed.

    Raises
    ------
    RecordError
        When an other run's machine is none of the table's (it would have no line in the
        legend) or the record holds the same seed and epoch from the same machine.
    """
    keys = machine_keys(book_records.book_cell_records(records))
    cells = {}
    for e, rs in table_records(records, devices).items():
        cells[e] = [{'seed': r['seed'], 'acc': r['test_acc'], 'machine': keys[machine_of(r)],
                     'recorded': True} for r in sorted(rs, key=lambda r: r['seed'])]
    for run in other_runs:
        if run['devices'] != devices:
            continue
        key = keys.get(machine_of(run))
        if key is None:
            raise RecordError('%s: the run of seed %d, epoch %d names a machine (%s) that no '
                              'line of the record names, so the legend would not say what it '
                              'is; record one of its epochs or delete the line'
                              % (path or OTHER_RUNS, run['seed'], run['epoch'], run['cpu']))
        mine = cells.setdefault(run['epoch'], [])
        if any(r['recorded'] and (r['seed'], r['machine']) == (run['seed'], key) for r in mine):
            raise RecordError('%s: seed %d, epoch %d on machine %s is in the record already; '
                              'delete the line (a run counts once)' % (path or OTHER_RUNS,
                                                                      run['seed'],
                                                                      run['epoch'], key))
        mine.append({'seed': run['seed'], 'acc': run['test_acc'], 'machine': key,
                     'recorded': False})
    return {e: sorted(rs, key=lambda r: (not r['recorded'], r['seed'])) for e, rs in
            sorted(cells.items())}


def dip_cells(records, other_runs, gpu_runs, devices=DEVICES, path=None):
    """One dict per epoch 1-4: ``epoch``, ``runs`` (``cell_runs``), ``seeds`` (the record's),
    ``mean``, ``gpu`` (the later editions' ``gpu_summary``), ``p_mean`` (the odds that as many
    GPU runs average at most our mean), ``below`` (ours below the GPU runs' 10th percentile),
    ``p_below`` (the odds that as many GPU runs hold as many or more below it), ``expected``
    (how many of ours would, at the GPU runs' rate); the odds are Fractions, None without runs.
    """
    by_epoch = cell_runs(records, other_runs, devices, path)
    cells = []
    for e in range(1, book_records.RUN_EPOCHS + 1):
        runs = by_epoch.get(e, [])
        gpu = gpu_runs['later', devices, e]
        summary = book_records.gpu_summary(gpu)
        values = [r['acc'] for r in runs]
        cell = {'epoch': e, 'runs': runs, 'seeds': len({r['seed'] for r in runs
                                                        if r['recorded']}),
                'gpu': summary, 'mean': None, 'p_mean': None, 'below': None, 'p_below': None,
                'expected': None}
        if values:
            p10 = summary['p10']
            cell.update(mean=sum(values) / len(values),
                        below=sum(v < p10 for v in values),
                        expected=len(values) * sum(v < p10 for v in gpu) / len(gpu))
            cell.update(p_mean=mean_at_most(gpu, len(values), cell['mean']),
                        p_below=at_least_below(gpu, len(values), cell['below'], p10))
        cells.append(cell)
    return cells


def threshold(cells):
    """The odds below which one cell's count says our runs dip more: ``FAMILY_ODDS`` shared
    over every odds of ``cells`` (two per cell)."""
    return FAMILY_ODDS / (2 * len(cells))


def cell_answer(cell, cells):
    """One cell's part of ``answer``: 'open' (fewer than ``MIN_DIP_SEEDS`` seeds of the
    record), 'more' (one of its odds below ``threshold(cells)``) or 'as often'."""
    if cell['seeds'] < MIN_DIP_SEEDS:
        return 'open'
    return 'more' if min(cell['p_mean'], cell['p_below']) < threshold(cells) else 'as often'


def answer(cells):
    """``(status, lowest)``: status 'open' when a cell is open, else 'more' when a cell is
    (``cell_answer``), else 'as often'; ``lowest`` the lowest odds as ``(odds, epoch, 'mean'
    or 'below')``, None without runs."""
    odds = [(c[k], c['epoch'], k[2:]) for c in cells for k in ('p_mean', 'p_below')
            if c[k] is not None]
    parts = {cell_answer(c, cells) for c in cells}
    status = 'open' if 'open' in parts else 'more' if 'more' in parts else 'as often'
    return status, min(odds) if odds else None


WORDS = {
    'en': {
        'row': '- epoch %(epoch)d, %(n)d runs (%(seeds)d seeds of the record): %(runs)s; mean '
               '%(mean).3f, GPU runs %(gpu_median).3f (10th percentile %(p10).3f): %(p_mean)s '
               'of %(n_draws)s draws average as low; below %(p10).3f %(below)d of ours '
               '(%(expected).1f expected), %(p_below)s of draws hold as many: %(verdict)s',
        'empty': '- epoch %(epoch)d: no run yet',
        'cell': {'open': 'open, %d of %d seeds', 'more': 'dips MORE often',
                 'as often': 'dips as the GPU runs do'},
        'open': 'Not answered yet: the record holds %s seeds at epochs 1-%d, %d needed at '
                'each. So far the lowest of the odds is %s (epoch %d, %s).',
        'more': 'Our 2-device runs dip **more often** than the GPU runs: at epoch %d the odds '
                '%s (%s) are below %s, the 5%% shared over the %d odds.',
        'as often': 'Our 2-device runs dip **as the GPU runs do**: the lowest of the %d odds '
                    'is %s (epoch %d, %s), above %s, the 5%% shared over them; in all %d of '
                    'our %d values read below the GPU runs\' 10th percentile, where %.1f would '
                    'at their rate.',
        'mean': 'the mean', 'below': 'the count below the 10th percentile',
        'counts': lambda counts: ', '.join(counts[:-1]) + ' and ' + counts[-1],
    },
    'zh': {
        'row': '- 第 %(epoch)d 个迭代周期，%(n)d 次运行（记录中 %(seeds)d 个随机种子）：%(runs)s；均值 '
               '%(mean).3f，GPU 运行 %(gpu_median).3f（第 10 百分位 %(p10).3f）：%(n_draws)s '
               '次抽取的均值这么低的概率为 %(p_mean)s；低于 %(p10).3f 的，我们有 %(below)d 次'
               '（按 GPU 的比例应有 %(expected).1f 次），抽取中同样多或更多的概率为 %(p_below)s：'
               '%(verdict)s',
        'empty': '- 第 %(epoch)d 个迭代周期：尚无运行',
        'cell': {'open': '未定，已有 %d 个随机种子，需要 %d 个', 'more': '比 GPU 运行更常下探',
                 'as often': '与 GPU 运行一样偶尔下探'},
        'open': '尚未回答：记录中各格的随机种子数为 %s（第 1-%d 个迭代周期），每格需要 %d 个。目前各'
                '概率中最低的是 %s（第 %d 个迭代周期，%s）。',
        'more': '我们的 2 设备运行比 GPU 运行**更常下探**：第 %d 个迭代周期的概率 %s（%s）低于 %s，'
                '即 5%% 由 %d 个概率分担后的份额。',
        'as often': '我们的 2 设备运行**与 GPU 运行一样**偶尔下探：%d 个概率中最低的是 %s（第 %d '
                    '个迭代周期，%s），高于 %s，即 5%% 由它们分担后的份额；总计我们 %d 个数值中'
                    '有 %d 个低于 GPU 运行的第 10 百分位，按 GPU 的比例应有 %.1f 个。',
        'mean': '均值', 'below': '低于第 10 百分位的个数',
        'counts': lambda counts: '、'.join(counts),
    },
}


def percent(odds):
    """Odds as a percentage with one decimal, or two below 1%."""
    value = 100 * float(odds)
    return '%.*f%%' % (2 if value < 1 else 1, value)


def _runs(cell):
    return ', '.join('s%d %.3f %s' % (r['seed'], r['acc'], r['machine']) for r in cell['runs'])


DIP_TITLES = ['epoch', 'our runs: seed, accuracy split over both devices, machine',
              'runs (seeds of the record)', 'our mean',
              'later editions on 2 GPUs: runs, median (10th pct.)',
              'odds: as many GPU runs average as low', 'ours below their 10th pct. (expected)',
              'odds: as many GPU runs hold as many below', 'answer']


def dip_rows(cells):
    """The page's table of ``dip_cells``: lists of cell texts, headed by ``DIP_TITLES``."""
    rows = [DIP_TITLES]
    for c in cells:
        if not c['runs']:
            rows.append([str(c['epoch']), '-', '0 (0)'] + ['-'] * 5 + [
                _verdict(c, cells, 'en')])
            continue
        g = c['gpu']
        rows.append([str(c['epoch']), _runs(c), '%d (%d)' % (len(c['runs']), c['seeds']),
                     '%.3f' % c['mean'], '%d, %.3f (%.3f)' % (g['n'], g['median'], g['p10']),
                     percent(c['p_mean']), '%d (%.1f)' % (c['below'], c['expected']),
                     percent(c['p_below']), _verdict(c, cells, 'en')])
    return rows


def _verdict(cell, cells, lang):
    said = WORDS[lang]['cell'][cell_answer(cell, cells)]
    return said % (cell['seeds'], MIN_DIP_SEEDS) if '%d' in said else said


def dip_list(cells, lang='en'):
    """The notebooks' lines of ``dip_cells`` in ``lang`` ('en' or 'zh'): one Markdown list
    line per epoch."""
    words = WORDS[lang]
    return [words['row'] % dict(
        c, n=len(c['runs']), runs=_runs(c), gpu_median=c['gpu']['median'], p10=c['gpu']['p10'],
        n_draws='%d^%d' % (c['gpu']['n'], len(c['runs'])), p_mean=percent(c['p_mean']),
        p_below=percent(c['p_below']), verdict=_verdict(c, cells, lang)) if c['runs']
        else words['empty'] % c for c in cells]


def dip_answer(cells, lang='en'):
    """The answer's paragraph in ``lang`` (``answer``); None without runs."""
    words = WORDS[lang]
    status, lowest = answer(cells)
    if lowest is None:
        return None
    said = (percent(lowest[0]), lowest[1], words[lowest[2]])
    cut = '%g%%' % (100 * float(threshold(cells)))
    if status == 'open':
        counts = words['counts']([str(c['seeds']) for c in cells])
        return words['open'] % ((counts, len(cells), MIN_DIP_SEEDS) + said)
    if status == 'more':
        return words['more'] % (lowest[1], percent(lowest[0]), words[lowest[2]], cut,
                                2 * len(cells))
    ran = [c for c in cells if c['runs']]
    return words['as often'] % ((2 * len(cells),) + said + (
        cut, sum(c['below'] for c in ran),
        sum(len(c['runs']) for c in ran), sum(c['expected'] for c in ran)))


def format_dips(cells, lang='en'):
    """The notebooks' answer in ``lang``: ``dip_list``'s lines, then ``dip_answer``."""
    text = dip_answer(cells, lang)
    return dip_list(cells, lang) + ([] if text is None else ['', text])
