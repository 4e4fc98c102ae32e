"""The book table's runs, records, resumption and page tables (lab/book_table.py, and the
records' reader in lab/book_records.py)."""
import json
import os
import signal
import subprocess
import sys
import time

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, init, nd

from gluon_mgpu import CheckpointError, list_checkpoints, load_data_fashion_mnist, new_network
from conftest import max_abs_diff

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, 'lab'))
import book_records  # noqa: E402
import book_table  # noqa: E402



def _line(**changes):
    record = {'devices': 2, 'seed': 0, 'warmup_steps': 0, 'epoch': 1, 'batch_size': 512,
              'lr': 0.2, 'seconds': 900.5, 'images_per_sec': 66.6, 'train_loss': 1.2,
              'train_acc': 0.55, 'test_acc': 0.49, 'acc_running': [0.49, 0.5],
              'acc_precise_bn': 0.7, 'acc_batch_stats': 0.72, 'train_limit': None,
              'test_limit': None, 'step': 'trainer.step(batch_size)'}
    record.update(changes)
    return record


def _write(path, *records, raw=()):
    with open(path, 'w') as f:
        for r in records:
            f.write(json.dumps(r) + '\n')
        for line in raw:
            f.write(line + '\n')


def test_plan_runs_orders_the_books_table():
    runs = book_table.plan_runs([0, 1, 2], warmup_steps=50)
    assert [r.name for r in runs] == [
        '2dev-seed0', '2dev-seed1', '2dev-seed2', '2dev-seed0-warmup50', '2dev-seed1-warmup50',
        '2dev-seed2-warmup50', '1dev-seed0', '1dev-seed1', '1dev-seed2']
    assert [r.epochs for r in runs] == [4] * 3 + [1] * 3 + [4] * 3
    assert book_table.plan_runs([7], train_limit=256)[0].name == '2dev-seed7-limit256xall'
    assert [r.name for r in book_table.plan_runs([0], dtype='bfloat16', epochs=1)] == [
        '2dev-seed0-bf16', '1dev-seed0-bf16']


def test_train_argv_is_the_train_command_with_the_books_defaults():
    run = book_table.Run(2, 1, 50, 1, 256, None)
    argv = book_table.train_argv(run, '/w/2dev', 1, resume=True, device='cpu', data_dir='/d')
    assert argv[0] == sys.executable
    assert argv[1:] == ['-m', 'gluon_mgpu.train', '--num-gpus', '2', '--seed', '1',
                        '--epochs', '1', '--checkpoint-dir', '/w/2dev', '--device', 'cpu',
                        '--resume', '--warmup-steps', '50', '--train-limit', '256',
                        '--data-dir', '/d']
    bf16 = run._replace(dtype='bfloat16', warmup_steps=0, train_limit=None)
    assert book_table.train_argv(bf16, '/w', 1, resume=False)[-2:] == ['--dtype', 'bfloat16']


def test_records_round_trip_and_an_identical_repeat_counts_once(tmp_path):
    path = str(tmp_path / 'rec.jsonl')
    assert book_records.read_records(path) == []
    book_table.append_record(path, _line())
    book_table.append_record(path, _line(epoch=2, test_acc=0.6, acc_running=[0.6, 0.61]))
    book_table.append_record(path, _line())  # retrained from scratch: the same numbers
    # The same numbers under another machine's name: the first line's machine stays the cell's.
    book_table.append_record(path, _line(cpu='Another CPU', cpu_flags=['avx2'], threads=1))
    records = book_records.read_records(path)
    assert [r['epoch'] for r in records] == [1, 2]
    assert records[0] == _line()
    assert book_records.machine_of(records[0]) == ('not recorded',) * 3
    run = book_table.Run(2, 0, 0, 4, None, None)
    assert [book_table.recorded(records, run, e) for e in (1, 2, 3)] == [True, True, False]
    assert not book_table.recorded(records, run._replace(seed=1), 1)
    # A line without dtype (every line of the book's record) is float32, another run than
    # bfloat16's.
    assert book_records.record_key(_line())[-1] == 'float32'
    assert not book_table.recorded([_line(dtype='bfloat16')], run, 1)


FIX = r'; fix or delete that line \(the epoch is then trained again\)$'


@pytest.mark.parametrize('lines,message', [
    (['{"devices": 2'], r'rec.jsonl, line 1: not JSON \(.*\); fix or delete that line$'),
    (['[' * 100000 + ']' * 100000], r'line 1: not JSON \(.*\); fix or delete that line$'),
    ([json.dumps(_line(test_acc=1.5))], r'line 1: test_acc is 1.5, not a number from 0 to 1'
                                        + FIX),
    ([json.dumps(_line(seed='0'))], r'line 1: seed is "0", not a whole number from 0 to '
                                    r'2147483647' + FIX),
    ([json.dumps(_line(seed=-5))], r'line 1: seed is -5, not a whole number from 0' ),
    ([json.dumps(_line(epoch=1.0))], r'line 1: epoch is 1.0, not a whole number from 1 to '
                                     r'1000000' + FIX),
    ([json.dumps(_line(devices=10 ** 400))], r'line 1: devices is a whole number of 401 digits, '
                                             r'not a whole number from 1 to 1024'),
    ([json.dumps(_line(acc_running=[0.5]))], r'acc_running holds 1 accuracies for 2 devices'),
    ([json.dumps(_line(seconds=float('nan')))], r'line 1: seconds is NaN, not a number from '
                                                r'1e-09 to 1e\+09'),
    ([json.dumps(_line(device_names=5))], r'line 1: device_names is 5, not a list of device names'
                                          + FIX),
    ([json.dumps(_line(dtype='float16'))], r'line 1: dtype is "float16", not "float32" or '
                                           r'"bfloat16"' + FIX),
    ([json.dumps(_line()), json.dumps(_line(test_acc=0.3))],
     r'line 2: epoch 1 of this run is recorded twice with different accuracies \(0.49, then '
     r'0.3\); keep one of the two lines'),
    # The same seed and epoch from another machine: its accuracies differ, so it is refused.
    ([json.dumps(_line(cpu='AMD EPYC')), json.dumps(_line(cpu='Intel(R) Xeon(R) Processor',
                                                          test_acc=0.5))],
     r'line 2: epoch 1 of this run is recorded twice with different accuracies \(0.49, then '
     r'0.5\); keep one of the two lines'),
    # The machine's fields, which the table names each value's machine by.
    ([json.dumps(_line(threads=0))], r'line 1: threads is 0, not a whole number from 1 to '
                                     r'1000000' + FIX),
    ([json.dumps(_line(cpu_flags='avx2'))], r'line 1: cpu_flags is "avx2", not a list of CPU '
                                            r'flags' + FIX),
    ([json.dumps(_line(cpu=''))], r'line 1: cpu is "", not a name' + FIX),
    ([json.dumps(_line(dnnl_max_cpu_isa=2))], r'line 1: dnnl_max_cpu_isa is 2, not a name' + FIX),
    (['[1, 2]'], r'line 1: not a JSON object' + FIX),
    (['{"seed": 0, "step": "trainer.step(batch_size)"}'], r'line 1: it lacks devices' + FIX),
])
def test_a_bad_record_line_is_one_error_naming_the_line(tmp_path, lines, message):
    path = str(tmp_path / 'rec.jsonl')
    _write(path, raw=lines)
    with pytest.raises(book_records.RecordError, match=message):
        book_records.read_records(path)


