"""benchmarks/run.py's verdicts on the targets, from fixed medians (nothing is measured)."""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                'benchmarks'))
import run  # noqa: E402

import pytest  # noqa: E402

# A test of a script in benchmarks/ (the project measuring itself): make bench-test.
pytestmark = pytest.mark.bench


def _row(rows, start):
    return next(r for r in rows if r[0].startswith(start))


def test_a_ratio_that_rounds_to_its_goal_shows_enough_digits_to_see_the_verdict():
    two = '2 simulated devices at least as fast as 1'
    med = {'ours-hyb-1': 80.95, 'ours-hyb-2': 80.55}
    best = {'ours-hyb-1': 81.6, 'ours-hyb-2': 81.4}
    assert _row(run.targets(med, best), two)[1:] == ('0.995x', '0.998x', False)
    med['ours-hyb-2'] = 81.35
    assert _row(run.targets(med, best), two)[1:] == ('1.005x', '0.998x', True)
    # Far from the goal, two decimals.
    med['ours-hyb-2'] = 74.8
    assert _row(run.targets(med, best), two)[1:] == ('0.92x', '0.998x', False)


def test_the_import_order_rows_measured_apart_give_benchmarks_md_their_ratio(tmp_path):
    record = {'wall': 1.0, 'cpu': 1.0, 'cpu_per_wall': 1.0, 'others_cores': 0.0,
              'disturbed': False, 'utc': '2026-11-24 12:08 UTC'}
    path = tmp_path / 'import-order.json'
    path.write_text(json.dumps({'records': [
        dict(record, name='ours-hyb-1', value=80.0), dict(record, name='order-d2lzh', value=40.0),
        dict(record, name='order-d2lzh-omp', value=42.0)]}))
    assert run.import_order_line(str(path)) == (
        "(c) in the book's import order (d2lzh, so MXNet, imported before gluon_mgpu): measured "
        "on its own, next to (c) on 1 device, in [import-order.md](import-order.md): 40.0 "
        "images/s against 80.0 with the package imported first, 0.50x; MXSetNumOMPThreads(cores) "
        "after the import does not help: 42.0, 0.53x (2026-11-24 12:08 UTC).")
    assert run.import_order_line(str(tmp_path / 'none.json')).endswith('(import-order.md).')
    # The report from benchmarks.json does not list them as not measured.
    assert run.config('order-d2lzh')['threads'] == 'd2lzh-first'


def test_the_bfloat16_targets_compare_with_float32_and_torch_compile_of_the_same_run():
    med = {'ours-hyb-1': 80.0, 'ours-bf16-1': 124.0, 'torch-bf16-compile': 130.0,
           'ours-hyb-2': 80.0, 'ours-bf16-2': 116.0, 'eval-1': 250.0, 'eval-bf16-1': 400.0}
    rows = run.targets(med, dict(med))
    assert _row(rows, 'ours bfloat16 (1 device) >= 1.5x')[1:] == ('1.55x', '1.55x', True)
    assert _row(rows, 'ours bfloat16 (2 devices) >= 1.5x')[1:] == ('1.45x', '1.45x', False)
    assert _row(rows, 'ours bfloat16 (1 device) >= torch.compile')[1:] == (
        '0.95x', '0.95x', False)
    assert _row(rows, 'evaluation bfloat16 >= 1.5x evaluation float32, 1 device')[1:] == (
        '1.60x', '1.60x', True)
    # eval-2 was not measured: no verdict rather than one against another run's number.
    assert not [r for r in rows if r[0].endswith('2 devices') and 'evaluation' in r[0]]


def test_the_bfloat16_matrix_product_is_measured_the_way_the_fp32_one_is():
    assert run.config('gemm-bf16') == dict(run.config('gemm'), dtype='bfloat16')
    assert run.config('gemm')['dtype'] == 'float32'
    assert run.config('ours-bf16-1') == dict(run.config('ours-hyb-1'), dtype='bfloat16')
    assert run.config('torch-bf16-compile') == dict(run.config('torch-compile'),
                                                    dtype='bfloat16')


