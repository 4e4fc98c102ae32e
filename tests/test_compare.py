import os
import re
import subprocess
import sys

import mxnet as mx
import pytest
from mxnet import nd

from gluon_mgpu.commands import booktable, compare

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
    assert len(rows) == 11
    assert {r['ours'] for r in rows} == {'not run'}
    assert {r['status'] for r in rows} == {'not run'}
    assert [r['book'] for r in _by(rows, 'In [7]')] == ['0.86', '0.91', '0.91', '0.93', '61.6']
    assert [r['book'] for r in _by(rows, 'In [8]')] == ['0.77', '0.86', '0.88', '0.89', '31.6']
    [speedup] = _by(rows, 'In [7]/[8]')
    assert speedup['book'] == '1.95x (PyTorch ed. 1.53x)'
    assert speedup['verdict'].startswith('not run (compare --full); cpu(0), cpu(1) are '
                                         'simulated devices: they share the same CPU cores')
    assert speedup['verdict'].endswith('so no speed-up is expected')
    [on_gpus] = _by(compare.training_rows([mx.gpu(0), mx.gpu(1)], []), 'In [7]/[8]')
    assert on_gpus['verdict'] == 'not run (compare --full)'


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


def test_prediction_interval_is_students_for_one_more_draw():
    low, high = compare.prediction_interval([0.5, 0.6, 0.7])
    # mean 0.6, s 0.1, t(2) 4.303, sqrt(1 + 1/3): half-width 0.49687
    assert (low, high) == pytest.approx((0.6 - 0.496867, 0.6 + 0.496867), abs=1e-6)
    assert compare.prediction_interval([0.8, 0.8, 0.8, 0.8]) == pytest.approx((0.8, 0.8))
    with pytest.raises(ValueError, match='at least 2 values, got 1'):
        compare.prediction_interval([0.5])


def test_training_rows_judge_the_book_against_our_spread():
    records = [_record(2, s, 1, acc) for s, acc in enumerate((0.28, 0.43, 0.57))]
    records += [_record(2, s, 2, acc) for s, acc in enumerate((0.85, 0.86, 0.87))]
    records += [_record(2, 0, 3, 0.80), _record(2, 1, 3, 0.81)]
    records += [_record(1, 0, 1, 0.80, seconds=200.0)]
    # Other settings never enter the book's rows.
    records += [_record(2, 5, 1, 0.99, warmup=50), _record(2, 6, 1, 0.01, limits=(256, 128))]
    rows = compare.training_rows([mx.cpu(0), mx.cpu(1)], records)
    two = _by(rows, 'In [8]')
    # Epoch 1: 0.77 lies inside 0.427 +- 4.303 * 0.145 * 1.155 (a wide spread, 3 seeds).
    assert two[0]['ours'] == 'mean 0.43 (0.28-0.57, 3 seeds)'
    assert (two[0]['diff'], two[0]['status']) == ('-0.34', 'match')
    assert two[0]['verdict'] == ('within our 95% prediction interval 0.00 to 1.00, every '
                                 'accuracy: the seeds spread too widely to tell')
    # Epoch 2: 0.86 +- 4.303 * 0.01 * 1.155.
    assert two[1]['status'] == 'match'
    assert two[1]['verdict'] == 'within our 95% prediction interval 0.81 to 0.91'
    assert (two[2]['ours'], two[2]['status']) == ('mean 0.81 (0.80-0.81, 2 seeds)', 'not judged')
    assert two[2]['verdict'] == 'not judged: 2 seeds so far, 3 needed'
    assert (two[3]['ours'], two[3]['status']) == ('not run', 'not run')
    assert two[4]['ours'] == '100.0 on cpu(0), cpu(1) (8 epochs)'
    [speedup] = _by(rows, 'In [7]/[8]')
    assert speedup['ours'] == '2.00x (200.0 / 100.0 s)'
    assert speedup['status'] == 'not comparable'


def test_training_rows_say_when_the_book_lies_outside():
    records = [_record(1, s, 1, acc) for s, acc in enumerate((0.70, 0.71, 0.72))]
    [row] = _by(compare.training_rows([mx.cpu(0), mx.cpu(1)], records), 'In [7]')[:1]
    assert row['status'] == 'mismatch'
    assert row['verdict'] == 'OUTSIDE our 95% prediction interval 0.66 to 0.76'
    assert row['diff'] == '-0.15'


