"""`make demo` as the README shows it, and benchmarks/demo_spread.py, which measured how its
accuracies move with the CPU's kernels and threads (docs/demo-spread.md, issue 46)."""
import json
import os
import re
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, 'benchmarks'))
import demo_spread  # noqa: E402


def _records():
    with open(demo_spread.RECORDS) as f:
        return [json.loads(line) for line in f if line.strip()]


def test_the_readme_runs_the_makefiles_demo_and_prints_its_recorded_run():
    with open(os.path.join(ROOT, 'Makefile')) as f:
        [args] = re.findall(r'^DEMO_ARGS \?= (.*)$', f.read(), re.M)
    with open(os.path.join(ROOT, 'README.md')) as f:
        readme = f.read()
    shown = re.search(r'`make demo` runs `python -m gluon_mgpu\.train ([^`]*)`', readme).group(1)
    assert ' '.join(shown.split()) == args
    # The demo is the setting docs/demo-spread.md chose, with the README's seed.
    assert args == demo_spread.CANDIDATES[demo_spread.CHOSEN] + ' --seed 0'
    # The printed run is the recorded one of its setting (AVX-512 kernels, 1 thread per device).
    printed = re.findall(r'^epoch \d, training time: [\d.]+ sec, test_acc (\d\.\d\d)$', readme,
                         re.M)
    [run] = [r for r in _records() if r['candidate'] == demo_spread.CHOSEN and r['seed'] == 0
             and r['setting'] == 'native-1t']
    assert printed == ['%.2f' % a for a in run['test_acc']]


@pytest.mark.bench
def test_the_report_says_under_which_settings_a_candidate_ran():
    records = [{'candidate': 'q', 'setting': s} for s in ('avx2-1t', 'avx2-2t')]
    assert demo_spread._settings_run('q', records) == (
        'under avx2-1t and avx2-2t only (not run: native-1t, native-2t)')
    assert demo_spread._settings_run('q', records[:1]) == (
        'under avx2-1t only (not run: avx2-2t, native-1t, native-2t)')
    records += [{'candidate': 'q', 'setting': s} for s in ('native-1t', 'native-2t')]
    assert demo_spread._settings_run('q', records) == 'under all four'
    assert demo_spread._settings_run('other', records) == 'under none of them'
