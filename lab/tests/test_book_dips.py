"""The answers to the dip question and whether our runs sit low (lab/book_dips.py): every
run of ours on 1 and 2 devices beside the later editions' GPU runs, with exact odds, on the page
and in both notebooks."""
import collections
import json
import os
import re
import sys
from fractions import Fraction

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, 'lab'))
import book_dips  # noqa: E402
import book_records  # noqa: E402
import book_table  # noqa: E402
import gpu_run_odds  # noqa: E402


GPU_RUNS = book_records.read_gpu_runs()
WHOLE_RUNS = book_records.read_gpu_runs(whole=True)
RECORDS = book_records.read_records(book_records.DEFAULT_RECORD)
XEON = 'Intel(R) Xeon(R) Processor'


def _other(**changes):
    run = {'devices': 2, 'seed': 0, 'epoch': 1, 'test_acc': 0.7264, 'cpu': XEON,
           'note': 'a checkpoint'}
    run.update(changes)
    return run


def _cell(epoch, seeds, p_mean, p_below):
    return {'epoch': epoch, 'seeds': seeds, 'p_mean': p_mean, 'p_below': p_below}


def test_the_odds_are_the_issues_and_gpu_run_odds_prints_the_same(capsys):
    # The issue's six epoch-1 runs (mean 0.730): 4.9%; two of six below 0.845 at epoch 3: 4.2%.
    later1, later3 = GPU_RUNS['later', 2, 1], GPU_RUNS['later', 2, 3]
    six = [0.7996, 0.7249, 0.7935, 0.7264, 0.7499, 0.5872]
    assert '%.1f%%' % (100 * float(gpu_run_odds.mean_at_most(later1, 6, sum(six) / 6))) == '4.9%'
    assert '%.1f%%' % (100 * float(gpu_run_odds.at_least_below(later3, 6, 2, 0.845))) == '4.2%'
    # Each cell's odds are those the script prints for its runs and the GPU runs' 10th pct.
    for cell in book_dips.dip_cells(RECORDS, book_dips.read_other_runs(), GPU_RUNS):
        values = [r['acc'] for r in cell['runs']]
        assert gpu_run_odds.main(['--devices', '2', '--epoch', str(cell['epoch']), '--ours'] +
                                 ['%r' % v for v in values] +
                                 ['--below', '%r' % cell['gpu']['p10']]) == 0
        out = capsys.readouterr().out.splitlines()
        assert out[1].endswith(': %.1f%% of all %d^%d draws' % (
            100 * float(cell['p_mean']), len(GPU_RUNS['later', 2, cell['epoch']]),
            len(values))), out
        assert out[2].startswith('below %.3f: %d of ours' % (cell['gpu']['p10'], cell['below']))
        assert out[2].endswith(': %.1f%%' % (100 * float(cell['p_below']))), out


