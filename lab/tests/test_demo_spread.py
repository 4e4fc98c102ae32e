"""`make demo` as the README shows it, and lab/demo_spread.py, which measured how its
accuracies move with the CPU's kernels and threads (docs/demo-spread.md, issue 46)."""
import json
import os
import re
import sys
import tempfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, 'lab'))
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


def test_the_report_says_under_which_settings_a_candidate_ran():
    records = [{'candidate': 'q', 'setting': s} for s in ('avx2-1t', 'avx2-2t')]
    assert demo_spread._settings_run('q', records) == (
        'under avx2-1t and avx2-2t only (not run: native-1t, native-2t)')
    assert demo_spread._settings_run('q', records[:1]) == (
        'under avx2-1t only (not run: avx2-2t, native-1t, native-2t)')
    records += [{'candidate': 'q', 'setting': s} for s in ('native-1t', 'native-2t')]
    assert demo_spread._settings_run('q', records) == 'under all four'
    assert demo_spread._settings_run('other', records) == 'under none of them'


def test_a_notebook_candidate_runs_until_this_cpu_holds_runs_samples(tmp_path, monkeypatch):
    # The notebook sets no seed, so each run is a sample: --runs N trains until the records hold
    # N per setting on this CPU (family and model); another CPU's runs, though named alike
    # ("AMD EPYC"), do not count.
    path = str(tmp_path / 'records.jsonl')
    candidate = demo_spread.CHOSEN_QUICK
    args = demo_spread.NOTEBOOK_CANDIDATES[candidate]
    mine = demo_spread.cpu_id()  # the other: a Zen 4's, or on a Zen 4 a Zen 3's
    other = [ident for ident in ('cpu family 25, model 17, stepping 1',
                                 'cpu family 25, model 1, stepping 1') if ident != mine][0]
    with open(path, 'w') as f:
        for ident in (mine, other, other):
            f.write(json.dumps(dict(_records()[0], candidate=candidate, args=args,
                                    setting='native-2t', seed=None, cpu_id=ident)) + '\n')
    trained = []
    monkeypatch.setattr(tempfile, 'tempdir', str(tmp_path))  # the claims' folder
    monkeypatch.setattr(demo_spread, '_run_once', lambda path, candidate, args, setting, seed,
                        run_seed, isa: trained.append((setting, run_seed)))
    demo_spread.run([candidate], [0, 1], ['native-2t'], path, runs=3)
    assert trained == [('native-2t', None)] * 2
    # A second instance on the same machine finds those runs claimed.
    demo_spread.run([candidate], [0], ['native-2t'], path, runs=3)
    assert len(trained) == 2


@pytest.mark.parametrize('line, problem', [
    ('{"args": "--num-gpus 2", "candidate": "demo-o', 'is not a JSON line (Unterminated string '
     'starting at: line 1 column 39 (char 38))'),
    ('{}', 'has no candidate of the kind a run writes'),
    (None, 'is not a JSON line (NaN is not a number a run gives)')])
def test_a_record_line_cut_short_empty_or_nan_is_one_line_and_exit_2(tmp_path, monkeypatch,
                                                                      capsys, line, problem):
    good = open(demo_spread.RECORDS).readline()
    bad = tmp_path / 'records.jsonl'
    bad.write_text(good + (good.replace('"test_acc": [0.539', '"test_acc": [NaN')
                           if line is None else line + '\n'))
    out = tmp_path / 'report.md'
    monkeypatch.setattr(demo_spread.report, '__defaults__', (str(bad), str(out)))
    assert demo_spread.main(['report']) == 2
    assert capsys.readouterr().err == (
        'lab/demo_spread.py: error: %s, line 2: %s; fix or delete that line (each is one run)\n'
        % (os.path.relpath(str(bad), ROOT), problem))
    assert not out.exists()


@pytest.mark.parametrize('flags, line', [
    (['--runs', '0'], '--runs: --runs must be at least 1, got 0; for example --runs 3'),
    (['--seeds', 'x'], "--seeds: --seeds expects a whole number, got 'x'; for example --seeds 0"),
    (['--seeds', '-1'], '--seeds: --seeds must be at least 0, got -1; for example --seeds 0')])
def test_run_flags_that_train_nothing_or_fail_in_the_child_are_refused_first(capsys, flags,
                                                                             line):
    assert demo_spread.main(['run', '--candidate', 'demo-old'] + flags) == 2
    assert capsys.readouterr().err == (
        'lab/demo_spread.py: error: argument %s (see --help)\n' % line)