def test_a_record_holds_the_runs_of_one_step(tmp_path):
    path = str(tmp_path / 'rec.jsonl')
    old = _line()
    del old['step']  # written before the book's step: trainer.step(X.shape[0])
    _write(path, _line(), old)
    with pytest.raises(book_records.RecordError) as e:
        book_records.read_records(path)
    assert str(e.value) == (
        '%s, line 2: trained with trainer.step(X.shape[0]), not trainer.step(batch_size); a '
        'record holds the runs of one step only: keep the line in a record of its own (the old '
        "step's are in docs/records/book-table-old-step.jsonl)" % path)
    _write(path, old, old)
    assert book_records.read_records(path, step='trainer.step(X.shape[0])') == [old]
    # The committed records: the old step's 27 epochs apart from the book's step's.
    assert len(book_records.read_records(book_records.OLD_STEP_RECORD,
                                         step='trainer.step(X.shape[0])')) == 27
    assert all(r['step'] == 'trainer.step(batch_size)'
               for r in book_records.read_records(book_records.DEFAULT_RECORD))


def test_the_record_is_never_written_through_a_link_or_to_a_fifo(tmp_path):
    target = tmp_path / 'not-ours.txt'
    target.write_text('keep\n')
    link = tmp_path / 'rec.jsonl'
    link.symlink_to(target)
    with pytest.raises(book_table.CommandError,
                       match='cannot append to the record .*rec.jsonl: .*symbolic link'):
        book_table.append_record(str(link), _line())
    assert target.read_text() == 'keep\n'
    fifo = tmp_path / 'fifo.jsonl'
    os.mkfifo(fifo)
    with pytest.raises(book_records.RecordError, match='fifo.jsonl is a FIFO'):
        book_records.read_records(str(fifo))


def test_summarize():
    assert book_records.summarize([]) is None
    assert book_records.summarize([0.5, 0.25, 1.0]) == {'n': 3, 'mean': 0.5833333333333334,
                                                        'low': 0.25, 'high': 1.0}


def test_the_runner_looks_up_each_epoch_so_a_deleted_line_is_made_again(tmp_path,
                                                                         monkeypatch):
    """The repair a record error advises (delete the line) trains that epoch again, once."""
    trained = []

    def train(run, directory, epoch, work_dir, device, data_dir):
        os.makedirs(directory, exist_ok=True)
        for e in range(1, epoch + 1):  # the train command leaves a checkpoint per epoch
            open(os.path.join(directory, 'epoch-%04d.json' % e), 'w').close()
        trained.append((os.path.basename(directory), epoch))

    def diagnosed(run, directory, epoch, record_path, devices, data_dir):
        line = _line(devices=run.devices, seed=run.seed, epoch=epoch,
                     acc_running=[0.5] * run.devices, test_acc=0.5 + epoch / 100)
        book_table.append_record(record_path, line)
        return line

    checked = []  # each checkpoint found is checked to be the run's before it is used
    monkeypatch.setattr(book_table, '_train', train)
    monkeypatch.setattr(book_table, '_diagnosed', diagnosed)
    monkeypatch.setattr(book_table, 'check_run_folder',
                        lambda run, directory, epoch, data_dir: checked.append(epoch))
    record, work = str(tmp_path / 'rec.jsonl'), str(tmp_path / 'work')
    runs = [book_table.Run(2, 0, 0, 3, None, None)]
    book_table.run_table(runs, work, record, [mx.cpu(0), mx.cpu(1)])
    assert trained == [('2dev-seed0', 1), ('2dev-seed0', 2), ('2dev-seed0', 3)]
    lines = open(record).read().splitlines()
    # The advised repair: the line of epoch 2 deleted, and a stray line beyond the run's epochs.
    _write(record, raw=[lines[0], lines[2], json.dumps(_line(epoch=9, acc_running=[0.5, 0.5]))])
    book_table.run_table(runs, work, record, [mx.cpu(0), mx.cpu(1)])
    assert trained[3:] == []  # epoch 2's checkpoint is there: diagnosed, not trained
    assert checked == [1, 2, 2]  # epochs 2 and 3 resumed from 1 and 2, then 2 diagnosed
    epochs = [r['epoch'] for r in book_records.read_records(record)]
    assert sorted(epochs) == [1, 2, 3, 9] and len(epochs) == 4
    # Without its checkpoint, an epoch whose later ones exist is trained again from the start.
    os.remove(os.path.join(work, '2dev-seed0', 'epoch-0002.json'))
    _write(record, raw=open(record).read().splitlines()[:2])  # epochs 1 and 3
    book_table.run_table(runs, work, record, [mx.cpu(0), mx.cpu(1)])
    assert trained[3:] == [('2dev-seed0-again', 2)]
    assert sorted(r['epoch'] for r in book_records.read_records(record)) == [1, 2, 3]
    # The seconds' mean and the table see epochs 1-4 only.
    table = book_records.table_records([_line(epoch=9)], 2)
    assert table == {}