@pytest.mark.parametrize('devices', [1, 2])
def test_every_run_of_a_cell_is_the_records_and_the_other_runs(devices):
    cells = book_dips.dip_cells(RECORDS, book_dips.read_other_runs(), GPU_RUNS, devices)
    recorded = book_records.table_records(RECORDS, devices)
    others = [r for r in book_dips.read_other_runs() if r['devices'] == devices]
    keys = book_records.machine_keys(book_records.book_cell_records(RECORDS))
    for cell in cells:
        mine = recorded.get(cell['epoch'], [])
        assert cell['seeds'] == len(mine)
        assert sorted((r['seed'], r['acc'], r['machine']) for r in cell['runs']) == sorted(
            [(r['seed'], r['test_acc'], keys[book_records.machine_of(r)]) for r in mine] +
            # The Xeon's epochs are machine B's; the notebook's, trained on D, machine D's.
            [(r['seed'], r['test_acc'], 'B' if r['cpu'] == XEON else 'D')
             for r in others if r['epoch'] == cell['epoch']])
        values = [r['acc'] for r in cell['runs']]
        assert cell['mean'] == pytest.approx(sum(values) / len(values))
        p10 = book_records.gpu_summary(GPU_RUNS['later', devices, cell['epoch']])['p10']
        assert cell['below'] == sum(v < p10 for v in values)
        assert cell['devices'] == devices
    # The Xeon's epochs 1-3 of seeds 0-2 are machine B of the legend, whose epoch 4 is recorded.
    xeon = [r for r in others if r['cpu'] == XEON]
    assert sorted((r['seed'], r['epoch']) for r in xeon) == [(s, e) for s in (0, 1, 2)
                                                             for e in (1, 2, 3)]
    assert [r for r in cells[0]['runs'] if r['machine'] == 'B'][-1] == {
        'seed': 2, 'acc': {1: 0.88, 2: 0.5872}[devices], 'machine': 'B', 'recorded': False}
    # The rest are the 4 epochs of the notebook's training cell of this setting: one run, the
    # accuracies the committed notebook printed.
    notebook = sorted((r for r in others if r['cpu'] != XEON), key=lambda r: r['epoch'])
    assert [r['epoch'] for r in notebook] == [1, 2, 3, 4]
    assert len({r['seed'] for r in notebook}) == 1
    with open(os.path.join(ROOT, 'notebooks', 'multiple-gpus-gluon.ipynb'), encoding='utf-8') as f:
        cell, = [c for c in json.load(f)['cells'] if c['metadata'].get('tags') == [
            'train-%d' % devices]]
    printed = re.findall(r'test_acc (\d\.\d+)', ''.join(
        ''.join(o.get('text', '')) for o in cell['outputs']))
    assert ['%.2f' % r['test_acc'] for r in notebook] == printed
    # On 1 device the cells hold the record's device 0, the book's measure.
    assert devices == 2 or all(r['test_acc'] == r['acc_running'][0]
                               for rs in recorded.values() for r in rs)


def test_the_answer_waits_for_six_seeds_and_shares_five_percent_over_eight_odds():
    assert book_dips.threshold([None] * 4) == Fraction(5, 800)
    seen = [_cell(e, 6, Fraction(1, 10), Fraction(1, 2)) for e in (1, 2, 3, 4)]
    assert book_dips.answer(seen) == ('as often', (Fraction(1, 10), 1, 'mean'))
    seen[2]['p_below'] = Fraction(6, 1000)  # just below 0.625%
    assert book_dips.answer(seen) == ('more', (Fraction(6, 1000), 3, 'below'))
    seen[2]['p_below'] = Fraction(7, 1000)
    assert book_dips.answer(seen)[0] == 'as often'
    seen[3]['seeds'] = 5
    assert book_dips.answer(seen)[0] == 'open'
    # Each cell's own part: open below 6 seeds, more when one of its odds is below 5%/8.
    assert [book_dips.cell_answer(c, seen) for c in seen] == ['as often'] * 3 + ['open']
    seen[0]['p_mean'] = Fraction(1, 1000)
    assert [book_dips._verdict(c, seen, 'en') for c in seen] == [
        'dips MORE often', 'dips as the GPU runs do', 'dips as the GPU runs do',
        'open, 5 of 6 seeds']
    assert book_dips._verdict(seen[3], seen, 'zh') == '未定，已有 5 个随机种子，需要 6 个'