def test_diagnosis_rows_and_the_explanation_in_numbers():
    records = [_record(2, s, 1, acc, precise=acc + 0.3, batch=acc + 0.31)
               for s, acc in enumerate((0.40, 0.50))]
    records += [_record(2, 0, 1, 0.60, warmup=50, precise=0.70, batch=0.72)]
    rows = compare.diagnosis_rows(records, warmup_steps=[50])
    assert [(r['setting'], r['epoch'], r['seeds']) for r in rows] == [
        ('2 devices', 1, [0, 1]), ('2 devices, warmup 50 steps', 1, [0])]
    assert rows[0]['running0'] == {'n': 2, 'mean': pytest.approx(0.45), 'low': 0.40,
                                   'high': 0.50}
    assert rows[0]['running_other']['mean'] == pytest.approx(0.46)
    assert rows[0]['precise']['mean'] == pytest.approx(0.75)
    table = compare.format_diagnosis(rows)
    assert table[1] == ['2 devices', '1', '0 1', '0.77', '0.450 (0.400-0.500)',
                        '0.460 (0.410-0.510)', '0.750 (0.700-0.800)', '0.760 (0.710-0.810)',
                        '0.500 (0.500-0.500)']
    said = compare.explain(rows)
    assert said[0] == ('2 devices, epoch 1 (2 seeds): the book printed 0.77, ours gives 0.450 '
                       'with the running statistics (the book\'s measure), 0.750 with them '
                       're-estimated for the final weights and 0.760 with batch statistics; '
                       're-estimating recovers 0.300 of the 0.320 gap (94%).')
    assert said[1].startswith('2 devices, warmup 50 steps, epoch 1 (1 seed): the book printed '
                              '0.77, ours gives 0.600')
    # The warmup run beside the same seed without: 0.60 - 0.40, 0.70 - 0.70, 0.5 - 0.5.
    assert said[2:] == ['2 devices, warmup 50 steps, epoch 1, against the same 1 seed without '
                        'warmup: device 0 running stats (book\'s) +0.200, precise BatchNorm '
                        '+0.000, train_acc (epoch mean) +0.000.']
    # Re-estimating can overshoot the book's value (1 device, epoch 1: 0.837 -> 0.863 vs 0.86).
    over = compare.diagnosis_rows([_record(1, 0, 1, 0.84, precise=0.87, batch=0.87)], [])
    assert compare.explain(over)[0].endswith(
        '; re-estimating gains 0.030, more than the 0.020 gap: with them the mean is 0.010 '
        'above the book\'s value.')


def test_explain_judges_the_book_against_precise_batchnorm_too():
    # Epoch 1: precise 0.60, 0.70, 0.80 (0.70 +- 0.497) holds 0.77; epoch 2: 0.79, 0.80, 0.81
    # (0.80 +- 0.0497) does not hold 0.86; epoch 3 has 2 seeds and is not judged.
    records = [_record(2, s, 1, 0.5, precise=p) for s, p in enumerate((0.60, 0.70, 0.80))]
    records += [_record(2, s, 2, 0.5, precise=p) for s, p in enumerate((0.79, 0.80, 0.81))]
    records += [_record(2, s, 3, 0.5, precise=0.9) for s in (0, 1)]
    said = compare.explain(compare.diagnosis_rows(records))
    assert said[1:] == ['2 devices, with precise BatchNorm: the book\'s value lies inside the '
                        '95% prediction interval of our seeds in epoch 1, outside it in epoch 2 '
                        '(0.86 against 0.750 to 0.850).']
    # Epoch 4: 0.90, 0.91, 0.92 (0.91 +- 0.0497) holds 0.89.
    records += [_record(2, s, 4, 0.5, precise=0.9 + s / 100) for s in (0, 1, 2)]
    assert compare.explain(compare.diagnosis_rows(records))[1].startswith(
        '2 devices, with precise BatchNorm: the book\'s value lies inside the 95% prediction '
        'interval of our seeds in epochs 1 and 4, outside')


def _run(*args):
    return subprocess.run([sys.executable, '-m', 'gluon_mgpu.compare', *args],
                          capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join(
                              p for p in (ROOT, os.environ.get('PYTHONPATH')) if p)))


