import os
import re
import subprocess
import sys

import mxnet as mx
import pytest
from mxnet import nd

from gluon_mgpu import training
from gluon_mgpu.commands import compare

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, 'docs', 'book-comparison.md')


@pytest.fixture(scope='module')
def cells():
    return compare.chapter_cells([mx.cpu(0), mx.cpu(1)])


def _by(rows, cell):
    return [r for r in rows if r['cell'] == cell]


def test_book_data_parses_to_the_printed_shapes():
    assert [len(compare.printed_numbers(t)) for t in compare.BOOK['out4']] == [20, 20]
    assert compare.printed_numbers(compare.BOOK['out5'])[:3] == ['-0.01473444', '-0.01073093',
                                                                 '-0.01042483']
    assert len(compare.printed_numbers(compare.BOOK['out5'])) == 9


def test_fresh_process_reproduces_the_books_weights_digit_for_digit(cells):
    assert cells['devices'] == ['cpu(0)', 'cpu(1)']
    for weights in cells['weights']:
        assert compare.format_like_book(weights) == compare.BOOK['out5']


def test_deterministic_rows_match_the_book(cells):
    rows = compare.deterministic_rows(cells)
    assert [r['status'] for r in _by(rows, 'Out[4]')] == ['match', 'match']
    assert [r['status'] for r in _by(rows, 'Out[5]')] == ['match', 'match', 'match']
    assert [r['diff'] for r in _by(rows, 'Out[5]')][:2] == ['9/9 printed equal'] * 2
    for row in _by(rows, 'Out[4]'):
        assert float(re.fullmatch(r'max rel (\S+)', row['diff']).group(1)) <= compare.OUT4_RTOL
    # cpu(0) is one of the simulated devices, so reading without a device does not fail there.
    [read] = _by(rows, 'In [5]')
    assert (read['book'], read['ours'], read['status']) == (
        'not initialized on cpu(0)', 'no error: cpu(0) holds a replica', 'explained')


def test_rows_catch_a_consumed_random_state():
    # Guards the test above: one random number drawn first and the book's values are gone.
    nd.random.uniform(shape=(1,)).wait_to_read()
    rows = compare.deterministic_rows(
        compare.chapter_cells([mx.cpu(0), mx.cpu(1)], fresh_process=False))
    assert [r['status'] for r in _by(rows, 'Out[4]')] == ['mismatch', 'mismatch']
    assert [r['status'] for r in _by(rows, 'Out[5]')] == ['mismatch', 'mismatch', 'match']


def test_reading_outside_the_devices_prints_the_books_line():
    # With devices that leave cpu(0) free, the book's try/except prints its line.
    rows = compare.deterministic_rows(compare.chapter_cells([mx.cpu(1), mx.cpu(2)]))
    [read] = _by(rows, 'In [5]')
    assert (read['ours'], read['status']) == ('not initialized on cpu(0)', 'match')
    assert [r['status'] for r in _by(rows, 'Out[5]')] == ['match'] * 3


def test_training_rows_say_not_run_without_records():
    rows = compare.training_rows([mx.cpu(0), mx.cpu(1)], [])
    assert len(rows) == 3
    assert {r['ours'] for r in rows} == {'not run'}
    assert {r['status'] for r in rows} == {'not run'}
    assert [r['book'] for r in _by(rows, 'In [7]')] == ['61.6']
    assert [r['book'] for r in _by(rows, 'In [8]')] == ['31.6']
    [speedup] = _by(rows, 'In [7]/[8]')
    assert speedup['book'] == '1.95x (PyTorch ed. 1.53x)'
    assert speedup['verdict'].startswith('not run (benchmarks/book_table.py); cpu(0), cpu(1) are '
                                         'simulated devices: they share the same CPU cores')
    assert speedup['verdict'].endswith('so no speed-up is expected')
    [on_gpus] = _by(compare.training_rows([mx.gpu(0), mx.gpu(1)], []), 'In [7]/[8]')
    assert on_gpus['verdict'] == 'not run (benchmarks/book_table.py)'


def _record(devices, seed, epoch, acc, seconds=100.0, warmup=0, precise=None, batch=None,
            limits=(None, None)):
    return {'devices': devices, 'seed': seed, 'warmup_steps': warmup, 'epoch': epoch,
            'batch_size': 256 * devices, 'lr': 0.1 * devices, 'seconds': seconds,
            'train_loss': 1.0, 'train_acc': 0.5, 'test_acc': acc,
            'acc_running': [acc] + [acc + 0.01] * (devices - 1),
            'acc_precise_bn': acc + 0.2 if precise is None else precise,
            'acc_batch_stats': acc + 0.25 if batch is None else batch,
            'train_limit': limits[0], 'test_limit': limits[1],
            'device_names': ['cpu(%d)' % i for i in range(devices)]}