def test_the_text_says_each_run_the_odds_and_the_answer():
    cells = book_dips.dip_cells(RECORDS, [_other(), _other(seed=1, test_acc=0.5)], GPU_RUNS)
    lines = book_dips.format_dips(cells)
    first = cells[0]
    assert lines[0].startswith('- epoch 1, %d runs (%d seeds of the record): s0 %.3f A, '
                               % (len(first['runs']), first['seeds'], first['runs'][0]['acc']))
    assert lines[0].endswith(', s0 0.726 B, s1 0.500 B; mean %.3f, GPU runs 0.778 (10th '
                             'percentile 0.702): %s of 107^%d draws average as low; below 0.702 '
                             '%d of ours (%.1f expected), %s of draws hold as many: %s' % (
                                 first['mean'], book_dips.percent(first['p_mean']),
                                 len(first['runs']), first['below'], first['expected'],
                                 book_dips.percent(first['p_below']),
                                 book_dips._verdict(first, cells, 'en')))
    status, lowest = book_dips.answer(cells)
    words = {'open': 'Not answered yet: ', 'more': 'Our 2-device runs dip **more often**',
             'as often': 'Our 2-device runs dip **as the GPU runs do**'}
    assert lines[-1].startswith(words[status]) and book_dips.percent(lowest[0]) in lines[-1]
    assert book_dips.percent(Fraction(1, 300)) == '0.33%'
    assert book_dips.percent(Fraction(1, 8)) == '12.5%'
    zh = book_dips.format_dips(cells, 'zh')
    assert zh[0].startswith('- 第 1 个迭代周期，%d 次运行' % len(first['runs']))
    assert len(zh) == len(lines)
    # Not answered: the seeds of the record per epoch, in both languages.
    few = [dict(c, seeds=s) for c, s in zip(cells, (6, 6, 5, 4))]
    assert book_dips.dip_answer(few).startswith(
        'Not answered yet: the record holds 6, 6, 5 and 4 seeds at epochs 1-4, 6 needed at each.')
    assert book_dips.dip_answer(few, 'zh').startswith(
        '尚未回答：记录中各格的随机种子数为 6、6、5、4（第 1-4 个迭代周期），每格需要 6 个。')
    # Answered: as often, or more often, with the lowest odds.
    seen = [dict(c, seeds=6) for c in cells]
    status, lowest = book_dips.answer(seen)
    assert book_dips.dip_answer(seen).startswith(
        'Our 2-device runs dip **as the GPU runs do**: the lowest of the 8 odds is %s (epoch %d'
        % (book_dips.percent(lowest[0]), lowest[1])) if status == 'as often' else status
    seen[1] = dict(seen[1], p_mean=Fraction(1, 1000))
    assert book_dips.dip_answer(seen) == (
        'Our 2-device runs dip **more often** than the GPU runs: at epoch 2 the odds 0.10% (the '
        'mean) are below 0.625%, the 5% shared over the 8 odds.')


@pytest.mark.parametrize('line, message', [
    ('{"devices": 2', 'line 1: not JSON'),
    ('[1]', 'line 1: not a JSON object'),
    (json.dumps(_other(test_acc=1.5)), 'line 1: test_acc is 1.5, not a number from 0 to 1'),
    (json.dumps(_other(epoch=5)), 'line 1: epoch is 5, not a whole number from 1 to 4'),
    (json.dumps(_other(cpu='')), 'line 1: cpu is "", not a text'),
    (json.dumps(_other(extra=1)), 'line 1: unknown field "extra"'),
    (json.dumps(_other(cpu_flags='avx2')), 'line 1: cpu_flags is "avx2", not a list of CPU '
                                           'flags'),
    (json.dumps(_other(threads=True)), 'line 1: threads is true, not a whole number'),
])
def test_a_bad_other_run_is_one_error_naming_the_line(tmp_path, line, message):
    path = tmp_path / 'other.jsonl'
    path.write_text(line + '\n')
    with pytest.raises(book_records.RecordError) as e:
        book_dips.read_other_runs(str(path))
    assert str(e.value).startswith('%s, %s' % (path, message)), str(e.value)
    assert str(e.value).endswith('; fix the line or restore the file: git checkout %s'
                                 % os.path.relpath(str(path), ROOT))


def test_an_other_run_of_an_unknown_machine_or_a_recorded_epoch_is_refused():
    with pytest.raises(book_records.RecordError, match=r'the run of seed 0, epoch 1 names a '
                       r'machine \(Some CPU\) that no line of the record names'):
        book_dips.dip_cells(RECORDS, [_other(cpu='Some CPU')], GPU_RUNS)
    with pytest.raises(book_records.RecordError, match='seed 0, epoch 4 on machine B is in '
                       r'the record already; delete the line \(a run counts once\)'):
        book_dips.dip_cells(RECORDS, [_other(epoch=4)], GPU_RUNS)
    # A 1-device line is no run of the 2-device cells.
    assert book_dips.dip_cells(RECORDS, [_other(devices=1)], GPU_RUNS) == book_dips.dip_cells(
        RECORDS, [], GPU_RUNS)