def test_a_part_whose_settings_were_all_measured_again_leaves_the_report():
    parts = [{'what': 'ours-hyb-1, gemm'}, {'what': 'eval-1'}, {'what': 'all settings'}]
    assert run.current_parts(parts, ['ours-hyb-1', 'gemm', 'eval-1']) == [parts[2]]
    assert run.current_parts(parts, ['gemm']) == parts
    assert run.current_parts(parts, run.NAMES) == []


def test_the_capped_instruction_set_changes_nothing_but_the_cap():
    assert run.config('ours-bf16-1-avx512_core') == dict(run.config('ours-bf16-1'),
                                                         isa='AVX512_CORE')
    assert run.config('ours-hyb-1-avx512_core') == dict(run.config('ours-hyb-1'),
                                                        isa='AVX512_CORE', dtype='float32')


def test_the_emulated_bfloat16_row_compares_with_float32_under_the_same_cap():
    med = {'ours-bf16-1-avx512_core': 29.35, 'ours-hyb-1-avx512_core': 80.6}
    assert _row(run.targets(med, dict(med)), 'bfloat16 >= float32 on a CPU without')[1:] == (
        '0.36x', '0.36x', False)


import subprocess  # noqa: E402

import pytest  # noqa: E402


def _script(name, args, cwd):
    return subprocess.run([sys.executable, os.path.join(os.path.dirname(run.HERE), 'benchmarks',
                                                        name)] + args,
                          cwd=cwd, capture_output=True, text=True, timeout=300)


def test_45_8_repeats_0_is_refused_and_the_records_are_kept(tmp_path):
    raw = tmp_path / 'b.json'
    raw.write_text('{"records": [{"name": "gemm"}], "runs": []}\n')
    done = _script('run.py', ['--only', 'gemm', '--repeats', '0', '--raw', str(raw), '--out',
                              str(tmp_path / 'b.md')], tmp_path)
    assert (done.returncode, done.stdout) == (2, '')
    assert done.stderr == ('run.py: error: --repeats 0 --retries 1: pass --repeats 1 or more and '
                           '--retries 0 or more\n')
    assert raw.read_text() == '{"records": [{"name": "gemm"}], "runs": []}\n'
    assert not (tmp_path / 'b.md').exists()


@pytest.mark.parametrize('script', ['run.py', 'scaling.py'])
@pytest.mark.parametrize('content,says', [
    ('{"records": [1\n', "cannot be read as raw records (Expecting ',' delimiter: line 2 column 1 "
                       "(char 15))"),
    ('[]\n', 'holds no raw records (a JSON object with lists "records" and "runs" of objects)')])
def test_45_8_report_only_with_a_corrupt_record_is_one_line(script, content, says, tmp_path):
    raw = tmp_path / 'r.json'
    raw.write_text(content)
    flags = ['--raw', str(raw)] if script == 'run.py' else []
    done = _script(script, ['--report-only', '--out', str(tmp_path / 'r.md')] + flags, tmp_path)
    assert (done.returncode, done.stdout) == (2, '')
    assert done.stderr == ('%s: error: %s %s; restore it (git checkout %s) or delete it and '
                           'measure every setting again\n' % (script, raw, says, raw))
    assert raw.read_text() == content and not (tmp_path / 'r.md').exists()


def test_a_report_of_docs_keeps_its_raw_records_in_docs_records(tmp_path):
    page = os.path.join(run.ROOT, 'docs', 'bf16.md')
    assert run.records_of(page) == os.path.join(run.ROOT, 'docs', 'records', 'bf16.json')
    assert run.records_link(page, run.records_of(page)) == 'records/bf16.json'
    # A report elsewhere (a smoke run's, --out /tmp/x.md) keeps them beside it.
    assert run.records_of(str(tmp_path / 'x.md')) == str(tmp_path / 'x.json')
    assert run.records_link(str(tmp_path / 'x.md'), str(tmp_path / 'x.json')) == 'x.json'