def test_the_gpu_runs_are_the_shared_files():
    """docs/book-gpu-runs.csv is the copy its page names, and gives that page's medians."""
    import hashlib
    with open(compare.GPU_RUNS, 'rb') as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    with open(os.path.join(ROOT, 'docs', 'book-gpu-runs.md')) as f:
        assert 'sha256 `%s`' % digest in f.read()
    runs = compare.read_gpu_runs()
    same = [compare.gpu_summary(runs['same', 1, e]) for e in (1, 2, 3, 4)]
    # docs/book-gpu-runs.md: same code, 1 GPU, 0.880 (0.868-0.882) ... 0.920 (0.910-0.930).
    assert [s['n'] for s in same] == [9] * 4
    assert [(s['median'], round(s['p10'], 3), round(s['p90'], 3)) for s in same] == [
        (0.88, 0.868, 0.882), (0.91, 0.908, 0.912), (0.92, 0.896, 0.922), (0.92, 0.91, 0.93)]
    later = compare.gpu_summary(runs['later', 2, 1])
    assert (later['n'], later['median'], round(later['p10'], 3), round(later['p90'], 3)) == (
        107, 0.778, 0.702, 0.817)
    assert (later["low"], later["high"]) == (0.587, 0.838)  # read off plots: three digits


def test_gpu_runs_refuse_a_value_that_is_not_an_accuracy(tmp_path):
    path = tmp_path / 'runs.csv'
    path.write_text('edition,gpus,acc_e1\n"d2l-zh 1.x (d2lzh, MXNet nd)",1,1.5\n')
    with pytest.raises(ValueError, match=r'runs.csv, line 2: acc_e1 is \'1.5\' with gpus \'1\', '
                                         r'not an accuracy from 0 to 1 on 1 or 2 GPUs'):
        compare.read_gpu_runs(str(path))


def test_accuracy_cells_judge_our_mean_against_the_same_code_range():
    runs = compare.read_gpu_runs()
    records = [_record(1, s, 1, acc, precise=0.9) for s, acc in enumerate((0.85, 0.86, 0.87))]
    records += [_record(1, s, 2, acc) for s, acc in enumerate((0.80, 0.81, 0.82))]
    records += [_record(1, s, 4, acc) for s, acc in enumerate((0.91, 0.915, 0.92))]
    records += [_record(2, s, 4, acc) for s, acc in enumerate((0.86, 0.88, 0.92))]
    records += [_record(2, 0, 1, 0.79)]
    # Other settings never enter the book's cells.
    records += [_record(1, 5, 3, 0.99, warmup=50), _record(1, 6, 3, 0.01, limits=(256, 128))]
    cells = {(c['devices'], c['epoch']): c for c in compare.accuracy_cells(records, runs)}
    one = cells[1, 1]
    assert one['ours'] == {'n': 3, 'mean': pytest.approx(0.86), 'low': 0.85, 'high': 0.87}
    assert (one['verdict'], one['status']) == (
        "inside the same-code GPU runs' range (0.86-0.89)", 'match')
    assert (cells[1, 2]['verdict'], cells[1, 2]['status']) == (
        "BELOW the same-code GPU runs' range (0.90-0.92)", 'mismatch')
    assert (cells[1, 3]['verdict'], cells[1, 3]['status']) == (
        'not run (benchmarks/book_table.py)', 'not run')
    # Epoch 4: 0.915 is within 0.01 of the median 0.920; 0.8867 (printed 0.89) is not of 0.900.
    assert cells[1, 4]['verdict'] == ("inside the same-code GPU runs' range (0.91-0.93); within "
                                      '0.01 of their median 0.920')
    assert cells[2, 4]['verdict'] == ("inside the same-code GPU runs' range (0.88-0.92); NOT "
                                      'within 0.01 of their median 0.900')
    assert cells[2, 4]['status'] == 'mismatch'
    assert (cells[2, 1]['verdict'], cells[2, 1]['status']) == (
        'not judged: 1 seed so far, 3 needed', 'not judged')
    lines = compare.format_accuracy_cells(compare.accuracy_cells(records, runs))
    assert lines[0] == compare.ACCURACY_TITLES
    assert lines[1] == ['1 device', '1', '0.86', '0.88 (0.86-0.89)', '0.880 (0.864-0.892)',
                        '0.86 (0.85-0.87)', '3', '0.900 (0.900-0.900)',
                        "inside the same-code GPU runs' range (0.86-0.89)"]
    table = compare.notebook_table(compare.accuracy_cells(records, runs))
    assert table[0] == ['0.86', '0.91', '0.91', '0.93']
    assert table[3] == ['0.86 (0.85-0.87)', '0.81 (0.80-0.82)', '-', '0.92 (0.91-0.92)']
    assert table[4] == ['inside', 'BELOW', '-', 'inside']
    assert table[9] == ['-', '-', '-', 'inside']