def test_a_tampered_other_runs_file_is_one_line_and_exit_2_and_writes_nothing(
        tmp_path, monkeypatch, capsys, data_dir):
    other = tmp_path / 'other.jsonl'
    other.write_text(json.dumps(_other(test_acc='0.9')) + '\n')
    monkeypatch.setattr(book_dips, 'OTHER_RUNS', str(other))
    page = tmp_path / 'page.md'
    page.write_bytes(open(book_table.PAGE, 'rb').read())
    monkeypatch.setattr(book_table, 'PAGE', str(page))
    assert book_table.main(['--tables', '--data-dir', data_dir]) == 2
    err = capsys.readouterr().err
    assert err == ('lab/book_table.py: error: %s, line 1: test_acc is "0.9", not a '
                   'number from 0 to 1; fix the line or restore the file: git checkout %s\n'
                   % (other, os.path.relpath(str(other), ROOT)))
    assert page.read_bytes() == open(os.path.join(ROOT, 'docs', 'book-comparison.md'),
                                     'rb').read()


@pytest.mark.parametrize('name, devices', [('dips-1', 1), ('dips', 2)])
def test_the_page_gives_each_cell_and_the_answer_of_the_records(name, devices):
    cells = book_dips.dip_cells(RECORDS, book_dips.read_other_runs(), GPU_RUNS, devices)
    with open(book_table.PAGE, encoding='utf-8') as f:
        block = book_table.read_blocks(f.read())[name].split('\n')
    assert block[0] == '| %s |' % ' | '.join(book_dips.dip_titles(devices))
    rows = [line.strip('|').split(' | ') for line in block[2:6]]
    assert [[c.strip() for c in row] for row in rows] == [
        [str(c['epoch']), ', '.join('s%d %.3f %s' % (r['seed'], r['acc'], r['machine'])
                                    for r in c['runs']),
         '%d (%d)' % (len(c['runs']), c['seeds']), '%.3f' % c['mean'],
         '%d, %.3f (%.3f)' % (len(GPU_RUNS['later', devices, c['epoch']]), c['gpu']['median'],
                              c['gpu']['p10']),
         book_dips.percent(c['p_mean']), '%d (%.1f)' % (c['below'], c['expected']),
         book_dips.percent(c['p_below']), book_dips._verdict(c, cells, 'en')] for c in cells]
    assert block[6:] == ['', book_dips.dip_answer(cells)]


def _marked(text, name):
    return text.split('<!-- begin %s -->\n' % name)[1].split('<!-- end %s -->' % name)[0]


@pytest.mark.parametrize('lang', sorted(book_table.NOTEBOOKS))
def test_both_notebooks_give_the_answers_of_the_records(lang):
    nb = json.load(open(book_table.NOTEBOOKS[lang], encoding='utf-8'))
    [cell] = [c for c in nb['cells'] if 'book-table' in c['metadata'].get('tags', [])]
    text = ''.join(cell['source'])
    results = []
    for name, devices in (('dips-1', 1), ('dips', 2)):
        cells = book_dips.dip_cells(RECORDS, book_dips.read_other_runs(), GPU_RUNS, devices)
        assert _marked(text, name) == ''.join(line + '\n' for line in book_dips.dip_list(
            cells, lang) + ['', book_dips.dip_answer(cells, lang)])
        results.append(book_dips.pooled(cells, WHOLE_RUNS['later', devices]))
    lines = _marked(text, 'pooled').split('\n')
    assert lines[-1] == '' and lines[2] == ''
    for line, r in zip(lines, results):
        assert line.startswith({'en': '- %d device%s, each run of ours', 'zh': '- %d 个设备，'}[
            lang] % ((r['devices'], 's' * (r['devices'] > 1)) if lang == 'en' else
                     r['devices']))
        assert ('%.3f' % r['place']) in line and book_dips.percent(r['odds']) in line
        assert '105^%d' % len(r['runs']) in line
    assert lines[3] == book_dips.pooled_text(results, lang)


