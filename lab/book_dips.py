"""Do our runs dip more often than the GPU runs, and do they sit low? Each cell of the book's
table (1 or 2 devices, epochs 1-4) holds every run of ours that reached it, measured as the
later MXNet editions measure (the record's ``test_acc``: on 2 GPUs the test set split over both
devices, each with its own running statistics; on 1 device the book's measure), beside those
editions' GPU runs (``book_records.read_gpu_runs``). Per cell two exact odds (``gpu_run_odds``,
every draw with replacement counted):

- how often as many GPU runs average as low as ours;
- how often as many GPU runs hold as many values below the GPU runs' own 10th percentile.

The runs are the record's (docs/records/book-table.jsonl, one per seed and epoch) and the other
runs of the same code whose epochs are not in it (docs/records/book-table-other-runs.jsonl: runs
of a seed the record holds from another machine at those epochs, and the training cells of the
notebook executed at the book's settings, named by their data order's seed). The question is
answered once every cell holds ``MIN_DIP_SEEDS`` seeds of the record: our runs dip more often
than the GPU runs when one of the eight odds is below ``FAMILY_ODDS`` shared over the eight
(Bonferroni), as the GPU runs do otherwise.

Whether our runs sit low is asked once per setting, over all its cells (``pooled``): each of
our values takes its place among the GPU runs of its epoch, and the mean place is set against
GPU runs drawn whole, one for each run of ours (a seed on a machine) at that run's epochs, so
the epochs one run shares count as one draw; the odds are exact. Below ``POOLED_ODDS`` our runs
sit low. ``book_table.py --tables`` writes both answers into docs/book-comparison.md and both
notebooks; functions here return data and text.
"""
import json
import math
import os
from fractions import Fraction

import book_records
from book_records import RecordError, each_seed, machine_keys, machine_of, table_records
from gpu_run_odds import at_least_below, mean_at_most, sum_at_most

OTHER_RUNS = os.path.join(book_records.RECORDS, 'book-table-other-runs.jsonl')
DEVICES = 2
MIN_DIP_SEEDS = 6
FAMILY_ODDS = Fraction(5, 100)  # shared by the cells' odds: 2 per epoch
POOLED_ODDS = Fraction(1, 100)  # one per setting: below it, our runs sit low
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
    restore = 'git checkout %s' % os.path.relpath(path, book_records.ROOT)

    def refuse(number, what):
        raise RecordError('%s, line %d: %s; fix the line or restore the file: %s'
                          % (path, number, what, restore))
    try:
        with book_records.open_input(path) as f:
            data = f.read(OTHER_LIMIT + 1)
    except OSError as e:
        reason = getattr(e, 'reason', None) or e.strerror  # open_input's, or the system's
        if reason == 'does not exist':
            return []
        raise RecordError('%s %s; restore it: %s' % (path, reason, restore)) from None
    if len(data) > OTHER_LIMIT:
        raise RecordError('%s holds more than %d MB; restore it: %s'
                          % (path, OTHER_LIMIT >> 20, restore))
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
                              'delete the line (a run counts once)'
                              % (path or OTHER_RUNS, run['seed'], run['epoch'], key))
        mine.append({'seed': run['seed'], 'acc': run['test_acc'], 'machine': key,
                     'recorded': False})
    return {e: sorted(rs, key=lambda r: (not r['recorded'], r['seed'])) for e, rs in
            sorted(cells.items())}


