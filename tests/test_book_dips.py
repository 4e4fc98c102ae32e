"""The answer to the dip question (benchmarks/book_dips.py): every 2-device run of ours beside
the later editions' GPU runs, with exact odds, on the page and in both notebooks."""
import json
import os
import sys
from fractions import Fraction

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, 'benchmarks'))
import book_dips  # noqa: E402
import book_records  # noqa: E402
import book_table  # noqa: E402
import gpu_run_odds  # noqa: E402

# A test of a script in benchmarks/ (the project measuring itself): make bench-test.
pytestmark = pytest.mark.bench

GPU_RUNS = book_records.read_gpu_runs()
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


def test_every_run_of_a_cell_is_the_records_and_the_other_runs():
    cells = book_dips.dip_cells(RECORDS, book_dips.read_other_runs(), GPU_RUNS)
    recorded = book_records.table_records(RECORDS, 2)
    others = [r for r in book_dips.read_other_runs() if r['devices'] == 2]
    keys = book_records.machine_keys(book_records.book_cell_records(RECORDS))
    for cell in cells:
        mine = recorded.get(cell['epoch'], [])
        assert cell['seeds'] == len(mine)
        assert sorted((r['seed'], r['acc'], r['machine']) for r in cell['runs']) == sorted(
            [(r['seed'], r['test_acc'], keys[book_records.machine_of(r)]) for r in mine] +
            [(r['seed'], r['test_acc'], 'B') for r in others if r['epoch'] == cell['epoch']])
        values = [r['acc'] for r in cell['runs']]
        assert cell['mean'] == pytest.approx(sum(values) / len(values))
        p10 = book_records.gpu_summary(GPU_RUNS['later', 2, cell['epoch']])['p10']
        assert cell['below'] == sum(v < p10 for v in values)
    # The Xeon's epochs 1-3 of seeds 0-2 are machine B of the legend, whose epoch 4 is recorded.
    assert sorted((r['seed'], r['epoch']) for r in others) == [(s, e) for s in (0, 1, 2)
                                                               for e in (1, 2, 3)]
    assert cells[0]['runs'][-1] == {'seed': 2, 'acc': 0.5872, 'machine': 'B', 'recorded': False}


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
    assert err == ('benchmarks/book_table.py: error: %s, line 1: test_acc is "0.9", not a '
                   'number from 0 to 1; fix the line or restore the file: git checkout %s\n'
                   % (other, os.path.relpath(str(other), ROOT)))
    assert page.read_bytes() == open(os.path.join(ROOT, 'docs', 'book-comparison.md'),
                                     'rb').read()


def test_the_page_gives_each_cell_and_the_answer_of_the_records():
    cells = book_dips.dip_cells(RECORDS, book_dips.read_other_runs(), GPU_RUNS)
    with open(book_table.PAGE, encoding='utf-8') as f:
        block = book_table.read_blocks(f.read())['dips'].split('\n')
    assert block[0] == '| %s |' % ' | '.join(book_dips.DIP_TITLES)
    rows = [line.strip('|').split(' | ') for line in block[2:6]]
    assert [[c.strip() for c in row] for row in rows] == [
        [str(c['epoch']), ', '.join('s%d %.3f %s' % (r['seed'], r['acc'], r['machine'])
                                    for r in c['runs']),
         '%d (%d)' % (len(c['runs']), c['seeds']), '%.3f' % c['mean'],
         '%d, %.3f (%.3f)' % (len(GPU_RUNS['later', 2, c['epoch']]), c['gpu']['median'],
                              c['gpu']['p10']),
         book_dips.percent(c['p_mean']), '%d (%.1f)' % (c['below'], c['expected']),
         book_dips.percent(c['p_below']), book_dips._verdict(c, cells, 'en')] for c in cells]
    assert block[6:] == ['', book_dips.dip_answer(cells)]


@pytest.mark.parametrize('lang', sorted(book_table.NOTEBOOKS))
def test_both_notebooks_give_the_answer_of_the_records(lang):
    cells = book_dips.dip_cells(RECORDS, book_dips.read_other_runs(), GPU_RUNS)
    nb = json.load(open(book_table.NOTEBOOKS[lang], encoding='utf-8'))
    [cell] = [c for c in nb['cells'] if 'book-table' in c['metadata'].get('tags', [])]
    text = ''.join(cell['source'])
    assert text.split('<!-- begin dips -->\n')[1].split('<!-- end dips -->')[0] == ''.join(
        line + '\n' for line in book_dips.dip_list(cells, lang) + [
            '', book_dips.dip_answer(cells, lang)])


def test_fill_notebook_dips_needs_its_markers():
    assert book_table.fill_notebook_dips('a\n<!-- begin dips -->\nold\n<!-- end dips -->\n',
                                         ['- one', '', 'two']) == (
        'a\n<!-- begin dips -->\n- one\n\ntwo\n<!-- end dips -->\n')
    with pytest.raises(ValueError, match='holds no "<!-- begin dips -->" ... "<!-- end dips '
                                         '-->" lines, so the answer to the dip question would '
                                         'not be written'):
        book_table.fill_notebook_dips('a\n', ['- one'])