def test_fill_notebook_dips_fills_each_answer_and_needs_its_markers():
    report = {'dips': {d: book_dips.dip_cells(RECORDS, [], GPU_RUNS, d) for d in (1, 2)}}
    report['pooled'] = [book_dips.pooled(report['dips'][d], WHOLE_RUNS['later', d])
                        for d in (1, 2)]
    source = ''.join('<!-- begin %s -->\nold\n<!-- end %s -->\n' % (n, n)
                     for n in ('dips', 'dips-1', 'pooled'))
    assert book_table.fill_notebook_dips('a\n' + source, report, 'en') == 'a\n' + ''.join(
        '<!-- begin %s -->\n%s<!-- end %s -->\n' % (n, ''.join(line + '\n' for line in lines), n)
        for n, lines in (('dips', book_dips.format_dips(report['dips'][2])),
                         ('dips-1', book_dips.format_dips(report['dips'][1])),
                         ('pooled', book_dips.format_pooled(report['pooled']))))
    for name, what in (('dips-1', 'the 1-device answer to the dip question'),
                       ('dips', 'the answer to the dip question'),
                       ('pooled', 'the answer whether our runs sit low')):
        without = source.replace('<!-- begin %s -->' % name, '')
        with pytest.raises(ValueError, match='holds no "<!-- begin %s -->" ... "<!-- end %s '
                                             '-->" lines, so %s would not be written'
                                             % (name, name, what)):
            book_table.fill_notebook_dips(without, report, 'en')


def test_sum_at_most_counts_every_draw_exactly():
    assert gpu_run_odds.sum_at_most([[0, 1], [0, 1]], 1) == Fraction(3, 4)
    assert gpu_run_odds.sum_at_most([[0, 2, 4], [1]], 2) == Fraction(1, 3)
    assert gpu_run_odds.sum_at_most([[0, 2, 4], [1]], 5) == 1
    assert gpu_run_odds.sum_at_most([[3, 4], [1]], 0) == 0
    assert gpu_run_odds.sum_at_most([[3, 4], [1]], -5) == 0  # no draw sums below 0
    # mean_at_most is the sum of thousandths: 0.5 and 0.7, two draws average at most 0.6 in 3
    # of 4 (1.0, 1.2, 1.2; not 1.4).
    assert gpu_run_odds.mean_at_most([0.5, 0.7], 2, 0.6) == Fraction(3, 4)


def _tiny(first, second, third):
    """Cells of 1 device: seed 0 on machine A at epochs 1 and 2, seed 1 at epoch 2."""
    runs = {1: [{'seed': 0, 'acc': first, 'machine': 'A', 'recorded': True}],
            2: [{'seed': 0, 'acc': second, 'machine': 'A', 'recorded': True},
                {'seed': 1, 'acc': third, 'machine': 'A', 'recorded': True}]}
    return [{'devices': 1, 'epoch': e, 'runs': runs.get(e, [])} for e in (1, 2, 3, 4)]


THREE = [(0.1,) * 4, (0.2,) * 4, (0.3,) * 4]


