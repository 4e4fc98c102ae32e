"""lab/gpu_run_odds.py: the odds the page quotes, exact, from the committed GPU runs."""
import itertools
import os
import sys
from fractions import Fraction

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, 'lab'))
import book_records  # noqa: E402
import gpu_run_odds  # noqa: E402



def test_the_odds_are_exact_against_counting_every_draw():
    values = [0.5, 0.75, 0.8, 0.9, 0.901]
    for n, x in [(1, 0.8), (2, 0.775), (3, 0.8), (3, 0.7), (4, 0.9005)]:
        draws = list(itertools.product(values, repeat=n))
        count = sum(round(sum(d) * 1000) <= x * 1000 * n + 1e-9 for d in draws)
        assert gpu_run_odds.mean_at_most(values, n, x) == Fraction(count, len(draws)), (n, x)
        count = sum(sum(v < 0.85 for v in d) >= 2 for d in draws)
        assert gpu_run_odds.at_least_below(values, n, 2, 0.85) == Fraction(count, len(draws))


def test_the_pages_odds_for_2_devices(capsys):
    # docs/book-comparison.md, the Xeon runs' paragraph: epoch 1's six runs average 0.730,
    # which six later-edition runs do 4.9% of the time; at epoch 3 two of six read below
    # 0.845, as 6 of the 105 later-edition runs do, and six draws hold two or more 4.2% of it.
    gpu_run_odds.main(['--devices', '2', '--epoch', '1', '--ours', '0.7996', '0.7249', '0.7935',
                       '0.7264', '0.7499', '0.5872'])
    gpu_run_odds.main(['--devices', '2', '--epoch', '3', '--ours', '0.8396', '0.8789', '0.8772',
                       '0.8741', '0.8403', '0.8823', '--below', '0.845'])
    out = capsys.readouterr().out.splitlines()
    assert out[1] == '6 of them average at most 0.7302: 4.9% of all 107^6 draws'
    assert out[4] == 'below 0.845: 2 of ours, 6 of the 105 runs; 6 draws hold 2 or more: 4.2%'
    assert sorted(book_records.read_gpu_runs()['later', 2, 1])[:3] == [0.587, 0.588, 0.589]


def test_an_accuracy_that_is_no_fraction_is_one_line_and_exit_2(capsys):
    for bad in ('nan', '1.5', 'x'):
        assert gpu_run_odds.main(['--devices', '2', '--epoch', '1', '--ours', '0.8', bad]) == 2
        assert capsys.readouterr().err == (
            "lab/gpu_run_odds.py: error: argument --ours: an accuracy is a number from 0 "
            "to 1, got %r; for example 0.8396 (see --help)\n" % bad)


def test_45_8_a_second_ours_adds_to_the_first(capsys):
    assert gpu_run_odds.main(['--devices', '2', '--epoch', '1', '--ours', '0.7996', '0.7249',
                              '0.7935', '--ours', '0.7264', '0.7499', '0.5872']) == 0
    assert capsys.readouterr().out.splitlines()[1] == ('6 of them average at most 0.7302: 4.9% '
                                                       'of all 107^6 draws')


@pytest.mark.parametrize('content,says', [
    (b'\xff\xfe', "cannot be read (UnicodeDecodeError: 'utf-8' codec can't decode byte 0xff in "
                  "position 0: invalid start byte)"),
    (b'edition,gpus,acc_e1\nd2l (MXNet np),3,0.5\n',
     "cannot be read (ValueError: {path}, line 2: acc_e1 is '0.5' with gpus '3', not an accuracy "
     "from 0 to 1 on 1 or 2 GPUs)"),
    (b'edition,gpus\n', 'holds no later-edition run on 2 device(s) at epoch 1')])
def test_45_8_a_damaged_csv_of_gpu_runs_is_one_line(content, says, tmp_path, monkeypatch,
                                                   capsys):
    path = tmp_path / 'runs.csv'
    path.write_bytes(content)
    monkeypatch.setattr(book_records, 'GPU_RUNS', str(path))
    assert gpu_run_odds.main(['--devices', '2', '--epoch', '1', '--ours', '0.8']) == 2
    assert capsys.readouterr().err == ('lab/gpu_run_odds.py: error: %s %s; restore it: '
                                       'git checkout %s\n' % (path, says.format(path=path), path))


def _odds(*tail):
    return ('%s %s --devices 2 --epoch 1 --ours 0.8 %s'
            % (sys.executable, os.path.join(ROOT, 'lab', 'gpu_run_odds.py'), ' '.join(tail)))


def test_45_8_stdout_that_is_gone_or_full_ends_as_a_unix_tool_ends():
    import subprocess
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first line, as head -1's after its line
    done = subprocess.run(_odds().split(), stdout=write, stderr=subprocess.PIPE, text=True,
                          timeout=300)
    os.close(write)
    assert (done.returncode, done.stderr) == (141, '')
    done = subprocess.run(['bash', '-c', _odds() + ' >/dev/full'], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 1
    assert done.stderr == ('lab/gpu_run_odds.py: error: cannot write to stdout (No space '
                           'left on device); free some space on that disk or write somewhere '
                           'else\n')
