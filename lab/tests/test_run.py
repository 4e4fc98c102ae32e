"""lab/run.py's verdicts on the targets, from fixed medians (nothing is measured)."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # lab/
import run  # noqa: E402

import pytest  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize('page', ['benchmarks', 'benchmarks-avx2', 'bf16', 'peak-zen4'])
def test_a_speed_page_is_made_again_from_its_record_byte_for_byte(page):
    path = os.path.join(ROOT, 'docs', page + '.md')
    with open(run.records_of(path)) as f:
        raw = json.load(f)
    with open(path) as f:
        assert run.report(raw, run.records_link(path, run.records_of(path))) == f.read()


def test_the_physical_peak_is_cores_clock_and_flop_per_cycle_as_recorded():
    with open(os.path.join(ROOT, 'docs', 'records', 'peak-zen4.json')) as f:
        raw = json.load(f)
    info = raw['machine']
    assert (info['cpu_id'].startswith('cpu family 25, model 17'), info['cores']) == (True, 2)
    assert [line for line in run.report(raw, 'r.json').splitlines()
            if line.startswith('The physical peak')] == [
        'The physical peak: 2 cores x %.2f GHz (a core\'s clock while it works, measured at the '
        'start of this run: lab/measuring.py core_clock) x 32 float32 FLOP per cycle '
        '(measuring.FP32_FLOP_PER_CYCLE) = %.0f GFLOP/s, %.0f images/s. The matrix product '
        'reaches 96%% of it, ours 87%% (median).' % (
            info['clock_ghz'], 64 * info['clock_ghz'],
            64e9 * info['clock_ghz'] / raw['flops_per_image'])]
    # Records made before the clock was kept say nothing of a peak.
    del info['clock_ghz']
    assert 'The physical peak:' not in run.report(raw, 'r.json')


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
    # Its figures stand beside a report of the same CPU only.
    path.write_text(json.dumps({'machine': {'cpu': 'AMD EPYC'}, 'records': [
        dict(record, name=n, value=v) for n, v in (('ours-hyb-1', 80.0), ('order-d2lzh', 40.0),
                                                   ('order-d2lzh-omp', 42.0))]}))
    assert run.import_order_line(str(path), cpu=run.cpu_line({'cpu': 'AMD EPYC'})).endswith(
        '0.53x (2026-11-24 12:08 UTC).')
    assert run.import_order_line(str(path), cpu=run.cpu_line(AVX2_MACHINE)) == (
        "(c) in the book's import order (d2lzh, so MXNet, imported before gluon_mgpu): measured "
        'on its own, next to (c) on 1 device, in [import-order.md](import-order.md), on another '
        'CPU.')
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
    return subprocess.run([sys.executable, os.path.join(run.HERE, name)] + args,
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


AVX2_MACHINE = {'cpu': 'AMD EPYC', 'cpu_id': 'cpu family 25, model 1, stepping 1',
                'cpu_flags': ['avx2'], 'onednn_isa': 'Intel AVX2', 'torch_isa': 'AVX2'}


def test_a_report_names_the_cpu_and_the_vector_instructions_its_figures_depend_on():
    assert run.cpu_line(AVX2_MACHINE) == (
        "AMD EPYC (AMD Zen 3 (EPYC 7003, Milan); vector instructions: avx2, no AVX-512; MXNet's "
        "oneDNN runs Intel AVX2; PyTorch's kernels AVX2)")
    zen4 = dict(AVX2_MACHINE, cpu_id='cpu family 25, model 17, stepping 1',
                cpu_flags=['avx2', 'avx512f', 'avx512_bf16'], torch_isa=None,
                onednn_isa='Intel AVX-512 with Intel DL Boost and bfloat16 support')
    assert run.cpu_line(zen4) == (
        "AMD EPYC (AMD Zen 4 (EPYC 9004, Genoa); vector instructions: avx2, avx512f, "
        "avx512_bf16; MXNet's oneDNN runs Intel AVX-512 with Intel DL Boost and bfloat16 support)")
    # An unknown family is named by its numbers; a CPU without AVX2 says so.
    assert run.cpu_line(dict(AVX2_MACHINE, cpu='Intel Xeon', cpu_id='cpu family 6, model 85, '
                             'stepping 7', cpu_flags=[], onednn_isa=None, torch_isa=None)) == (
        'Intel Xeon (cpu family 6, model 85, stepping 7; vector instructions: none of avx2, '
        'avx512f, avx512_bf16, amx_bf16, no AVX-512)')
    # Records written before the instruction set was kept do not pretend to know it.
    assert run.cpu_line({'cpu': 'AMD EPYC', 'cores': 2}) == (
        'AMD EPYC (its instruction set was not recorded by this run)')


def test_the_settings_tried_change_only_their_own_variable():
    base = run.config('ours-hyb-1')
    assert run.config('ours-hyb-1-bind') == dict(base, env={'OMP_PROC_BIND': 'true',
                                                            'OMP_PLACES': 'cores'})
    assert run.config('ours-hyb-1-spin') == dict(base, env={'OMP_WAIT_POLICY': 'ACTIVE'})
    assert run.config('ours-hyb-1-static') == dict(base, static_shape=True)
    med = {'ours-hyb-1': 35.0, 'ours-hyb-1-bind': 35.7, 'ours-hyb-1-static': 33.6}
    rows = run.targets(med, dict(med))
    assert _row(rows, 'ours (1 device) with OpenMP threads pinned')[1:] == ('1.02x', '1.02x', True)
    assert _row(rows, 'ours (1 device) with hybridize(')[1:] == ('0.96x', '0.96x', False)
    assert not [r for r in rows if 'OMP_WAIT_POLICY' in r[0]]


def test_the_profile_names_the_kernels_each_primitive_ran_with():
    import profile_step
    conv = ('dnnl_verbose,exec,cpu,convolution,jit:avx2,backward_weights,src_f32::blocked:aBcd8b:'
            'f0 diff_wei_f32::blocked:ABcd8a8b:f0,,alg:convolution_direct,mb256_ic64oc64,%s')
    text = '\n'.join([
        'dnnl_verbose,exec,cpu,convolution,jit:avx2,forward_training,x,,y,z,1.5',  # before
        profile_step.MARK, conv % '10.25', conv % '4.75',
        'dnnl_verbose,exec,cpu,convolution,gemm:jit,forward_training,a,,b,c,2.0',
        'dnnl_verbose,exec,cpu,reorder,jit:uni,undef,src_f32::blocked:abcd:f0 '
        'dst_f32::blocked:aBcd8b:f0,,,256x64x28x28,0.5',
        'dnnl_verbose,info,cpu,isa:Intel AVX2', profile_step.MARK])
    kinds, reorders = profile_step.parse_verbose(text)
    assert kinds == {'convolution (jit:avx2)': [2, 15.0], 'convolution (gemm:jit)': [1, 2.0],
                     'reorder (jit:uni)': [1, 0.5]}
    assert reorders == {'src_f32::blocked:abcd:f0 dst_f32::blocked:aBcd8b:f0': [1, 0.5]}


def test_a_run_disturbed_throughout_gives_each_setting_per_core_it_got():
    def rec(value, cpu, disturbed=True):
        return {'value': value, 'cpu_per_wall': cpu, 'others_cores': 2 - cpu,
                'disturbed': disturbed}
    stats = {'ours-hyb-1': run.summarize([rec(4.4, 0.30), rec(6.0, 0.40)]),
             'torch-compile': run.summarize([rec(4.2, 0.30)]),
             'gemm': run.summarize([rec(26e9, 0.31)])}
    assert run.per_core_line(stats) == (
        'Every measurement was disturbed, so the images/s above are of a share of the machine. '
        'Per core used (median images/s over median CPU/wall; a rough guide, as a core shared '
        'with other jobs also loses cache): ours-hyb-1 14.9, torch-compile 14.0.')
    # One quiet run of any setting: its own figures stand, no such line.
    stats['gemm'] = run.summarize([rec(26e9, 0.31), rec(40e9, 1.95, disturbed=False)])
    assert run.per_core_line(stats) == ''