def test_pooled_places_each_value_and_counts_whole_draws_exactly():
    # Places among 0.1, 0.2, 0.3: 0.15 is above one (1/3), 0.2 above one and equal to one
    # (1/2), 0.35 above all (1). Seed 0's run: 5/12; seed 1's: 1; all three values: 11/18.
    result = book_dips.pooled(_tiny(0.15, 0.2, 0.35), THREE)
    assert [(r['seed'], r['machine'], r['acc'], r['place']) for r in result['runs']] == [
        (0, 'A', {1: 0.15, 2: 0.2}, Fraction(5, 12)), (1, 'A', {2: 0.35}, Fraction(1))]
    assert (result['values'], result['gpu_runs'], result['place']) == (3, 3, Fraction(11, 18))
    # A whole GPU run drawn for seed 0 scores 2, 6 or 10 (its two epochs), one for seed 1
    # 1, 3 or 5; ours score 11: 7 of the 9 draws are at most that.
    assert result['odds'] == result['seed_odds'] == Fraction(7, 9)  # one run per seed
    assert book_dips.pooled_verdict(result) == 'not low'
    assert book_dips.pooled_answer(result) == (
        'Our 1-device runs do not sit low beyond chance: their mean place among the GPU runs is '
        '0.611 (GPU runs drawn whole: 0.500), and whole GPU runs drawn for our 2 runs place as '
        'low 77.8% of the time (77.8% counted by seed), not both below 1%.')
    assert book_dips.pooled_answer(result, 'zh') == (
        '我们的 1 设备运行并未超出偶然地偏低：它们在 GPU 运行中的平均位置为 0.611（整次抽取的 GPU '
        '运行为 0.500），为我们 2 次运行整次抽取的 GPU 运行位置同样低的概率为 77.8%（按随机种子计为 '
        '77.8%），并非都低于 1%。')
    # Seed 0 on a second machine, at epoch 2: 0.35 scores 6 (places times 6). Counted by run,
    # draws for s0 A (2, 6 or 10), s0 B and s1 A (1, 3 or 5 each) sum to at most ours, 5 + 6 +
    # 6, in 24 of 27. Counted by seed, seed 0's epoch 2 is the mean of 3 and 6: times 2, seed
    # 0 scores 4 + 9 and seed 1 12; draws of 4, 12 or 20 and of 2, 6 or 10 are at most 25 in 7
    # of 9.
    two = _tiny(0.15, 0.2, 0.35)
    two[1]['runs'].append({'seed': 0, 'acc': 0.35, 'machine': 'B', 'recorded': True})
    result = book_dips.pooled(two, THREE)
    assert (result['odds'], result['seed_odds']) == (Fraction(8, 9), Fraction(7, 9))
    # Ties are counted in thousandths, as the GPU runs print them: 0.2004 is equal to 0.2.
    assert book_dips.pooled(_tiny(0.15, 0.2004, 0.35), THREE)['place'] == Fraction(11, 18)
    # Below every GPU run: no draw is as low, so the odds are 0 and the causes are named.
    low = book_dips.pooled(_tiny(0.05, 0.05, 0.05), THREE)
    assert (low['place'], low['odds'], book_dips.pooled_verdict(low)) == (0, 0, 'low')
    assert book_dips.pooled_answer(low).endswith(
        'place as low only 0.00% of the time (0.00% counted by seed), below 1%. The causes docs/book-comparison.md '
        'named (the running statistics\' update on the last, short batch; BatchNorm\'s update '
        'on the CPU against cuDNN\'s on the GPUs; the order of the data) are each tested on '
        'saved states of our 1-device runs in its section "What lowers the book\'s measure".')
    assert book_dips.pooled_rows([low])[1][-1] == 'sits low'
    empty = book_dips.pooled([dict(c, runs=[]) for c in _tiny(0.1, 0.1, 0.1)], THREE)
    assert (empty['odds'], book_dips.pooled_answer(empty), book_dips.format_pooled([empty])) == (
        None, None, ['- 1 device: no run yet'])


def _odds_by_counting(groups, limit):
    """The odds ``sum_at_most`` gives, counted another way: a Counter of sums per draw."""
    sums = collections.Counter({0: 1})
    for group in groups:
        step = collections.Counter()
        for total, count in sums.items():
            for g in group:
                step[total + g] += count
        sums = step
    return Fraction(sum(c for t, c in sums.items() if t <= limit), sum(sums.values()))