def _script(*args, **kwargs):
    return subprocess.Popen([sys.executable, os.path.join(ROOT, 'lab', 'book_table.py'),
                             *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            **kwargs)


@pytest.mark.slow
def test_full_run_is_recorded_per_epoch_and_resumes_after_sigterm(tmp_path, data_dir):
    """A stopped run keeps its finished epochs and continues where it was."""
    record, work = str(tmp_path / 'rec.jsonl'), str(tmp_path / 'work')
    args = ('--seeds', '0', '--epochs', '2', '--train-limit', '256', '--test-limit', '128',
            '--record', record, '--work-dir', work, '--data-dir', data_dir)
    first = _script(*args)
    deadline = time.time() + 600
    while not (os.path.exists(record) and open(record).read().count('\n') == 1):
        assert first.poll() is None, first.communicate()
        assert time.time() < deadline
        time.sleep(1)
    first.send_signal(signal.SIGTERM)
    out, err = first.communicate(timeout=300)
    assert first.returncode == 143, err
    assert err.splitlines()[-1] == (
        'lab/book_table.py: terminated (SIGTERM); the finished epochs are recorded, '
        'give the same command again to continue')
    [kept] = open(record).read().splitlines()

    # Continued with one thread and oneDNN capped at AVX2: float32 results depend on both (the
    # page measured it), so each line says what its epoch was trained with.
    second = _script(*args, env=dict(os.environ, OMP_NUM_THREADS='1', DNNL_MAX_CPU_ISA='AVX2'))
    out, err = second.communicate(timeout=1200)
    assert second.returncode == 0, err
    lines = open(record).read().splitlines()
    assert lines[0] == kept
    records = book_records.read_records(record)
    assert [(r['devices'], r['epoch']) for r in records] == [(2, 1), (2, 2), (1, 1), (1, 2)]
    first_setting = (int(os.environ['OMP_NUM_THREADS']), os.environ.get('DNNL_MAX_CPU_ISA'))
    assert [(r['threads'], r['dnnl_max_cpu_isa']) for r in records] == \
        [first_setting] + [(1, 'AVX2')] * 3
    with open('/proc/cpuinfo') as f:
        flags = next(line for line in f if line.startswith('flags')).split()
    assert all(r['cpu_flags'] == [f for f in ('avx2', 'avx512f', 'avx512_bf16', 'amx_bf16')
                                  if f in flags] for r in records)
    import hashlib
    digest = hashlib.sha256()
    for name in ('train-images-idx3-ubyte.gz', 'train-labels-idx1-ubyte.gz',
                 't10k-images-idx3-ubyte.gz', 't10k-labels-idx1-ubyte.gz'):
        with open(os.path.join(data_dir, name), 'rb') as f:
            digest.update(f.read())
    for r in records:
        assert r['train_limit'] == 256 and r['test_limit'] == 128
        assert r['step'] == 'trainer.step(batch_size)'
        assert r['data_sha256'] == digest.hexdigest()  # the line names the data it was run on
        assert r['test_acc'] in {k / 128 for k in range(129)}
        assert len(r['acc_running']) == r['devices']
        if r['devices'] == 1:
            # One device: the train command's accuracy is the book's measure.
            assert r['acc_running'] == [r['test_acc']]
    assert 'book table: 3 of 4 epochs recorded; training 1dev-seed0-limit256x128 epoch 2' in out
    assert out.splitlines()[-1] == ('all 4 epochs recorded in %s; lab/book_table.py '
                                    "--page fills the page's tables"
                                    % os.path.relpath(record, ROOT))
    names = os.listdir(os.path.join(work, '2dev-seed0-limit256x128'))
    assert {'epoch-0001.json', 'epoch-0002.json'} <= set(names)


def test_bad_input_is_one_line_and_exit_2_before_any_run(tmp_path, capsys, data_dir):
    # (A --dtype bfloat16 the CPU cannot train in is the train command's refusal, as in
    # test_input_the_train_command_refuses_is_its_line_and_exit_2.)
    work = tmp_path / 'work'
    argv = ['--data-dir', data_dir, '--work-dir', str(work)]
    bad = tmp_path / 'bad.jsonl'
    bad.write_text('{"seed": -5}\n')
    assert book_table.main(argv + ['--record', str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith('lab/book_table.py: error: %s, line 1: ' % bad)
    assert len(err.splitlines()) == 1
    assert book_table.main(argv + ['--seeds', '-1']) == 2
    assert 'argument --seeds: --seeds must be between 0 and 2147483647, got -1' in \
        capsys.readouterr().err
    # Flags that --tables or --page would ignore, and more epochs than the table has.
    for extra, message in ((['--tables', '--seeds', '1'], '--tables --seeds: --tables trains '
                            'nothing, so --seeds would be ignored; leave --seeds out'),
                           (['--page', '--epochs', '2'], '--page --epochs: --page trains '
                            'nothing, so --epochs would be ignored; leave --epochs out'),
                           (['--epochs', '5'], 'argument --epochs: --epochs must be between 1 '
                            'and 4, got 5; for example --epochs 4 (see --help)'),
                           (['--work-dir', ''], "argument --work-dir: --work-dir expects a "
                            "folder, got ''; for example --work-dir ~/book-table (see --help)")):
        assert book_table.main(['--data-dir', data_dir] + extra) == 2
        assert capsys.readouterr().err == 'lab/book_table.py: error: %s\n' % message
    # A log in the work folder that is not ours: refused before any run, and left as it is.
    logs = work / 'logs'
    logs.mkdir(parents=True, exist_ok=True)
    (logs / '2dev-seed0.log').symlink_to(tmp_path / 'not-ours.txt')
    assert book_table.main(argv + ['--record', str(tmp_path / 'c.jsonl')]) == 2
    err = capsys.readouterr().err
    assert err.startswith('lab/book_table.py: error: --work-dir %s: %s ' % (
        work, logs / '2dev-seed0.log')) and 'symbolic link' in err, err
    assert not (tmp_path / 'not-ours.txt').exists() and not (tmp_path / 'c.jsonl').exists()


def test_a_short_write_leaves_the_record_as_it_was(tmp_path):
    path = tmp_path / 'rec.jsonl'
    _write(str(path), _line())
    kept = path.read_bytes()
    # A file size limit lets the line's write stop short, as a full disk would.
    code = ('import resource, signal, sys; sys.path.insert(0, %r); import book_table, json; '
            'signal.signal(signal.SIGXFSZ, signal.SIG_IGN); '
            'resource.setrlimit(resource.RLIMIT_FSIZE, (%d, %d)); '
            'book_table.append_record(%r, json.loads(%r))'
            % (os.path.join(ROOT, 'lab'), len(kept) + 100, len(kept) + 100, str(path),
               json.dumps(_line(epoch=2))))
    done = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1].endswith(
        "cannot append to the record %s: only 100 of the line's %d bytes could be written; the "
        "record is left as it was" % (path, len(json.dumps(_line(epoch=2), sort_keys=True)) + 1))
    assert path.read_bytes() == kept


def test_a_line_with_other_settings_than_the_books_is_refused(tmp_path):
    path = str(tmp_path / 'rec.jsonl')
    _write(path, _line(batch_size=7, lr=5.0))
    with pytest.raises(book_records.RecordError, match=(
            r"line 1: batch_size 7 and lr 5.0 are not the book's for 2 devices \(512 and 0.2\)"
            + FIX)):
        book_records.read_records(path)


def test_a_checkpoint_of_another_run_is_refused_before_it_is_used(tmp_path, data_dir):
    run = book_table.Run(1, 0, 0, 1, 64, 32)
    folder = str(tmp_path / run.name)
    argv = book_table.train_argv(run, folder, 1, False, 'cpu', data_dir)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert book_table.check_run_folder(run, folder, 1) is None
    # Issue 45: the same run's checkpoint, but trained on other files than this run reads.
    other = tmp_path / 'other-data'
    other.mkdir()
    for name in os.listdir(data_dir):
        with open(os.path.join(data_dir, name), 'rb') as f:
            (other / name).write_bytes(f.read())
    assert book_table.check_run_folder(run, folder, 1, str(other)) is None  # the same files
    (other / 't10k-labels-idx1-ubyte.gz').write_bytes(b'changed')
    with pytest.raises(CheckpointError) as e:
        book_table.check_run_folder(run, folder, 1, str(other))
    assert str(e.value) == (
        '%s holds a run trained on the data in %s, whose files differ from those this run reads '
        '(%s); pass --data-dir %s, or move that folder away or pass another --work-dir'
        % (folder, data_dir, other, data_dir))
    with pytest.raises(CheckpointError) as e:
        book_table.check_run_folder(run._replace(seed=1), folder, 1)
    assert str(e.value) == (
        "%s holds a run with other settings than 1dev-seed1-limit64x32: --seed 0 (the table's "
        "run: 1); move that folder away or pass another --work-dir" % folder)
    with pytest.raises(CheckpointError, match=r'--batch-size 256 \(the table.s run: 512\), '
                                              r'--lr 0.1 \(the table.s run: 0.2\), --num-gpus 1'):
        book_table.check_run_folder(run._replace(devices=2), folder, 1)
    # A command line no run records (argparse would print the help and exit 0).
    path = os.path.join(folder, 'epoch-0001.json')  # docs/checkpoints.md
    record = json.load(open(path))
    record['argv'] = ['--help']
    with open(path, 'w') as f:
        json.dump(record, f)
    with pytest.raises(CheckpointError, match='argv holds "--help", which is not a setting a run '
                                              'records'):
        book_table.check_run_folder(run, folder, 1)
    # A checkpoint of an older format (the table's runs made at 9bf9b9a are format 3): the fix
    # names this script's flag, not the train command's.
    record['format'] = 'gluon_mgpu checkpoint 3'
    with open(path, 'w') as f:
        json.dump(record, f)
    with pytest.raises(CheckpointError) as e:
        book_table.check_run_folder(run, folder, 1)
    assert str(e.value) == (
        '%s was written by an older gluon_mgpu (format 3, with an optimizer state file); start a '
        'new run with another --work-dir, or resume it with gluon_mgpu at commit 452e568' % path)


# The diagnosis: BatchNorm statistics at test time.

@pytest.fixture(scope='module')
def real_batch():
    train_iter, _ = load_data_fashion_mnist(32, train_limit=32, test_limit=1, shuffle=False)
    return next(iter(train_iter))


@pytest.fixture
def net_and_batch(two_cpus, real_batch):
    mx.random.seed(4)
    net = new_network('resnet18', hybridize=False)
    net.initialize(init.Normal(sigma=0.01), ctx=two_cpus)
    X = real_batch[0][:32]
    for d in two_cpus:
        net(X[:1].as_in_context(d))
    return net, X


def test_the_chapters_resnet18_has_17_batch_norm_layers(net_and_batch):
    assert len(book_table.batch_norm_layers(net_and_batch[0])) == 17


def test_reestimated_statistics_are_the_batchs_own(net_and_batch, two_cpus):
    net, X = net_and_batch
    with autograd.train_mode():
        batch_mode = net(X.as_in_context(two_cpus[0]))
    before = net(X.as_in_context(two_cpus[0]))
    assert max_abs_diff(before, batch_mode) > 0.1  # fresh running statistics: 0 and 1
    layers = book_table.batch_norm_layers(net)
    other = [l.running_mean.data(two_cpus[1]).copy() for l in layers]
    weights = [p.data(two_cpus[0]).copy() for p in net.collect_params().values()
               if p.grad_req != 'null']
    book_table.reestimate_running_stats(net, X, two_cpus[0])
    # Predict mode now normalizes with the batch's statistics: the same outputs as train mode.
    assert max_abs_diff(net(X.as_in_context(two_cpus[0])), batch_mode) <= 1e-5
    assert [l._kwargs['momentum'] for l in layers] == [0.9] * 17
    first = layers[0].running_mean.data(two_cpus[0]).asnumpy()
    stem = net[0](X.as_in_context(two_cpus[0])).asnumpy()
    assert np.allclose(first, stem.mean(axis=(0, 2, 3)), atol=1e-6)
    # Device 1's copies and every weight stay as they were.
    for layer, kept in zip(layers, other):
        assert max_abs_diff(layer.running_mean.data(two_cpus[1]), kept) == 0.0
    trained = [p for p in net.collect_params().values() if p.grad_req != 'null']
    assert all(max_abs_diff(p.data(two_cpus[0]), w) == 0.0 for p, w in zip(trained, weights))


def test_reestimating_refuses_a_hybridized_network_or_one_without_batch_norm(two_cpus):
    net = new_network('resnet18')
    with pytest.raises(ValueError, match='is hybridized, so its BatchNorm momentum cannot '
                                         'change; pass a network that is not'):
        book_table.reestimate_running_stats(net, nd.zeros((2, 1, 28, 28)), two_cpus[0])
    with pytest.raises(ValueError, match='holds no nn.BatchNorm'):
        book_table.reestimate_running_stats(new_network('lenet', hybridize=False),
                                            nd.zeros((2, 1, 28, 28)), two_cpus[0])


def test_batch_statistics_accuracy_counts_train_mode_predictions(net_and_batch, two_cpus,
                                                                  real_batch):
    net, _ = net_and_batch
    X, y = real_batch[0][:20], real_batch[1][:20]
    batches = [(X[:10], y[:10]), (X[10:], y[10:])]
    expected = 0
    for Xb, yb in batches:
        with autograd.train_mode():
            out = net(Xb.as_in_context(two_cpus[0]))
        expected += int((out.argmax(axis=1).asnumpy() == yb.asnumpy()).sum())
    assert book_table.evaluate_with_batch_stats(batches, net, two_cpus[0]) == expected / 20
    with pytest.raises(ValueError, match='yielded no examples'):
        book_table.evaluate_with_batch_stats([], net, two_cpus[0])


# The page's tables.

def _record(devices, seed, epoch, acc, warmup=0, precise=None, batch=None):
    return _line(devices=devices, seed=seed, epoch=epoch, warmup_steps=warmup, test_acc=acc,
                 acc_running=[acc] + [acc + 0.01] * (devices - 1),
                 acc_precise_bn=acc + 0.2 if precise is None else precise,
                 acc_batch_stats=acc + 0.25 if batch is None else batch, train_acc=0.5)


def test_diagnosis_rows_normalize_the_test_accuracy_three_ways():
    records = [_record(2, s, 1, acc, precise=acc + 0.3, batch=acc + 0.31)
               for s, acc in enumerate((0.40, 0.50))]
    records += [_record(2, 0, 1, 0.60, warmup=50, precise=0.70, batch=0.72)]
    rows = book_table.diagnosis_rows(records, warmup_steps=[50])
    assert [(r['setting'], r['epoch'], r['seeds']) for r in rows] == [
        ('2 devices', 1, [0, 1]), ('2 devices, warmup 50 steps', 1, [0])]
    assert rows[0]['running0'] == {'n': 2, 'mean': pytest.approx(0.45), 'low': 0.40,
                                   'high': 0.50}
    assert rows[0]['running_other']['mean'] == pytest.approx(0.46)
    assert rows[0]['precise']['mean'] == pytest.approx(0.75)
    assert book_table.format_diagnosis(rows)[1] == [
        '2 devices', '1', '0 1', '0.77', '0.450 (0.400-0.500)', '0.460 (0.410-0.510)',
        '0.750 (0.700-0.800)', '0.760 (0.710-0.810)', '0.500 (0.500-0.500)']


def test_old_step_cells_put_each_seed_beside_its_old_run():
    old = [_record(2, s, 1, acc, precise=0.6) for s, acc in enumerate((0.28, 0.49, 0.57))]
    new = [_record(2, s, 1, acc, precise=0.7) for s, acc in enumerate((0.78, 0.79))]
    lines = book_table.old_step_cells(new, old)
    assert lines[0][:3] == ['setting', 'epoch', "old step: device 0 (book's measure)"]
    # Seeds 0 and 1 in both: (0.78 - 0.28 + 0.79 - 0.49) / 2.
    assert lines[1:] == [['2 devices', '1', '0.447 (0.280-0.570)', '0.785 (0.780-0.790)',
                          '+0.400 (2 seeds)', '0.600 (0.600-0.600)', '0.700 (0.700-0.700)',
                          '+0.100 (2 seeds)']]


def test_the_bfloat16_rows_judge_each_seed_against_float32s_spread():
    def line(devices, seed, acc, dtype=None):
        # precise BatchNorm 0.1 above the running statistics, train_acc 0.2 above
        r = _line(devices=devices, seed=seed, acc_running=[acc] * devices,
                  acc_precise_bn=acc + 0.1, train_acc=acc + 0.2)
        return dict(r, dtype=dtype) if dtype else r
    book = [line(2, 0, 0.49), line(2, 1, 0.57), line(2, 2, 0.53), line(1, 0, 0.76)]
    bf16 = [line(2, 0, 0.51, 'bfloat16'), line(2, 1, 0.91, 'bfloat16'),
            line(1, 0, 0.6, 'bfloat16')]
    rows = book_table.dtype_rows(book, bf16)
    assert rows[0][2:4] == ['measure', 'float32']
    assert rows[1] == ['2 devices', '1', "device 0 running stats (book's)",
                       'mean 0.53 (0.49-0.57, 3 seeds)', 'mean 0.71 (0.51-0.91, 2 seeds)',
                       '+0.180 (2 seeds)',
                       # 0.53 +- t(2) 4.303 * s 0.04 * sqrt(1 + 1/3): 0.33 to 0.73
                       "1 of 2 inside float32's 95% prediction interval 0.33 to 0.73"]
    assert rows[4][-1] == 'not judged: float32 has 1 seed so far'
    assert book_table.dtype_rows(book, []) == rows[:1]


def test_update_page_fills_the_blocks_and_keeps_the_prose():
    page = ('# Title\n\nprose\n<!-- begin compare: a -->\nold\n<!-- end compare: a -->\n'
            'more prose\n<!-- begin compare: b -->\n<!-- end compare: b -->\n')
    new = book_table.update_page(page, {'a': '| x |', 'b': 'B\nB'})
    assert new == ('# Title\n\nprose\n<!-- begin compare: a -->\n| x |\n<!-- end compare: a '
                   '-->\nmore prose\n<!-- begin compare: b -->\nB\nB\n<!-- end compare: b -->\n')
    assert book_table.read_blocks(new) == {'a': '| x |', 'b': 'B\nB'}
    assert book_table.update_page(new, {}) == new
    with pytest.raises(ValueError, match='holds no "<!-- begin compare: NAME -->" block'):
        book_table.update_page('# a page of mine\n', {'a': 'A'})
    # Issue 45: a block the page lost (a renamed marker) is an error, not a table left stale.
    with pytest.raises(ValueError) as e:
        book_table.update_page(page, {'a': '| x |', 'c': 'C'})
    assert str(e.value) == ('it holds no block "<!-- begin compare: c -->" ... "<!-- end compare: '
                            'c -->", so that table would not be updated')


def test_fill_notebook_table_keeps_the_rows_titles():
    source = 'text\n\n| | e1 | e2 |\n|---|---|---|\n| book | | |\n| ours | x | y |\nmore'
    assert book_table.fill_notebook_table(source, [['0.86', '0.91'], ['-', '0.90 (0.89-0.91)']]) \
        == ('text\n\n| | e1 | e2 |\n|---|---|---|\n| book | 0.86 | 0.91 |\n| ours | - | 0.90 '
            '(0.89-0.91) |\nmore')
    with pytest.raises(ValueError, match="the notebook's table has 2 rows, the records give 1"):
        book_table.fill_notebook_table(source, [['a', 'b']])


def test_fill_notebook_legend_replaces_the_lines_between_its_markers():
    source = 'text\n<!-- begin machines -->\n- old\n<!-- end machines -->\nmore'
    assert book_table.fill_notebook_legend(source, ['- A: one', '- B: two']) == (
        'text\n<!-- begin machines -->\n- A: one\n- B: two\n<!-- end machines -->\nmore')
    with pytest.raises(ValueError) as e:
        book_table.fill_notebook_legend('text\n- A: one\n', ['- A: one'])
    assert str(e.value) == ('its book-table cell holds no "<!-- begin machines -->" ... "<!-- end '
                            'machines -->" lines, so the legend of the machines would not be '
                            'written')


def _page_copies(tmp_path, monkeypatch):
    """Copies of the page and both notebooks in ``tmp_path``, which book_table then fills."""
    import shutil
    page = tmp_path / 'book-comparison.md'
    shutil.copy(book_table.PAGE, page)
    notebooks = {lang: str(tmp_path / os.path.basename(path))
                 for lang, path in book_table.NOTEBOOKS.items()}
    for lang, path in notebooks.items():
        shutil.copy(book_table.NOTEBOOKS[lang], path)
    monkeypatch.setattr(book_table, 'PAGE', str(page))
    monkeypatch.setattr(book_table, 'NOTEBOOKS', notebooks)
    monkeypatch.setattr(book_table, 'FIGURE', str(tmp_path / 'book-accuracy.png'))
    monkeypatch.setattr(book_table, 'ROOT', str(tmp_path))
    return page, notebooks


def _refused(paths):
    """The ``PageError`` text of ``book_table.write_page(tables_only=True)``, once it is checked
    that none of ``paths`` changed."""
    before = {p: open(p, 'rb').read() for p in map(str, paths)}
    with pytest.raises(book_table.PageError) as e:
        book_table.write_page([mx.cpu(0), mx.cpu(1)], tables_only=True)
    assert {p: open(p, 'rb').read() for p in before} == before
    return str(e.value)


@pytest.mark.parametrize('empty', [False, True])
def test_tables_from_a_record_that_is_missing_or_empty_are_refused_and_nothing_changes(
        tmp_path, monkeypatch, capsys, empty):
    page, notebooks = _page_copies(tmp_path, monkeypatch)
    record = tmp_path / 'mine.jsonl'
    if empty:
        record.write_text('')
    before = {p: open(p, 'rb').read() for p in [str(page)] + list(notebooks.values())}
    assert book_table.main(['--tables', '--record', str(record)]) == 2
    assert capsys.readouterr().err == (
        'lab/book_table.py: error: %s %s; the tables are made of the epochs a record holds: '
        'pass --record with one that book_table.py trained into\n'
        % (record, 'holds no line' if empty else 'does not exist'))
    assert {p: open(p, 'rb').read() for p in before} == before
    assert not os.path.exists(book_table.FIGURE)


def test_a_page_or_notebook_that_cannot_be_filled_leaves_every_file_as_it_was(tmp_path,
                                                                               monkeypatch):
    page, notebooks = _page_copies(tmp_path, monkeypatch)
    devices = [mx.cpu(0), mx.cpu(1)]
    # The committed files: filled again, byte for byte the same (main's tests check the tables).
    book_table.write_page(devices, tables_only=True)
    assert page.read_bytes() == open(os.path.join(ROOT, 'docs', 'book-comparison.md'),
                                     'rb').read()
    for lang, path in notebooks.items():
        assert open(path, 'rb').read() == open(os.path.join(
            ROOT, 'notebooks', os.path.basename(path)), 'rb').read()
    # The Chinese notebook's table cell has lost its tag: nothing is written, one line says so.
    zh = json.load(open(notebooks['zh']))
    for cell in zh['cells']:
        cell['metadata'].pop('tags', None)
    with open(notebooks['zh'], 'w') as f:
        json.dump(zh, f)
    page.write_text(page.read_text().replace('| 1 device | 1 | 0.86 |', '| 1 device | 1 | 0.80 |'))
    assert _refused([page] + list(notebooks.values())) == (
        'multiple-gpus-gluon.zh.ipynb: it holds 0 cells tagged book-table, not one; its tables '
        'are filled in place, so restore it (git checkout -- multiple-gpus-gluon.zh.ipynb) and '
        'run this again; no file was written')


def test_46_a_record_of_one_machine_makes_tables_whose_values_all_name_it(tmp_path,
                                                                           monkeypatch, capsys,
                                                                           data_dir):
    # What a reader who reproduces the table on one machine runs: --tables --record theirs.
    page, notebooks = _page_copies(tmp_path, monkeypatch)
    mine = tmp_path / 'mine.jsonl'
    machine = dict(cpu='Some CPU', cpu_flags=['avx2'], dnnl_max_cpu_isa=None, threads=2,
                   recorded='2026-12-01T08:00:00Z')
    _write(str(mine), *[dict(_record(n, s, e, 0.6 + 0.01 * s + 0.02 * e), batch_size=256 * n,
                             lr=0.1 * n, **machine)
                        for n in (2, 1) for e in (1, 2) for s in (0, 1, 2)])
    assert book_table.main(['--tables', '--record', str(mine), '--data-dir', data_dir]) == 0
    blocks = book_table.read_blocks(page.read_text())
    assert blocks['machines'].split('\n')[2:] == [
        '| A | Some CPU | AVX2 (avx2; no DNNL_MAX_CPU_ISA cap) | OMP_NUM_THREADS=2 | 1 device, '
        'seeds 0 1 2, epochs 1-2; 2 devices, seeds 0 1 2, epochs 1-2 | 2026-12-01 |']
    rows = [line.split(' | ') for line in blocks['accuracy'].split('\n')[2:]]
    assert [row[7] for row in rows] == ['s0 0.620 A, s1 0.630 A, s2 0.640 A',
                                        's0 0.640 A, s1 0.650 A, s2 0.660 A', '-', '-'] * 2
    for lang, path in notebooks.items():
        [cell] = [c for c in json.load(open(path))['cells']
                  if 'book-table' in c['metadata'].get('tags', [])]
        text = ''.join(cell['source'])
        legend = text.split('<!-- begin machines -->\n')[1].split('<!-- end machines -->')[0]
        assert legend == {
            'en': '- A: Some CPU; oneDNN kernels: AVX2 (avx2; no DNNL_MAX_CPU_ISA cap); threads: '
                  'OMP_NUM_THREADS=2; 1 device, seeds 0 1 2, epochs 1-2; 2 devices, seeds 0 1 '
                  '2, epochs 1-2; recorded 2026-12-01\n',
            'zh': '- A：Some CPU；oneDNN 内核：AVX2（avx2；未设 DNNL_MAX_CPU_ISA 上限）；线程：'
                  'OMP_NUM_THREADS=2；1 个设备，随机种子 0 1 2，第 1-2 个迭代周期；2 个设备，随机种子 0 1 '
                  '2，第 1-2 个迭代周期；记录于 2026-12-01\n'}[lang]
        assert '| s0 0.620 A, s1 0.630 A, s2 0.640 A | s0 0.640 A, s1 0.650 A, s2 0.660 A | - | - |' \
            in text
    # The figure plots the same values, each with the machine that made it.
    import book_figure
    drawn = book_figure.read_data(book_table.FIGURE)
    assert drawn['machines'] == [['A', 'ours, machine A: Some CPU, AVX2 kernels, 2 threads']]
    assert [[[s, round(a, 3), k] for s, a, k in e['ours']] for p in drawn['panels']
            for e in p['epochs']] == [
        [[0, 0.62, 'A'], [1, 0.63, 'A'], [2, 0.64, 'A']],
        [[0, 0.64, 'A'], [1, 0.65, 'A'], [2, 0.66, 'A']], [], []] * 2
    assert capsys.readouterr().out.splitlines()[-4:] == [
        'wrote book-comparison.md', 'wrote multiple-gpus-gluon.ipynb',
        'wrote multiple-gpus-gluon.zh.ipynb', 'wrote book-accuracy.png']


def test_45_8_a_linked_notebook_or_a_renamed_marker_writes_no_file(tmp_path, monkeypatch):
    page, notebooks = _page_copies(tmp_path, monkeypatch)
    page.write_text(page.read_text().replace('| 1 device | 1 | 0.86 |', '| 1 device | 1 | 0.80 |'))
    real = str(tmp_path / 'elsewhere.ipynb')
    os.rename(notebooks['zh'], real)
    os.symlink(real, notebooks['zh'])
    assert _refused([page, notebooks['en'], real]) == (
        'multiple-gpus-gluon.zh.ipynb: it is a symbolic link (to %s), which would be replaced; '
        'name the file it points to, or a new path; its tables are filled in place, so restore it '
        '(git checkout -- multiple-gpus-gluon.zh.ipynb) and run this again; no file was written'
        % real)  # and the page, which is written first, is as it was
    os.remove(notebooks['zh'])
    os.rename(real, notebooks['zh'])
    page.write_text(page.read_text().replace('begin compare: accuracy', 'begin compare: acc'))
    assert _refused([page] + list(notebooks.values())) == (
        'book-comparison.md: it holds no block "<!-- begin compare: accuracy -->" ... "<!-- end '
        'compare: accuracy -->", so that table would not be updated; its tables are filled in '
        'place, so restore it (git checkout -- book-comparison.md) and run this again; no file '
        'was written')


def test_input_the_train_command_refuses_is_its_line_and_exit_2(tmp_path, capsys, data_dir):
    assert book_table.main(['--data-dir', data_dir, '--seeds', '0', '--epochs', '1',
                            '--train-limit', '70000', '--record', str(tmp_path / 'r.jsonl'),
                            '--work-dir', str(tmp_path / 'work')]) == 2
    err = capsys.readouterr().err
    log = tmp_path / 'work' / 'logs' / '2dev-seed0-limit70000xall.log'
    assert err.startswith('lab/book_table.py: error: the train command of '
                          '2dev-seed0-limit70000xall refused its input: python -m '
                          'gluon_mgpu.train: error: '), err
    assert err.endswith(' (its output is in %s)\n' % log) and '70000' in err
    assert len(err.splitlines()) == 1 and not (tmp_path / 'r.jsonl').exists()


def test_a_record_line_names_the_kernels_cap_and_threads_from_the_childs_environment():
    from measuring import kernel_setting
    capped = kernel_setting({'DNNL_MAX_CPU_ISA': 'AVX2', 'OMP_NUM_THREADS': '3'})
    assert (capped['dnnl_max_cpu_isa'], capped['threads']) == ('AVX2', 3)
    assert [kernel_setting({'OMP_NUM_THREADS': t})['threads'] for t in ('two', '\u00b2', '')] \
        == [None] * 3
    assert kernel_setting({}) == dict(capped, dnnl_max_cpu_isa=None, threads=None)


def test_the_time_left_counts_the_epochs_each_run_must_train_from_its_last_checkpoint(tmp_path):
    # Epochs 1-3 recorded elsewhere, no checkpoint: epoch 4 trains all four. A checkpoint of
    # epoch 2 leaves two; one of epoch 4 none (it is only diagnosed); a warmup run its one.
    runs = [book_table.Run(1, s, 0, 4, None, None) for s in (0, 1, 2)]
    runs.append(book_table.Run(2, 0, 50, 1, None, None))
    plan = [(run, e) for run in runs for e in range(1, run.epochs + 1)]
    records = [dict(devices=1, seed=s, warmup_steps=0, epoch=e) for s in (0, 1, 2)
               for e in (1, 2, 3)]
    assert book_table._epochs_to_train(plan, records, str(tmp_path)) == 4 + 4 + 4 + 1
    for seed, epoch in [(1, 2), (2, 4)]:
        os.makedirs(tmp_path / runs[seed].name)
        (tmp_path / runs[seed].name / ('epoch-%04d.json' % epoch)).write_text('{}')
    assert book_table._epochs_to_train(plan, records, str(tmp_path)) == 4 + 2 + 0 + 1
    records.append(dict(devices=2, seed=0, warmup_steps=50, epoch=1))
    assert book_table._epochs_to_train(plan, records, str(tmp_path)) == 4 + 2 + 0


def test_the_first_estimate_takes_its_seconds_from_this_processors_records():
    # One machine's epochs took 4x the other's: before it has timed an epoch, the runner
    # estimates from the records made on its own processor, if any.
    records = [dict(cpu='AMD EPYC', seconds=2400.0), dict(cpu='AMD EPYC', seconds=2600.0),
               dict(cpu='Intel Xeon', seconds=700.0), dict(seconds=100.0)]
    assert book_table._seconds_per_epoch([], records, 'Intel Xeon') == 700.0
    assert book_table._seconds_per_epoch([], records, 'AMD EPYC') == 2500.0
    assert book_table._seconds_per_epoch([], records, 'Apple M2') == 1450.0  # none of its own
    assert book_table._seconds_per_epoch([300.0, 500.0], records, 'Intel Xeon') == 400.0  # timed
    assert book_table._seconds_per_epoch([], [], 'Intel Xeon') is None


def test_45_8_a_second_runner_waits_for_the_first_and_trains_nothing_twice(tmp_path,
                                                                          monkeypatch):
    import fcntl
    import threading
    trained, said = [], []
    record, work = str(tmp_path / 'rec.jsonl'), str(tmp_path / 'work')
    run = book_table.Run(2, 0, 0, 2, None, None)

    def line(epoch):
        return _line(devices=2, seed=0, epoch=epoch, acc_running=[0.5, 0.5],
                     test_acc=0.5 + epoch / 100)

    def train(run, directory, epoch, work_dir, device, data_dir):
        os.makedirs(directory, exist_ok=True)
        for e in range(1, epoch + 1):
            open(os.path.join(directory, 'epoch-%04d.json' % e), 'w').close()
        trained.append(epoch)

    def diagnosed(run, directory, epoch, record_path, devices, data_dir):
        book_table.append_record(record_path, line(epoch))
        return line(epoch)

    monkeypatch.setattr(book_table, '_train', train)
    monkeypatch.setattr(book_table, '_diagnosed', diagnosed)
    monkeypatch.setattr(book_table, 'check_run_folder', lambda *args: None)
    # The first runner holds the run and records its epoch 1, then lets go.
    os.makedirs(os.path.join(work, 'logs'))
    first = open(os.path.join(work, 'logs', '2dev-seed0.runner'), 'w')
    fcntl.flock(first, fcntl.LOCK_EX)

    def first_runner_finishes():
        book_table.append_record(record, line(1))
        first.close()
    timer = threading.Timer(0.5, first_runner_finishes)
    timer.start()
    book_table.run_table([run], work, record, [mx.cpu(0), mx.cpu(1)], progress=said.append,
                         wait_seconds=0.1)
    timer.join()
    assert said[0] == ('waiting: another book_table.py trains or diagnoses 2dev-seed0 (it holds '
                       '%s)' % os.path.join(work, 'logs', '2dev-seed0.runner'))
    assert trained == [2]  # epoch 1 was the first runner's: read from the record, not redone
    assert [r['epoch'] for r in book_records.read_records(record)] == [1, 2]


def test_45_8_a_folder_in_use_names_this_scripts_flag(tmp_path):
    directory = str(tmp_path / 'run')
    code = ('import sys, time; from gluon_mgpu import lock_dir; '
            'lock = lock_dir(sys.argv[1]); print("held", flush=True); time.sleep(60)')
    holder = subprocess.Popen([sys.executable, '-c', code, directory], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline() == 'held\n'
        assert book_table._is_locked(directory) == (
            '%s is in use by another run (pid %d); wait for it to end, or pass another --work-dir'
            % (directory, holder.pid))
    finally:
        holder.kill()
        holder.wait()
    assert list_checkpoints(directory) == []


def test_the_committed_pages_tables_of_the_records_are_made_again_byte_for_byte():
    import book_dips
    records = book_records.read_records(book_records.DEFAULT_RECORD)
    old = book_records.read_records(book_records.OLD_STEP_RECORD, step=book_records.OLD_STEP)
    bf16 = book_records.read_records(book_table.DEFAULT_BF16_RECORD)
    with open(os.path.join(ROOT, 'docs', 'book-comparison.md')) as f:
        blocks = book_table.read_blocks(f.read())
    now = book_table.record_blocks(book_table.record_report(
        records, old, bf16, ['cpu(0)', 'cpu(1)'], book_dips.read_other_runs()))
    assert sorted(now) == ['accuracy', 'bf16', 'diagnosis', 'dips', 'dips-1', 'machines',
                           'old-step', 'pooled', 'seconds']
    # Every value of the accuracy table names its line's machine, which the legend describes.
    legend = {m['key']: m for m in book_records.machine_legend(records)}
    for r in book_records.book_cell_records(records):
        [key] = [k for k, m in legend.items()
                 if (m['cpu'], m['kernels'], m['threads']) == book_records.machine_of(r)]
        row = '| %d device%s | %d | ' % (r['devices'], 's' * (r['devices'] > 1), r['epoch'])
        [line] = [l for l in blocks['accuracy'].split('\n') if l.startswith(row)]
        assert 's%d %.3f %s' % (r['seed'], r['acc_running'][0], key) in line, (row, r['seed'])
        assert '| %s | %s | %s | %s |' % (key, *book_records.machine_of(r)) in \
            blocks['machines']
    for name, text in now.items():
        assert blocks[name] == text, name


def test_a_compare_command_that_refuses_its_input_is_its_line_and_bad_input(tmp_path):
    # --page runs python -m gluon_mgpu.compare --json; a refusal (exit 2) is the script's too.
    with pytest.raises(book_table.RunRefused) as e:
        book_table._compared('auto', str(tmp_path))
    assert str(e.value).startswith('python -m gluon_mgpu.compare exited with 2: python -m '
                                   'gluon_mgpu.compare: error: ')
    assert str(tmp_path) in str(e.value) and isinstance(e.value, book_table.UsageError)
