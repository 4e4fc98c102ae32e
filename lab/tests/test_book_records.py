"""The research record's reader and the tables made of it (lab/book_records.py): the
rows of seconds per epoch and the speed-up, the published GPU runs and the accuracy table judged
against them. The records' lines and the runner are tests/test_book_table.py's."""
import json
import os
import sys

import mxnet as mx
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, 'lab'))
import book_records  # noqa: E402



def _by(rows, cell):
    return [r for r in rows if r['cell'] == cell]


def test_training_rows_say_not_run_without_records():
    rows = book_records.training_rows([mx.cpu(0), mx.cpu(1)], [])
    assert len(rows) == 3
    assert {r['ours'] for r in rows} == {'not run'}
    assert {r['status'] for r in rows} == {'not run'}
    assert [r['book'] for r in _by(rows, 'In [7]')] == ['61.6']
    assert [r['book'] for r in _by(rows, 'In [8]')] == ['31.6']
    [speedup] = _by(rows, 'In [7]/[8]')
    assert speedup['book'] == '1.95x (PyTorch ed. 1.53x)'
    assert speedup['verdict'].startswith('not run (lab/book_table.py); cpu(0), cpu(1) are '
                                         'simulated devices: they share the same CPU cores')
    assert speedup['verdict'].endswith('so no speed-up is expected')
    [on_gpus] = _by(book_records.training_rows([mx.gpu(0), mx.gpu(1)], []), 'In [7]/[8]')
    assert on_gpus['verdict'] == 'not run (lab/book_table.py)'


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
    """docs/records/book-gpu-runs.csv is the copy its page names; it gives that page's medians."""
    import hashlib
    with open(book_records.GPU_RUNS, 'rb') as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    with open(os.path.join(ROOT, 'docs', 'book-gpu-runs.md')) as f:
        assert 'sha256 `%s`' % digest in f.read()
    runs = book_records.read_gpu_runs()
    same = [book_records.gpu_summary(runs['same', 1, e]) for e in (1, 2, 3, 4)]
    # docs/book-gpu-runs.md: same code, 1 GPU, 0.880 (0.868-0.882) ... 0.920 (0.910-0.930).
    assert [s['n'] for s in same] == [9] * 4
    assert [(s['median'], round(s['p10'], 3), round(s['p90'], 3)) for s in same] == [
        (0.88, 0.868, 0.882), (0.91, 0.908, 0.912), (0.92, 0.896, 0.922), (0.92, 0.91, 0.93)]
    later = book_records.gpu_summary(runs['later', 2, 1])
    assert (later['n'], later['median'], round(later['p10'], 3), round(later['p90'], 3)) == (
        107, 0.778, 0.702, 0.817)
    assert (later["low"], later["high"]) == (0.587, 0.838)  # read off plots: three digits


def test_gpu_runs_refuse_a_value_that_is_not_an_accuracy(tmp_path):
    path = tmp_path / 'runs.csv'
    path.write_text('edition,gpus,acc_e1\n"d2l-zh 1.x (d2lzh, MXNet nd)",1,1.5\n')
    with pytest.raises(ValueError, match=r'runs.csv, line 2: acc_e1 is \'1.5\' with gpus \'1\', '
                                         r'not an accuracy from 0 to 1 on 1 or 2 GPUs'):
        book_records.read_gpu_runs(str(path))