def test_cli_prints_the_table_and_writes_the_page(tmp_path):
    out = tmp_path / 'comparison.md'
    result = _run('--output', str(out), '--record', str(tmp_path / 'none.jsonl'))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == ('devices: the book [gpu(0), gpu(1)]; ours [cpu(0), cpu(1)], simulated '
                        'on the CPU (no GPU used)')
    assert lines[1].split() == ['cell', 'what', "book's", 'value', 'ours', 'difference',
                                'verdict']
    out5 = [l for l in lines if l.startswith('Out[5]')]
    assert len(out5) == 3 and all(l.endswith('match (every printed digit)') or
                                  l.endswith('match') for l in out5)
    assert sum(l.endswith('not run (compare --full)') for l in lines) == 10
    [step] = [l for l in lines if 'the step, 4 steps of 64 on 2 devices' in l]
    assert step.endswith('match (bit for bit)')
    assert 'max abs 0.0e+00 (losses, 76 + 34 arrays per device)' in step
    assert lines[-1] == 'wrote %s' % out
    page = out.read_text()
    assert '| Out[5] | first conv weight, device 0 | 1x3x3: -0.01473444 ... -0.00601594 |' in page
    assert compare.BOOK['out5'] in page


def test_committed_page_agrees_with_a_run_now(cells):
    records = booktable.read_records(booktable.DEFAULT_RECORD)
    rows = compare.deterministic_rows(cells) + compare.training_rows([mx.cpu(0), mx.cpu(1)],
                                                                     records)
    page = open(DOC).read()
    assert 'python -m gluon_mgpu.compare --output docs/book-comparison.md' in page
    for row in rows:
        # Out[4]'s last digits depend on the machine's arithmetic: only the book's side is fixed.
        keys = ('cell', 'what', 'book') if row['cell'] == 'Out[4]' else (
            'cell', 'what', 'book', 'ours')
        line = '| %s |' % ' | '.join(row[k] for k in keys)
        assert line in page, line
    # The bfloat16 section: each row as the two records give it now, none before a first line.
    bf16 = booktable.read_records(booktable.DEFAULT_BF16_RECORD)
    dtypes = compare.dtype_rows(records, bf16)
    assert ('## bfloat16 beside float32' in page) == bool(bf16)
    for texts in dtypes if bf16 else []:
        line = '| %s |' % ' | '.join(texts)
        assert line in page, line


@pytest.mark.parametrize('args,expected', [
    (['--device', 'tpu'], r"python -m gluon_mgpu.compare: error: argument --device: invalid "
                          r"choice: 'tpu' \(choose from '?auto'?, '?gpu'?, '?cpu'?\) \(see --help\)"),
    (['--output', '/no/such/folder/x.md'], r'python -m gluon_mgpu.compare: error: --output '
                                           r'/no/such/folder/x.md: folder /no/such/folder does '
                                           r'not exist; create it or pass another path'),
    (['--record', '/'], r'python -m gluon_mgpu.compare: error: --record /: it is a folder; '
                        r'name a file in it'),
    (['--record', os.path.join(ROOT, 'README.md')],
     r'python -m gluon_mgpu.compare: error: .*README.md, line 1: not JSON \(.*\); fix or '
     r'delete that line'),
    (['--full', '--work-dir', '/proc/version/x'], r'python -m gluon_mgpu.compare: error: '
                                                  r'--work-dir /proc/version/x: Not a directory; '
                                                  r'pass a folder you can write to'),
    (['--seeds', 'x'], r"python -m gluon_mgpu.compare: error: argument --seeds: --seed expects a "
                       r"whole number, got 'x'; for example --seed 0 \(see --help\)"),
])
def test_cli_bad_input_is_one_line_and_exit_2(args, expected):
    result = _run(*args)
    assert result.returncode == 2
    assert result.stdout == ''
    assert len(result.stderr.splitlines()) == 1
    assert re.fullmatch(expected, result.stderr.strip()), result.stderr