@pytest.mark.parametrize('devices', [1, 2])
def test_pooled_of_the_record_keeps_each_run_whole(devices):
    cells = book_dips.dip_cells(RECORDS, book_dips.read_other_runs(), GPU_RUNS, devices)
    whole = WHOLE_RUNS['later', devices]
    result = book_dips.pooled(cells, whole)
    # One run of ours per seed and machine, at the epochs its values are in the cells.
    runs = collections.defaultdict(dict)
    for c in cells:
        for r in c['runs']:
            runs[r['seed'], r['machine']][c['epoch']] = r['acc']
    assert [(r['seed'], r['machine'], r['acc']) for r in result['runs']] == [
        k + (v,) for k, v in sorted(runs.items())]
    assert result['values'] == sum(len(c['runs']) for c in cells)
    # The GPU runs that reached epoch 4, each once: fewer than the runs of epoch 1.
    assert result['gpu_runs'] == len(whole) == len(GPU_RUNS['later', devices, 4])
    assert all(len(r) == 4 for r in whole)
    assert sorted(r[3] for r in whole) == sorted(GPU_RUNS['later', devices, 4])

    def place(epoch, value):
        column = [round(r[epoch - 1] * 1000) for r in whole]
        t = round(value * 1000)
        return Fraction(2 * sum(g < t for g in column) + sum(g == t for g in column),
                        2 * len(column))
    ours = [place(e, v) for acc in runs.values() for e, v in acc.items()]
    assert result['place'] == sum(ours) / len(ours)
    groups = [[sum(2 * len(whole) * place(e, g[e - 1]) for e in acc) for g in whole]
              for _, acc in sorted(runs.items())]
    assert result['odds'] == _odds_by_counting(
        [[int(x) for x in g] for g in groups], int(sum(ours) * 2 * len(whole)))
    # Counted by seed: a seed's places averaged per epoch over its runs (twice: each seed has at
    # most two runs here), against one GPU run each.
    seeds = collections.defaultdict(lambda: collections.defaultdict(list))
    for (seed, _), acc in runs.items():
        for e, v in acc.items():
            seeds[seed][e].append(place(e, v))
    assert max(len(p) for acc in seeds.values() for p in acc.values()) <= 2
    unit = 4 * len(whole)
    assert result['seed_odds'] == _odds_by_counting(
        [[int(sum(unit * place(e, g[e - 1]) for e in acc)) for g in whole]
         for acc in seeds.values()],
        int(sum(unit * sum(p) / len(p) for acc in seeds.values() for p in acc.values())))
    # GPU runs drawn so average 0.5: the places of each epoch's column average a half.
    assert sum(place(e, g[e - 1]) for g in whole for e in (1, 2, 3, 4)) == 2 * len(whole)


def test_the_page_and_the_notebooks_give_the_pooled_answer_of_the_records():
    results = [book_dips.pooled(book_dips.dip_cells(RECORDS, book_dips.read_other_runs(),
                                                    GPU_RUNS, d), WHOLE_RUNS['later', d])
               for d in (1, 2)]
    with open(book_table.PAGE, encoding='utf-8') as f:
        block = book_table.read_blocks(f.read())['pooled'].split('\n')
    assert block[0] == '| %s |' % ' | '.join(book_dips.POOLED_TITLES)
    rows = [[c.strip() for c in line.strip('|').split(' | ')] for line in block[2:4]]
    assert rows == [[
        '%d device%s' % (r['devices'], 's' * (r['devices'] > 1)),
        ', '.join('s%d %s %s %.2f' % (u['seed'], u['machine'], '%d-%d' % (min(u['acc']), max(
            u['acc'])) if len(u['acc']) > 1 else str(min(u['acc'])), u['place'])
            for u in r['runs']),
        str(len(r['runs'])), str(r['values']), '%.3f' % r['place'], '105',
        book_dips.percent(r['odds']), book_dips.percent(r['seed_odds']),
        'sits low' if max(r['odds'], r['seed_odds']) < Fraction(1, 100) else 'not below 1%']
        for r in results]
    assert block[4:] == ['', book_dips.pooled_text(results)]
    # One sentence per setting, the odds' verdict and the same odds as the table.
    for r, sentence in zip(results, block[5].split('. Our ')):
        assert book_dips.percent(r['odds']) in sentence
        assert '(%s counted by seed)' % book_dips.percent(r['seed_odds']) in sentence
        assert ('sit low beyond chance' in sentence) == (
            max(r['odds'], r['seed_odds']) >= Fraction(1, 100))