def test_accuracy_cells_judge_our_mean_against_the_same_code_range():
    runs = book_records.read_gpu_runs()
    records = [_record(1, s, 1, acc, precise=0.9) for s, acc in enumerate((0.85, 0.86, 0.87))]
    records += [_record(1, s, 2, acc) for s, acc in enumerate((0.80, 0.81, 0.82))]
    records += [_record(1, s, 4, acc) for s, acc in enumerate((0.91, 0.915, 0.92))]
    records += [_record(2, s, 4, acc) for s, acc in enumerate((0.86, 0.88, 0.92))]
    records += [_record(2, 0, 1, 0.79)]
    # Other settings never enter the book's cells.
    records += [_record(1, 5, 3, 0.99, warmup=50), _record(1, 6, 3, 0.01, limits=(256, 128))]
    cells = {(c['devices'], c['epoch']): c for c in book_records.accuracy_cells(records, runs)}
    one = cells[1, 1]
    assert one['ours'] == {'n': 3, 'mean': pytest.approx(0.86), 'low': 0.85, 'high': 0.87}
    assert (one['verdict'], one['status']) == (
        "inside the same-code GPU runs' range (0.86-0.89)", 'match')
    assert (cells[1, 2]['verdict'], cells[1, 2]['status']) == (
        "BELOW the same-code GPU runs' range (0.90-0.92)", 'mismatch')
    assert (cells[1, 3]['verdict'], cells[1, 3]['status']) == (
        'not run (lab/book_table.py)', 'not run')
    # Epoch 4: 0.915 is within 0.01 of the median 0.920; 0.8867 (printed 0.89) is not of 0.900.
    assert cells[1, 4]['verdict'] == ("inside the same-code GPU runs' range (0.91-0.93); within "
                                      '0.01 of their median 0.920')
    assert cells[2, 4]['verdict'] == ("inside the same-code GPU runs' range (0.88-0.92); NOT "
                                      'within 0.01 of their median 0.900')
    assert cells[2, 4]['status'] == 'mismatch'
    assert (cells[2, 1]['verdict'], cells[2, 1]['status']) == (
        'not judged: 1 seed so far, 3 needed', 'not judged')
    lines = book_records.format_accuracy_cells(book_records.accuracy_cells(records, runs))
    assert lines[0] == book_records.ACCURACY_TITLES
    # None of these lines names its machine: one machine, A, of which nothing is recorded.
    assert lines[1] == ['1 device', '1', '0.86', '0.88 (0.86-0.89)', '0.880 (0.864-0.892)',
                        '0.86 (0.85-0.87)', '3', 's0 0.850 A, s1 0.860 A, s2 0.870 A',
                        '0.900 (0.900-0.900)', "inside the same-code GPU runs' range (0.86-0.89)"]
    assert lines[3][7] == '-'  # 1 device, epoch 3: not run
    table = book_records.notebook_table(book_records.accuracy_cells(records, runs))
    assert table[0] == ['0.86', '0.91', '0.91', '0.93']
    assert table[3] == ['0.86 (0.85-0.87)', '0.81 (0.80-0.82)', '-', '0.92 (0.91-0.92)']
    assert table[4] == ['s0 0.850 A, s1 0.860 A, s2 0.870 A', 's0 0.800 A, s1 0.810 A, s2 0.820 A',
                        '-', 's0 0.910 A, s1 0.915 A, s2 0.920 A']
    assert table[5] == ['inside', 'BELOW', '-', 'inside']
    assert table[10] == ['s0 0.790 A', '-', '-', 's0 0.860 A, s1 0.880 A, s2 0.920 A']
    assert table[11] == ['-', '-', '-', 'inside']


def _on(record, cpu, flags=None, cap=None, threads=None, day='2026-11-27'):
    """``record`` as made on a machine: what book_table.py writes of it (``flags`` None: a
    line of before 2026-11-27, which names the CPU only)."""
    record = dict(record, cpu=cpu, recorded=day + 'T10:00:00Z')
    if flags is not None:
        record.update(cpu_flags=flags, dnnl_max_cpu_isa=cap, threads=threads)
    return record