def test_the_bfloat16_rows_judge_each_seed_against_float32s_spread():
    def line(devices, seed, acc, dtype=None):
        # precise BatchNorm 0.1 above the running statistics, train_acc 0.2 above
        r = {'devices': devices, 'seed': seed, 'warmup_steps': 0, 'epoch': 1,
             'acc_running': [acc] * devices, 'acc_precise_bn': acc + 0.1, 'train_acc': acc + 0.2}
        return dict(r, dtype=dtype) if dtype else r
    book = [line(2, 0, 0.49), line(2, 1, 0.57), line(2, 2, 0.53), line(1, 0, 0.76)]
    bf16 = [line(2, 0, 0.51, 'bfloat16'), line(2, 1, 0.91, 'bfloat16'),
            line(1, 0, 0.6, 'bfloat16')]
    rows = compare.dtype_rows(book, bf16)
    assert rows[0][2:4] == ['measure', 'float32']
    assert rows[1] == ['2 devices', '1', "device 0 running stats (book's)",
                       'mean 0.53 (0.49-0.57, 3 seeds)', 'mean 0.71 (0.51-0.91, 2 seeds)',
                       '+0.180 (2 seeds)',
                       # 0.53 +- t(2) 4.303 * s 0.04 * sqrt(1 + 1/3): 0.33 to 0.73
                       "1 of 2 inside float32's 95% prediction interval 0.33 to 0.73"]
    assert rows[2] == ['2 devices', '1', 'precise BatchNorm', 'mean 0.63 (0.59-0.67, 3 seeds)',
                       'mean 0.81 (0.61-1.01, 2 seeds)', '+0.180 (2 seeds)',
                       "1 of 2 inside float32's 95% prediction interval 0.43 to 0.83"]
    assert rows[3][2:4] == ['train_acc (epoch mean)', 'mean 0.73 (0.69-0.77, 3 seeds)']
    assert rows[4:] == [
        ['1 device', '1', name, 'mean %.2f (%.2f-%.2f, 1 seed)' % (v, v, v),
         'mean %.2f (%.2f-%.2f, 1 seed)' % (v - 0.16, v - 0.16, v - 0.16), '-0.160 (1 seed)',
         'not judged: float32 has 1 seed so far']
        for name, v in (("device 0 running stats (book's)", 0.76), ('precise BatchNorm', 0.86),
                        ('train_acc (epoch mean)', 0.96))]
    assert compare.dtype_rows(book, []) == rows[:1]


@pytest.mark.parametrize('argv,message', [
    (['--dtype', 'bfloat16'], '--dtype bfloat16 chooses what --full trains'),
    (['--full', '--dtype', 'bfloat16', '--output', 'x.md'],
     '--dtype bfloat16 trains and prints the bfloat16 table only; leave out --output, '),
    (['--record', 'r.jsonl', '--bf16-record', './r.jsonl'],
     '--record and --bf16-record are the same file, r.jsonl; give the bfloat16 runs a record '
     'of their own'),
])
def test_bfloat16_is_only_for_full_runs(argv, message, capsys):
    assert compare.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith('python -m gluon_mgpu.compare: error: ' + message), err
    assert len(err.splitlines()) == 1


@pytest.mark.parametrize('flags,line', [
    ({'avx512f', 'avx512bw', 'avx512vl', 'avx512dq'},
     'this CPU has neither avx512_bf16 nor amx_bf16 in /proc/cpuinfo, so oneDNN would emulate '
     'bfloat16, slower than float32; leave out --dtype bfloat16'),
    ({'avx2'},
     'this CPU has neither avx512_bf16 nor amx_bf16 nor AVX-512 (avx512f, avx512bw, avx512vl, '
     "avx512dq) in /proc/cpuinfo, and MXNet's oneDNN has no bfloat16 convolution for it: "
     'training would stop at its first step; leave out --dtype bfloat16'),
])
def test_full_bfloat16_on_a_cpu_without_it_is_one_line_before_any_run(
        flags, line, tmp_path, monkeypatch, capsys, data_dir):
    from gluon_mgpu.runtime import precision
    monkeypatch.setattr(precision, 'cpu_flags', lambda: flags)
    work = tmp_path / 'work'
    assert compare.main(['--full', '--dtype', 'bfloat16', '--data-dir', data_dir,
                         '--bf16-record', str(tmp_path / 'b.jsonl'),
                         '--work-dir', str(work)]) == 2
    assert capsys.readouterr().err == (
        'python -m gluon_mgpu.compare: error: --dtype bfloat16: %s\n' % line)
    assert not (tmp_path / 'b.jsonl').exists() and os.listdir(work) == ['logs']
