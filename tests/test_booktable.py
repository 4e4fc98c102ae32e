"""The book table's runs, records and resumption (gluon_mgpu.commands.booktable)."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from gluon_mgpu.commands import booktable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _line(**changes):
    record = {'devices': 2, 'seed': 0, 'warmup_steps': 0, 'epoch': 1, 'batch_size': 512,
              'lr': 0.2, 'seconds': 900.5, 'train_loss': 1.2, 'train_acc': 0.55,
              'test_acc': 0.49, 'acc_running': [0.49, 0.5], 'acc_precise_bn': 0.7,
              'acc_batch_stats': 0.72, 'train_limit': None, 'test_limit': None,
              'step': 'trainer.step(batch_size)'}
    record.update(changes)
    return record


def _write(path, *records, raw=()):
    with open(path, 'w') as f:
        for r in records:
            f.write(json.dumps(r) + '\n')
        for line in raw:
            f.write(line + '\n')


def test_plan_runs_orders_the_books_table():
    runs = booktable.plan_runs([0, 1, 2], warmup_steps=50)
    assert [r.name for r in runs] == [
        '2dev-seed0', '2dev-seed1', '2dev-seed2', '2dev-seed0-warmup50', '2dev-seed1-warmup50',
        '2dev-seed2-warmup50', '1dev-seed0', '1dev-seed1', '1dev-seed2']
    assert [r.epochs for r in runs] == [4] * 3 + [1] * 3 + [4] * 3
    assert booktable.plan_runs([7], train_limit=256)[0].name == '2dev-seed7-limit256xall'


def test_train_argv_is_the_train_command_with_the_books_defaults():
    run = booktable.Run(2, 1, 50, 1, 256, None)
    argv = booktable.train_argv(run, '/w/2dev', 1, resume=True, device='cpu', data_dir='/d')
    assert argv[0] == sys.executable
    assert argv[1:] == ['-m', 'gluon_mgpu.train', '--num-gpus', '2', '--seed', '1',
                        '--epochs', '1', '--checkpoint-dir', '/w/2dev', '--device', 'cpu',
                        '--resume', '--warmup-steps', '50', '--train-limit', '256',
                        '--data-dir', '/d']


def test_records_round_trip_and_an_identical_repeat_counts_once(tmp_path):
    path = str(tmp_path / 'rec.jsonl')
    assert booktable.read_records(path) == []
    booktable.append_record(path, _line())
    booktable.append_record(path, _line(epoch=2, test_acc=0.6, acc_running=[0.6, 0.61]))
    booktable.append_record(path, _line())  # retrained from scratch: the same numbers
    records = booktable.read_records(path)
    assert [r['epoch'] for r in records] == [1, 2]
    assert records[0] == _line()
    run = booktable.Run(2, 0, 0, 4, None, None)
    assert booktable.recorded_epochs(records, run) == [1, 2]
    assert booktable.recorded_epochs(records, run._replace(seed=1)) == []


@pytest.mark.parametrize('lines,message', [
    (['{"devices": 2'], r'rec.jsonl, line 1: not JSON \(.*\); fix or delete that line'),
    ([json.dumps(_line(test_acc=1.5))], r'line 1: an accuracy is not a number from 0 to 1'),
    ([json.dumps(_line(seed='0'))], r"line 1: seed is '0', not a whole number; fix or delete"),
    ([json.dumps(_line(acc_running=[0.5]))], r'acc_running does not hold one per device'),
    ([json.dumps(_line(seconds=float('nan')))], r'line 1: seconds is nan, not a number'),
    ([json.dumps(_line()), json.dumps(_line(test_acc=0.3))],
     r'line 2: epoch 1 of run 2dev-seed0 is recorded twice with different accuracies '
     r'\(0.49, then 0.3\); keep one of the two lines'),
    (['[1, 2]'], r'line 1: not a JSON object'),
    (['{"seed": 0, "step": "trainer.step(batch_size)"}'], r'line 1: it lacks devices; fix or delete that line \(the epoch is then '
                      r'trained again\)'),
])
def test_a_bad_record_line_is_one_error_naming_the_line(tmp_path, lines, message):
    path = str(tmp_path / 'rec.jsonl')
    _write(path, raw=lines)
    with pytest.raises(booktable.RecordError, match=message):
        booktable.read_records(path)


def test_a_record_holds_the_runs_of_one_step(tmp_path):
    path = str(tmp_path / 'rec.jsonl')
    old = _line()
    del old['step']  # written before the book's step: trainer.step(X.shape[0])
    _write(path, _line(), old)
    with pytest.raises(booktable.RecordError) as e:
        booktable.read_records(path)
    assert str(e.value) == (
        '%s, line 2: trained with trainer.step(X.shape[0]), not trainer.step(batch_size); a '
        'record holds the runs of one step only: keep the line in a record of its own (the old '
        "step's are in docs/book-table-old-step.jsonl)" % path)
    _write(path, old, old)
    assert booktable.read_records(path, step='trainer.step(X.shape[0])') == [old]
    # The committed records: the old step's 27 epochs apart from the book's step's.
    assert len(booktable.read_records(booktable.OLD_STEP_RECORD,
                                      step='trainer.step(X.shape[0])')) == 27
    assert all(r['step'] == 'trainer.step(batch_size)'
               for r in booktable.read_records(booktable.DEFAULT_RECORD))


def test_the_record_is_never_written_through_a_link_or_to_a_fifo(tmp_path):
    target = tmp_path / 'not-ours.txt'
    target.write_text('keep\n')
    link = tmp_path / 'rec.jsonl'
    link.symlink_to(target)
    with pytest.raises(OSError, match='cannot append to the record .*rec.jsonl: .*symbolic link'):
        booktable.append_record(str(link), _line())
    assert target.read_text() == 'keep\n'
    fifo = tmp_path / 'fifo.jsonl'
    os.mkfifo(fifo)
    with pytest.raises(booktable.RecordError, match='fifo.jsonl is a FIFO'):
        booktable.read_records(str(fifo))


def test_summarize():
    assert booktable.summarize([]) is None
    assert booktable.summarize([0.5, 0.25, 1.0]) == {'n': 3, 'mean': 0.5833333333333334,
                                                     'low': 0.25, 'high': 1.0}


def _compare(*args, **kwargs):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (ROOT, os.environ.get('PYTHONPATH')) if p))
    return subprocess.Popen([sys.executable, '-m', 'gluon_mgpu.compare', *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            **kwargs)


@pytest.mark.slow
def test_full_run_is_recorded_per_epoch_and_resumes_after_sigterm(tmp_path):
    """A stopped --full keeps its finished epochs and continues where it was."""
    record, work = str(tmp_path / 'rec.jsonl'), str(tmp_path / 'work')
    args = ('--full', '--seeds', '0', '--epochs', '2', '--train-limit', '256', '--test-limit',
            '128', '--record', record, '--work-dir', work)
    first = _compare(*args)
    deadline = time.time() + 600
    while not (os.path.exists(record) and open(record).read().count('\n') == 1):
        assert first.poll() is None, first.communicate()
        assert time.time() < deadline
        time.sleep(1)
    first.send_signal(signal.SIGTERM)
    out, err = first.communicate(timeout=300)
    assert first.returncode == 143, err
    assert err.splitlines()[-1] == (
        'python -m gluon_mgpu.compare: terminated (SIGTERM); the finished epochs are recorded, '
        'give the same command again to continue')
    [kept] = open(record).read().splitlines()

    second = _compare(*args)
    out, err = second.communicate(timeout=1200)
    lines = open(record).read().splitlines()
    assert lines[0] == kept
    records = booktable.read_records(record)
    assert [(r['devices'], r['epoch']) for r in records] == [(2, 1), (2, 2), (1, 1), (1, 2)]
    for r in records:
        assert r['train_limit'] == 256 and r['test_limit'] == 128
        assert r['test_acc'] in {k / 128 for k in range(129)}
        assert len(r['acc_running']) == r['devices']
        if r['devices'] == 1:
            # One device: the train command's accuracy is the book's measure.
            assert r['acc_running'] == [r['test_acc']]
    assert 'book table: 3 of 4 epochs recorded; training 1dev-seed0-limit256x128 epoch 2' in out
    # The checkpoints of every epoch stay in the work folder.
    names = os.listdir(os.path.join(work, '2dev-seed0-limit256x128'))
    assert {'epoch-0001.json', 'epoch-0002.json'} <= set(names)


def test_bfloat16_runs_are_runs_of_their_own():
    run = booktable.Run(2, 1, 0, 1, None, None, 'bfloat16')
    assert run.name == '2dev-seed1-bf16'
    assert booktable.train_argv(run, '/w', 1, resume=False)[-2:] == ['--dtype', 'bfloat16']
    assert '--dtype' not in booktable.train_argv(run._replace(dtype='float32'), '/w', 1, False)
    assert [r.name for r in booktable.plan_runs([0], dtype='bfloat16', epochs=1)] == [
        '2dev-seed0-bf16', '1dev-seed0-bf16']
    # A line without dtype (every line of the book's record) is float32.
    assert booktable.record_key(_line())[-1] == 'float32'
    assert booktable.record_key(_line(dtype='bfloat16')) != booktable.record_key(_line())
    records = [_line(), _line(dtype='bfloat16', test_acc=0.3)]  # not the same epoch twice
    assert booktable.recorded_epochs(records, run._replace(seed=0)) == [1]


def test_a_record_line_with_another_dtype_is_refused(tmp_path):
    path = str(tmp_path / 'rec.jsonl')
    _write(path, _line(dtype='float16'))
    with pytest.raises(booktable.RecordError, match=r'line 1: dtype is \'float16\', not '
                                                    r'"float32" or "bfloat16"; fix or delete'):
        booktable.read_records(path)


@pytest.mark.slow
def test_full_bfloat16_records_its_runs_apart_and_prints_their_table(tmp_path):
    bf16, book = str(tmp_path / 'bf16.jsonl'), str(tmp_path / 'book.jsonl')
    _write(book, _line(devices=1, acc_running=[0.2], test_limit=128, train_limit=256),
           _line(devices=1, seed=1, acc_running=[0.3], test_limit=128, train_limit=256))
    child = _compare('--full', '--dtype', 'bfloat16', '--seeds', '0', '--epochs', '1',
                     '--train-limit', '256', '--test-limit', '128', '--record', book,
                     '--bf16-record', bf16, '--work-dir', str(tmp_path / 'work'))
    out, err = child.communicate(timeout=1200)
    assert child.returncode == 0, err
    records = booktable.read_records(bf16)
    assert [(r['devices'], r['dtype']) for r in records] == [(2, 'bfloat16'), (1, 'bfloat16')]
    assert len(open(book).read().splitlines()) == 2  # the float32 record is only read
    one = records[1]['acc_running'][0]
    assert records[1]['acc_running'] == [records[1]['test_acc']]
    assert ("1 device   1      device 0 running stats (book's)  mean 0.25 (0.20-0.30, 2 seeds)  "
            'mean %.2f (%.2f-%.2f, 1 seed)' % (one, one, one)) in out
    assert "2 devices  1      device 0 running stats (book's)  not run" in out
    # The measures a chaotic first epoch moves less: the float32 side is read from the record.
    assert ('1 device   1      precise BatchNorm                mean 0.70 (0.70-0.70, 2 seeds)  '
            'mean %.2f' % records[1]['acc_precise_bn']) in out
    # The train command ran in bfloat16: its checkpoint says so.
    ck = json.load(open(tmp_path / 'work' / '1dev-seed0-limit256x128-bf16' / 'epoch-0001.json'))
    assert ck['args']['dtype'] == 'bfloat16'