def dip_cells(records, other_runs, gpu_runs, devices=DEVICES, path=None):
    """One dict per epoch 1-4: ``devices``, ``epoch``, ``runs`` (``cell_runs``), ``seeds`` (the
    record's), ``mean``, ``gpu`` (the later editions' ``gpu_summary``), ``p_mean`` (the odds
    that as many GPU runs average at most our mean), ``below`` (ours below the GPU runs' 10th
    percentile), ``p_below`` (the odds that as many GPU runs hold as many or more below it),
    ``expected`` (how many of ours would, at the GPU runs' rate); the odds are Fractions, None
    without runs.
    """
    by_epoch = cell_runs(records, other_runs, devices, path)
    cells = []
    for e in range(1, book_records.RUN_EPOCHS + 1):
        runs = by_epoch.get(e, [])
        gpu = gpu_runs['later', devices, e]
        summary = book_records.gpu_summary(gpu)
        values = [r['acc'] for r in runs]
        cell = {'devices': devices, 'epoch': e, 'runs': runs,
                'seeds': len({r['seed'] for r in runs if r['recorded']}),
                'gpu': summary, 'mean': None, 'p_mean': None, 'below': None, 'p_below': None,
                'expected': None}
        if values:
            p10 = summary['p10']
            cell.update(mean=book_records.total(values) / len(values),
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
        'more': 'Our %d-device runs dip **more often** than the GPU runs: at epoch %d the odds '
                '%s (%s) are below %s, the 5%% shared over the %d odds.',
        'as often': 'Our %d-device runs dip **as the GPU runs do**: the lowest of the %d odds '
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
        'more': '我们的 %d 设备运行比 GPU 运行**更常下探**：第 %d 个迭代周期的概率 %s（%s）低于 %s，'
                '即 5%% 由 %d 个概率分担后的份额。',
        'as often': '我们的 %d 设备运行**与 GPU 运行一样**偶尔下探：%d 个概率中最低的是 %s（第 %d '
                    '个迭代周期，%s），高于 %s，即 5%% 由它们分担后的份额；总计我们有 %d 个数值'
                    '低于 GPU 运行的第 10 百分位（共 %d 个），按 GPU 的比例应有 %.1f 个。',
        'mean': '均值', 'below': '低于第 10 百分位的个数',
        'counts': lambda counts: '、'.join(counts),
    },
}


def percent(odds):
    """Odds as a percentage with one decimal, or two below 1%."""
    value = 100 * float(odds)
    return '%.*f%%' % (2 if value < 1 else 1, value)


def dip_titles(devices):
    """The titles of ``dip_rows``' columns for ``devices`` (1 or 2)."""
    return ['epoch', 'our runs: seed, accuracy %s, machine' % (
                'split over both devices' if devices == 2 else 'on device 0 (the book\'s)'),
            'runs (seeds of the record)', 'our mean',
            'later editions on %s: runs, median (10th pct.)' % book_records.plural(devices, 'GPU'),
            'odds: as many GPU runs average as low', 'ours below their 10th pct. (expected)',
            'odds: as many GPU runs hold as many below', 'answer']