def test_each_value_names_its_machine_and_the_legend_says_what_each_line_recorded():
    runs = book_records.read_gpu_runs()
    epyc, xeon = 'AMD EPYC', 'Intel(R) Xeon(R) Processor'
    zen4 = ['avx2', 'avx512f', 'avx512_bf16']
    records = [_on(_record(2, s, 1, acc), epyc, day='2026-11-26')
               for s, acc in ((0, 0.8), (1, 0.73))]
    records += [_on(_record(2, 0, 4, 0.894), xeon),
                _on(_record(2, 3, 1, 0.792), epyc, zen4, threads=2),
                _on(_record(2, 3, 2, 0.881), epyc, zen4, threads=2),
                _on(_record(1, 4, 1, 0.85), epyc, zen4, cap='AVX2', threads=1),
                _on(_record(2, 1, 2, 0.861), epyc, day='2026-11-27')]
    # A warmup run is no value of the table, so its machine is not in the legend.
    records.append(_on(_record(2, 0, 1, 0.5, warmup=50), 'Some other CPU', ['avx2'], threads=4))
    cells = {(c['devices'], c['epoch']): c for c in book_records.accuracy_cells(records, runs)}
    assert cells[2, 1]['runs'] == [{'seed': 0, 'acc': 0.8, 'machine': 'A'},
                                   {'seed': 1, 'acc': 0.73, 'machine': 'A'},
                                   {'seed': 3, 'acc': 0.792, 'machine': 'C'}]
    assert book_records.each_seed(cells[2, 1]) == 's0 0.800 A, s1 0.730 A, s3 0.792 C'
    assert book_records.each_seed(cells[2, 2]) == 's1 0.861 A, s3 0.881 C'
    assert book_records.each_seed(cells[2, 4]) == 's0 0.894 B'
    assert book_records.each_seed(cells[1, 1]) == 's4 0.850 D'
    assert book_records.each_seed(cells[1, 2]) == '-'
    legend = book_records.machine_legend(records)
    assert book_records.format_machine_legend(legend) == [
        book_records.MACHINE_TITLES,
        ['A', epyc, 'not recorded', 'not recorded',
         '2 devices, seeds 0 1, epoch 1; 2 devices, seed 1, epoch 2', '2026-11-26 to 2026-11-27'],
        ['B', xeon, 'not recorded', 'not recorded', '2 devices, seed 0, epoch 4', '2026-11-27'],
        ['C', epyc, 'AVX-512 (avx2, avx512f, avx512_bf16; no DNNL_MAX_CPU_ISA cap)',
         'OMP_NUM_THREADS=2', '2 devices, seed 3, epochs 1-2', '2026-11-27'],
        ['D', epyc, 'capped at AVX2 by DNNL_MAX_CPU_ISA (the CPU offers AVX-512: avx2, avx512f, '
         'avx512_bf16)', 'OMP_NUM_THREADS=1', '1 device, seed 4, epoch 1', '2026-11-27']]
    assert book_records.notebook_legend(legend[2:3]) == [
        '- C: AMD EPYC; oneDNN kernels: AVX-512 (avx2, avx512f, avx512_bf16; no DNNL_MAX_CPU_ISA '
        'cap); threads: OMP_NUM_THREADS=2; 2 devices, seed 3, epochs 1-2; recorded 2026-11-27']
    assert book_records.notebook_legend(legend[:1] + legend[3:], 'zh') == [
        '- A：AMD EPYC；oneDNN 内核：未记录；线程：未记录；2 个设备，随机种子 0 1，第 1 个迭代周期；'
        '2 个设备，随机种子 1，第 2 个迭代周期；记录于 2026-11-26 至 2026-11-27',
        '- D：AMD EPYC；oneDNN 内核：由 DNNL_MAX_CPU_ISA 限制为 AVX2（CPU 提供 AVX-512：avx2, '
        'avx512f, avx512_bf16）；线程：OMP_NUM_THREADS=1；1 个设备，随机种子 4，第 1 个迭代周期；'
        '记录于 2026-11-27']
    # The keys follow each machine's first line: lines appended later rename none of them.
    later = records + [_on(_record(1, 0, 1, 0.86), 'Another CPU', ['avx2'], threads=2)]
    assert [m['key'] for m in book_records.machine_legend(later)] == ['A', 'B', 'C', 'D', 'E']
    assert book_records.each_seed({'runs': book_records.accuracy_cells(later, runs)[0]['runs']}) \
        == 's0 0.860 E, s4 0.850 D'


@pytest.mark.parametrize('name,message', [
    ('/', r'^/ is a folder, not a regular file; pass --record with a regular file$'),
    ('README.md', r'README.md, line 1: not JSON \(.*\); fix or delete that line$'),
])
def test_a_file_that_is_no_record_is_one_error_naming_it(name, message):
    with pytest.raises(book_records.RecordError, match=message):
        book_records.read_records(os.path.join(ROOT, name))


def test_45_9_a_line_separator_inside_a_string_is_part_of_its_line(tmp_path):
    # str.splitlines() also splits at U+2028, which JSON allows raw inside a string.
    with open(book_records.DEFAULT_RECORD, encoding='utf-8') as f:
        record = json.loads(f.readline())
    record['cpu'] = 'AMD\u2028EPYC'
    path = tmp_path / 'record.jsonl'
    path.write_text(json.dumps(record, ensure_ascii=False) + '\n', encoding='utf-8')
    assert book_records.read_records(str(path))[0]['cpu'] == 'AMD\u2028EPYC'