def _run(*args):
    return subprocess.run([sys.executable, '-m', 'gluon_mgpu.compare', *args],
                          capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join(
                              p for p in (ROOT, os.environ.get('PYTHONPATH')) if p)))


def test_cli_prints_the_table(tmp_path):
    result = _run('--record', str(tmp_path / 'none.jsonl'))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == ('devices: the book [gpu(0), gpu(1)]; ours [cpu(0), cpu(1)], simulated '
                        'on the CPU (no GPU used)')
    assert lines[1].split() == ['cell', 'what', "book's", 'value', 'ours', 'difference',
                                'verdict']
    out5 = [l for l in lines if l.startswith('Out[5]')]
    assert len(out5) == 3 and all(l.endswith('match (every printed digit)') or
                                  l.endswith('match') for l in out5)
    # 3 rows of seconds and 8 accuracy cells.
    assert sum('not run (benchmarks/book_table.py)' in l for l in lines) == 11
    [step] = [l for l in lines if "the book's train, 2 epochs of 5 batches (64, ..., 16) on 2 "
              'devices' in l]
    assert step.endswith('match (bit for bit)')
    assert 'max abs 0.0e+00 (losses, 76 + 34 arrays per device)' in step
    assert lines[-1].startswith('note: PyTorch ed.: the newer edition prints 14.1 and 9.2 s')


def test_committed_page_agrees_with_a_run_now(cells):
    sys.path.insert(0, os.path.join(ROOT, 'benchmarks'))
    import book_table
    records = compare.read_records(compare.DEFAULT_RECORD)
    old = compare.read_records(compare.OLD_STEP_RECORD, step=training.OLD_STEP)
    bf16 = compare.read_records(book_table.DEFAULT_BF16_RECORD)
    rows = compare.deterministic_rows(cells)
    with open(DOC) as f:
        blocks = book_table.read_blocks(f.read())
    assert blocks['generated'].startswith('Generated by `benchmarks/book_table.py --page` on ')
    for row in rows:
        # Out[4]'s last digits depend on the machine's arithmetic: only the book's side is fixed.
        keys = ('cell', 'what', 'book') if row['cell'] == 'Out[4]' else (
            'cell', 'what', 'book', 'ours')
        line = '| %s |' % ' | '.join(row[k] for k in keys)
        assert line in blocks['rows'], line
    # The tables of the records alone: exactly the committed ones.
    now = book_table.record_blocks(book_table.record_report(records, old, bf16,
                                                            [mx.cpu(0), mx.cpu(1)]))
    assert sorted(now) == ['accuracy', 'bf16', 'diagnosis', 'old-step', 'seconds']
    for name, text in now.items():
        assert blocks[name] == text, name


@pytest.mark.parametrize('args,expected', [
    (['--device', 'tpu'], r"python -m gluon_mgpu.compare: error: argument --device: invalid "
                          r"choice: 'tpu' \(choose from '?auto'?, '?gpu'?, '?cpu'?\) "
                          r"\(see --help\)"),
    (['--record', '/'], r'python -m gluon_mgpu.compare: error: / is a folder, not a regular '
                        r'file; pass --record with a regular file'),
    (['--record', os.path.join(ROOT, 'README.md')],
     r'python -m gluon_mgpu.compare: error: .*README.md, line 1: not JSON \(.*\); fix or '
     r'delete that line'),
    (['--full'], r'python -m gluon_mgpu.compare: error: unrecognized arguments: --full \(see '
                 r'--help\)'),
])
def test_cli_bad_input_is_one_line_and_exit_2(args, expected):
    result = _run(*args)
    assert result.returncode == 2
    assert result.stdout == ''
    assert len(result.stderr.splitlines()) == 1
    assert re.fullmatch(expected, result.stderr.strip()), result.stderr