def dip_rows(cells):
    """The page's table of ``dip_cells``: lists of cell texts, headed by ``dip_titles``."""
    rows = [dip_titles(cells[0]['devices'])]
    for c in cells:
        if not c['runs']:
            rows.append([str(c['epoch']), '-', '0 (0)'] + ['-'] * 5 + [
                _verdict(c, cells, 'en')])
            continue
        g = c['gpu']
        rows.append([str(c['epoch']), each_seed(c), '%d (%d)' % (len(c['runs']), c['seeds']),
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
        c, n=len(c['runs']), runs=each_seed(c), gpu_median=c['gpu']['median'], p10=c['gpu']['p10'],
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
    devices = cells[0]['devices']
    if status == 'more':
        return words['more'] % (devices, lowest[1], percent(lowest[0]), words[lowest[2]], cut,
                                2 * len(cells))
    ran = [c for c in cells if c['runs']]
    return words['as often'] % ((devices, 2 * len(cells)) + said + (
        cut, sum(c['below'] for c in ran),
        sum(len(c['runs']) for c in ran), book_records.total(c['expected'] for c in ran)))


def format_dips(cells, lang='en'):
    """The notebooks' answer in ``lang``: ``dip_list``'s lines, then ``dip_answer``."""
    text = dip_answer(cells, lang)
    return dip_list(cells, lang) + ([] if text is None else ['', text])


def _ticks(value):
    return round(value * 1000)  # thousandths, as the GPU runs print them


def pooled(cells, whole_runs):
    """Whether our runs of one setting sit low, over all its cells: ``devices``, ``runs`` (one
    dict per run of ours, a seed on a machine: ``seed``, ``machine``, ``acc`` ``{epoch:
    accuracy}`` and ``place``), ``values``, ``gpu_runs`` (how many whole runs), ``place`` (our
    values' mean place among the GPU runs) and ``odds`` (a Fraction, None without runs).

    A value's place among the GPU runs of its epoch is the share of them below it, those equal
    to it counting half (both in thousandths, as the GPU runs print them): 0 lowest, 1 highest.
    ``odds`` is exact: the share of all draws, one of ``whole_runs`` (the later editions' runs
    of the setting with epochs 1-4, ``book_records.read_gpu_runs(whole=True)``) for each run of
    ours, taken at that run's epochs, whose mean place is at most ours. Drawn whole, the GPU
    runs carry each run's epochs together, as a seed of ours does; their mean place is 0.5.
    ``seed_odds`` counts seeds, not runs: the runs of one seed on several machines share its
    data order and initial weights, so their places are averaged per epoch and the seed is set
    against one GPU run. Our runs sit low only when both odds are below ``POOLED_ODDS``.
    """
    columns = [sorted(_ticks(r[e]) for r in whole_runs) for e in range(book_records.RUN_EPOCHS)]

    def score(epoch, value):  # twice the count below, plus the count equal
        column, t = columns[epoch - 1], _ticks(value)
        return 2 * sum(g < t for g in column) + sum(g == t for g in column)
    runs = {}
    for c in cells:
        for r in c['runs']:
            runs.setdefault((r['seed'], r['machine']), {})[c['epoch']] = r['acc']
    n = len(whole_runs)
    result = {'devices': cells[0]['devices'], 'runs': [], 'values': 0, 'gpu_runs': n,
              'place': None, 'odds': None}
    ours, groups = 0, []
    for (seed, machine), acc in sorted(runs.items()):
        mine = sum(score(e, v) for e, v in acc.items())
        result['runs'].append({'seed': seed, 'machine': machine, 'acc': acc,
                               'place': Fraction(mine, 2 * n * len(acc))})
        groups.append([sum(score(e, r[e - 1]) for e in acc) for r in whole_runs])
        ours += mine
        result['values'] += len(acc)
    if groups:
        result.update(place=Fraction(ours, 2 * n * result['values']),
                      odds=sum_at_most(groups, ours))
        seeds = {}
        for r in result['runs']:
            for e, v in r['acc'].items():
                seeds.setdefault(r['seed'], {}).setdefault(e, []).append(score(e, v))
        # Scores times ``m``, so that each epoch's mean over a seed's runs stays whole.
        m = math.lcm(*(len(scores) for acc in seeds.values() for scores in acc.values()))
        result['seed_odds'] = sum_at_most(
            [[m * sum(score(e, r[e - 1]) for e in acc) for r in whole_runs]
             for acc in seeds.values()],
            sum(m * sum(scores) // len(scores) for acc in seeds.values()
                for scores in acc.values()))
    return result


POOLED_WORDS = {
    'en': {
        'row': '- %(devices)d device%(s)s, each run of ours (seed, machine, epochs) with its mean '
               'place: %(each)s; over all %(values)d values %(place).3f, where GPU runs drawn '
               'whole average 0.500; %(odds)s of the %(n)d^%(k)d draws place as low',
        'empty': '- %(devices)d device%(s)s: no run yet',
        'low': 'Our %(devices)d-device runs **sit low**: their mean place among the GPU runs is '
               '%(place).3f (GPU runs drawn whole: 0.500), and whole GPU runs drawn for our '
               '%(runs)d runs place as low only %(odds)s of the time (%(seed_odds)s counted by '
               'seed), below %(cut)s. The causes '
               'docs/book-comparison.md named (%(causes)s) are each tested on saved states of '
               'our 1-device runs in its section "What lowers the book\'s measure".',
        'not low': 'Our %(devices)d-device runs do not sit low beyond chance: their mean place '
                   'among the GPU runs is %(place).3f (GPU runs drawn whole: 0.500), and whole '
                   'GPU runs drawn for our %(runs)d runs place as low %(odds)s of the time '
                   '(%(seed_odds)s counted by seed), not both below %(cut)s.',
        'causes': 'the running statistics\' update on the last, short batch; BatchNorm\'s '
                  'update on the CPU against cuDNN\'s on the GPUs; the order of the data',
    },
    'zh': {
        'row': '- %(devices)d 个设备，我们的每次运行（随机种子、机器、迭代周期）及其平均位置：'
               '%(each)s；全部 %(values)d 个数值的平均位置 %(place).3f，整次抽取的 GPU 运行平均为 '
               '0.500；%(n)d^%(k)d 次抽取中位置这么低的占 %(odds)s',
        'empty': '- %(devices)d 个设备：尚无运行',
        'low': '我们的 %(devices)d 设备运行**偏低**：它们在 GPU 运行中的平均位置为 %(place).3f'
               '（整次抽取的 GPU 运行为 0.500），为我们 %(runs)d 次运行整次抽取的 GPU 运行位置同样低'
               '的概率只有 %(odds)s（按随机种子计为 %(seed_odds)s），低于 %(cut)s。'
               'docs/book-comparison.md 列出的原因（%(causes)s）都已在我们 1 设备运行保存的状态上'
               '逐一检验，见其“What lowers the book\'s measure”一节。',
        'not low': '我们的 %(devices)d 设备运行并未超出偶然地偏低：它们在 GPU 运行中的平均位置为 '
                   '%(place).3f（整次抽取的 GPU 运行为 0.500），为我们 %(runs)d 次运行整次抽取的 '
                   'GPU 运行位置同样低的概率为 %(odds)s（按随机种子计为 %(seed_odds)s），并非都低于 '
                   '%(cut)s。',
        'causes': '最后一个较小批量对运行统计量的更新；CPU 上与 GPU 上 cuDNN 的 BatchNorm 更新之差；'
                  '数据的顺序',
    },
}


def _each_run(result):
    return ', '.join('s%d %s %s %.2f' % (r['seed'], r['machine'], _epochs(sorted(r['acc'])),
                                         r['place']) for r in result['runs'])


def _epochs(epochs):
    if epochs == list(range(epochs[0], epochs[-1] + 1)) and len(epochs) > 1:
        return '%d-%d' % (epochs[0], epochs[-1])
    return ','.join(map(str, epochs))


def pooled_verdict(result):
    """'low' when ``pooled``'s odds are below ``POOLED_ODDS``, else 'not low'; None without
    runs."""
    if result['odds'] is None:
        return None
    return 'low' if max(result['odds'], result['seed_odds']) < POOLED_ODDS else 'not low'


def pooled_answer(result, lang='en'):
    """``pooled``'s answer in ``lang`` ('en' or 'zh'), one sentence when the odds are not below
    ``POOLED_ODDS``, else with the candidate causes to test next; None without runs."""
    verdict = pooled_verdict(result)
    if verdict is None:
        return None
    words = POOLED_WORDS[lang]
    return words[verdict] % dict(result, place=float(result['place']), runs=len(result['runs']),
                                 odds=percent(result['odds']), causes=words['causes'],
                                 seed_odds=percent(result['seed_odds']),
                                 cut='%g%%' % (100 * float(POOLED_ODDS)))


POOLED_TITLES = ['setting', 'each run of ours: seed, machine, epochs, mean place', 'runs',
                 'values', 'our mean place (GPU runs: 0.500)', 'later editions\' whole runs',
                 'odds: as many whole GPU runs place as low', 'odds counted by seed', 'answer']


def pooled_rows(results):
    """The page's table of ``pooled`` per setting: lists of cell texts, headed by
    ``POOLED_TITLES``."""
    rows = [POOLED_TITLES]
    for r in results:
        setting = book_records.plural(r['devices'], 'device')
        verdict = pooled_verdict(r)
        if verdict is None:
            rows.append([setting, '-', '0', '0', '-', str(r['gpu_runs']), '-', '-', '-'])
            continue
        rows.append([setting, _each_run(r), str(len(r['runs'])), str(r['values']),
                     '%.3f' % r['place'], str(r['gpu_runs']), percent(r['odds']),
                     percent(r['seed_odds']),
                     'sits low' if verdict == 'low' else 'not below %g%%' % (
                         100 * float(POOLED_ODDS))])
    return rows


def pooled_text(results, lang='en'):
    """Each setting's answer (``pooled_answer``) in ``lang``, one paragraph."""
    return (' ' if lang == 'en' else '').join(
        a for a in (pooled_answer(r, lang) for r in results) if a is not None)


def format_pooled(results, lang='en'):
    """The notebooks' lines of ``pooled`` per setting (``results``) in ``lang``: one Markdown
    list line each, then ``pooled_text``."""
    words = POOLED_WORDS[lang]
    lines = [words['row'] % dict(r, s='s' * (r['devices'] > 1), each=_each_run(r),
                                 place=float(r['place']), odds=percent(r['odds']),
                                 n=r['gpu_runs'], k=len(r['runs'])) if r['runs']
             else words['empty'] % dict(r, s='s' * (r['devices'] > 1)) for r in results]
    text = pooled_text(results, lang)
    return lines + (['', text] if text else [])
