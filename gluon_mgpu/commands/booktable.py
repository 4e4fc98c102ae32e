"""The book's accuracy table at full scale, over several seeds, resumable (``compare --full``):
each epoch is trained, diagnosed and appended as one line to the record, docs/book-table.jsonl
(docs/notebooks.md, "The book, side by side").
"""
import collections
import datetime
import json
import math
import os
import subprocess
import sys
import tempfile
import time

from .. import training
from .env import cpu_model
from ..handlers.checkpoint_names import list_checkpoints
from ..runtime.precision import DTYPES

__all__ = ['Run', 'RUN_EPOCHS', 'PRECISE_BN_IMAGES', 'BATCH_STATS_BATCH', 'plan_runs',
           'RecordError', 'RunFailed', 'read_records', 'append_record', 'record_key',
           'recorded_epochs', 'train_argv', 'diagnose', 'work_dir_problem', 'run_table',
           'summarize']

# The repository: gluon_mgpu/commands/ is two folders below it.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_RECORD = os.path.join(ROOT, 'docs', 'book-table.jsonl')
# The bfloat16 runs (--dtype bfloat16, docs/precision.md): a record of their own, never the book's.
DEFAULT_BF16_RECORD = os.path.join(ROOT, 'docs', 'bf16-table.jsonl')
# The runs trained with the old step (training.OLD_STEP), up to commit 03b47ec: kept apart.
OLD_STEP_RECORD = os.path.join(ROOT, 'docs', 'book-table-old-step.jsonl')
OLD_STEP_BF16_RECORD = os.path.join(ROOT, 'docs', 'bf16-table-old-step.jsonl')
DEFAULT_WORK_DIR = os.path.join(os.path.expanduser('~'), '.cache', 'gluon_mgpu', 'book-table')
RUN_EPOCHS = 4
# The diagnostics' sizes: a few hundred training images re-estimate the statistics; batch
# statistics are taken over test batches of 500.
PRECISE_BN_IMAGES = 512
BATCH_STATS_BATCH = 500


class Run(collections.namedtuple('Run', 'devices seed warmup_steps epochs train_limit '
                                        'test_limit dtype', defaults=('float32',))):
    """One run of the table, with the book's batch and learning rate for ``devices``;
    ``warmup_steps`` 0, limits None and ``dtype`` float32 are the book's."""

    @property
    def name(self):
        name = '%ddev-seed%d' % (self.devices, self.seed)
        if self.warmup_steps:
            name += '-warmup%d' % self.warmup_steps
        if self.train_limit or self.test_limit:
            name += '-limit%sx%s' % (self.train_limit or 'all', self.test_limit or 'all')
        return name + ('-bf16' if self.dtype == 'bfloat16' else '')

    def key(self):
        """The run in the record: everything but the number of epochs."""
        return (self.devices, self.seed, self.warmup_steps, self.train_limit, self.test_limit,
                self.dtype)


def plan_runs(seeds, warmup_steps=0, epochs=RUN_EPOCHS, train_limit=None, test_limit=None,
              dtype='float32'):
    """The runs of the table in training order: 2 devices (where the book and we differ most),
    then with ``warmup_steps`` the warmup runs (2 devices, epoch 1 only), then 1 device."""
    def runs(devices, warmup, epochs):
        return [Run(devices, s, warmup, epochs, train_limit, test_limit, dtype) for s in seeds]
    warmups = runs(2, warmup_steps, 1) if warmup_steps else []
    return runs(2, 0, epochs) + warmups + runs(1, 0, epochs)


class RecordError(ValueError):
    """The record file cannot be used: the message names the file, the line and the fix."""


def _is_whole(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value):
    return _is_whole(value) or isinstance(value, float) and math.isfinite(value)


_WHOLE, _NUMBER, _LIST = ((_is_whole, 'a whole number'), (_is_number, 'a number'),
                          (lambda v: isinstance(v, list), 'a list'))
_FIELDS = {'devices': _WHOLE, 'seed': _WHOLE, 'warmup_steps': _WHOLE, 'epoch': _WHOLE,
           'batch_size': _WHOLE, 'lr': _NUMBER, 'seconds': _NUMBER, 'train_loss': _NUMBER,
           'train_acc': _NUMBER, 'test_acc': _NUMBER, 'acc_running': _LIST,
           'acc_precise_bn': _NUMBER, 'acc_batch_stats': _NUMBER}


def _check_line(record, path, number, step):
    def refuse(what):
        raise RecordError('%s, line %d: %s; fix or delete that line (the epoch is then trained '
                          'again)' % (path, number, what))
    if not isinstance(record, dict):
        refuse('not a JSON object')
    if record.get('step', training.OLD_STEP) != step:
        raise RecordError('%s, line %d: trained with %s, not %s; a record holds the runs of one '
                          'step only: keep the line in a record of its own (the old step\'s are '
                          'in %s)' % (path, number, record.get('step', training.OLD_STEP), step,
                                      os.path.relpath(OLD_STEP_RECORD, ROOT)))
    for name, (test, kind) in _FIELDS.items():
        if name not in record:
            refuse('it lacks %s' % name)
        if not test(record[name]):
            refuse('%s is %r, not %s' % (name, record[name], kind))
    if not (record['devices'] >= 1 and record['epoch'] >= 1 and record['warmup_steps'] >= 0):
        refuse('devices, epoch or warmup_steps out of range')
    accuracies = [record[k] for k in ('train_acc', 'test_acc', 'acc_precise_bn',
                                      'acc_batch_stats')] + record['acc_running']
    if len(record['acc_running']) != record['devices'] or not all(
            _is_number(a) and 0 <= a <= 1 for a in accuracies):
        refuse('an accuracy is not a number from 0 to 1, or acc_running does not hold one per '
               'device')
    for name in ('train_limit', 'test_limit'):
        value = record.get(name)
        if value is not None and not (_is_whole(value) and value >= 1):
            refuse('%s is %r, not a whole number or null' % (name, value))
    if record.get('dtype', 'float32') not in DTYPES:
        refuse('dtype is %r, not %s' % (record['dtype'], ' or '.join('"%s"' % d for d in DTYPES)))


def record_key(record):
    """The ``Run.key()`` of a record line."""
    return (record['devices'], record['seed'], record['warmup_steps'],
            record.get('train_limit'), record.get('test_limit'), record.get('dtype', 'float32'))


def read_records(path, step=training.STEP):
    """Read the record file (JSON, one epoch per line; none if it does not exist); return the
    checked lines as dicts, in order. An epoch recorded twice must carry the same accuracies (a
    retrained run repeats itself bit for bit) and counts once. Every line must have been
    trained with ``step`` (a line without ``step`` was trained with ``training.OLD_STEP``).

    Raises
    ------
    RecordError
        Naming the file, the line and what is wrong.
    """
    from ..runtime.files import InputError, open_input
    try:
        with open_input(path) as f:
            text = f.read().decode('utf-8')
    except InputError as e:
        if e.reason == 'does not exist':
            return []
        raise RecordError('%s %s; pass --record with a regular file' % (path, e.reason)) from None
    except (OSError, UnicodeDecodeError) as e:
        raise RecordError('%s cannot be read (%s); pass --record with a readable file'
                          % (path, getattr(e, 'strerror', None) or e)) from None
    records, seen = [], {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line, parse_constant=lambda c: float('nan'))
        except ValueError as e:
            raise RecordError('%s, line %d: not JSON (%s); fix or delete that line'
                              % (path, number, e)) from None
        _check_line(record, path, number, step)
        key = record_key(record)
        first = seen.setdefault((key, record['epoch']), record)
        if first is record:
            records.append(record)
        elif (first['test_acc'], first['acc_running']) != (record['test_acc'],
                                                            record['acc_running']):
            raise RecordError('%s, line %d: epoch %d of run %s is recorded twice with different '
                              'accuracies (%s, then %s); keep one of the two lines'
                              % (path, number, record['epoch'], Run(*key[:3], None, *key[3:]).name,
                                 first['test_acc'], record['test_acc']))
    return records


def append_record(path, record):
    """Append one line to the record file and flush it to disk.

    Raises
    ------
    files.OutputError
        When the path is not a regular file of ours or the disk refuses the write.
    """
    from ..runtime.files import OutputError, output_problem
    problem = output_problem(path)
    if problem:
        raise OutputError(path, 'cannot append to the record %s: %s' % (path, problem))
    line = json.dumps(record, sort_keys=True, allow_nan=False) + '\n'
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        try:
            os.write(fd, line.encode('utf-8'))
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as e:
        raise OutputError(path, 'cannot append to the record %s: %s' % (
            path, e.strerror or e), e.errno) from None


def recorded_epochs(records, run):
    """The epochs of ``run`` in ``records``, sorted."""
    return sorted(r['epoch'] for r in records if record_key(r) == run.key())


def train_argv(run, directory, epochs, resume, device='auto', data_dir=None):
    """The command that trains ``run`` up to epoch ``epochs`` in checkpoint folder ``directory``."""
    argv = [sys.executable, '-m', 'gluon_mgpu.train', '--num-gpus', str(run.devices),
            '--seed', str(run.seed), '--epochs', str(epochs), '--checkpoint-dir', directory,
            '--device', device]
    if resume:
        argv.append('--resume')
    if run.warmup_steps:
        argv += ['--warmup-steps', str(run.warmup_steps)]
    if run.dtype != 'float32':
        argv += ['--dtype', run.dtype]
    for flag, value in (('--train-limit', run.train_limit), ('--test-limit', run.test_limit),
                        ('--data-dir', data_dir)):
        if value is not None:
            argv += [flag, str(value)]
    return argv


def _restored(directory, record, devices, hybridize):
    """A new ResNet-18 holding checkpoint ``record``'s values on ``devices``, computing in
    the run's dtype."""
    from ..handlers import checkpoint
    dtype = record['args'].get('dtype', 'float32')
    net = training.new_network('resnet18', hybridize=hybridize, dtype=dtype)
    trainer = training.init_training(net, devices, record['args']['lr'], dtype=dtype)
    checkpoint.restore(directory, record, net, trainer, devices)
    return net


def diagnose(directory, epoch, devices, data_dir=None, test_limit=None):
    """Test accuracy of checkpoint ``epoch`` in ``directory``, normalized three ways.

    Returns
    -------
    dict
        ``stats``: the epoch's history entry; ``acc_running``: one accuracy per device with
        its running statistics; ``acc_precise_bn``: device 0's weights with the running
        statistics re-estimated on the first ``PRECISE_BN_IMAGES`` training images;
        ``acc_batch_stats``: batch statistics over test batches of ``BATCH_STATS_BATCH``.
    """
    from mxnet import nd

    from ..handlers import checkpoint
    from .. import data
    from ..tools.bnstats import evaluate_with_batch_stats, reestimate_running_stats
    from ..training import evaluate_accuracy

    record = checkpoint.validate_record(checkpoint.read_checkpoint(directory, epoch),
                                        checkpoint.checkpoint_path(directory, epoch, 'json'))
    test_x, test_y = (a[:test_limit] for a in data.load_fashion_mnist_arrays('test', data_dir))
    test_iter = data.ArrayBatches(test_x, test_y, record['args']['batch_size'])
    stats_iter = data.ArrayBatches(test_x, test_y, BATCH_STATS_BATCH)
    images, _ = data.load_fashion_mnist_arrays('train', data_dir)

    net = _restored(directory, record, devices, hybridize=True)
    acc_running = [evaluate_accuracy(test_iter, net, [d]) for d in devices]
    plain = _restored(directory, record, devices, hybridize=False)
    X = nd.array(data.to_tensor(images[:PRECISE_BN_IMAGES]), dtype='float32')
    reestimate_running_stats(plain, X, devices[0])
    plain.hybridize(static_alloc=True)
    acc_precise = evaluate_accuracy(test_iter, plain, devices[:1])
    acc_batch = evaluate_with_batch_stats(stats_iter, net, devices[0])
    return {'stats': record['history'][epoch - 1], 'acc_running': acc_running,
            'acc_precise_bn': acc_precise, 'acc_batch_stats': acc_batch,
            'precise_bn_images': PRECISE_BN_IMAGES, 'batch_stats_batch': BATCH_STATS_BATCH}


def _commit():
    try:
        # The commit that trained, marked -dirty when the working tree held changes.
        out = subprocess.run(['git', '-C', ROOT, 'describe', '--always', '--abbrev=40',
                              '--dirty'], capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or None if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


class RunFailed(RuntimeError):
    """A run's train command failed; ``exit_code`` is its exit code, the message its log."""

    def __init__(self, message, exit_code):
        super().__init__(message)
        self.exit_code = exit_code


def _is_locked(directory):
    """The refusal of checkpoint folder ``directory``'s lock if another process holds it."""
    from ..handlers.checkpoint import CheckpointError, lock_dir
    if os.path.isdir(directory):
        try:
            lock_dir(directory).release()
        except CheckpointError as e:
            return str(e)
    return None


def work_dir_problem(work_dir):
    """Why ``work_dir`` cannot hold the runs' checkpoints and logs (created if needed), or None."""
    try:
        os.makedirs(os.path.join(work_dir, 'logs'), exist_ok=True)
        with tempfile.TemporaryFile(dir=work_dir):
            pass
    except OSError as e:
        return e.strerror or str(e)
    return None


def child_env():
    """This environment, with the repository first on ``PYTHONPATH`` (for a child process)."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (ROOT, os.environ.get('PYTHONPATH')) if p))


def run_table(runs, work_dir, record_path, devices, device='auto', data_dir=None,
              progress=None, wait_seconds=60):
    """Train and diagnose every epoch of ``runs`` not yet in the record; return the records.

    Resumable at any point (docs/notebooks.md): an epoch counts once its line is in
    ``record_path``; checkpoints in a run's folder (``work_dir/<run name>``) are diagnosed or
    resumed from; a folder another process holds is waited for. ``devices`` diagnose (as many
    as the largest run has); ``progress`` gets a line before each epoch and after each
    diagnosis.

    Raises
    ------
    RunFailed
        When a train command fails; KeyboardInterrupt when stopped.
    """
    say = progress or (lambda line: None)
    os.makedirs(os.path.join(work_dir, 'logs'), exist_ok=True)
    records = read_records(record_path)
    total = sum(r.epochs for r in runs)
    spent = []  # wall seconds of the epochs this call trained: train command and diagnosis
    waiting_for = None
    for run in runs:
        directory = os.path.join(work_dir, run.name)
        while True:
            done = recorded_epochs(records, run)
            if len(done) >= run.epochs:
                break
            # One training at a time: a run another process holds is waited for.
            holder = _is_locked(directory)
            if holder:
                if holder != waiting_for:
                    say('waiting: %s' % holder)
                waiting_for = holder
                time.sleep(wait_seconds)
                continue
            waiting_for = None
            epoch, start = len(done) + 1, time.time()
            trained = epoch not in list_checkpoints(directory)
            if trained:
                recorded = sum(min(len(recorded_epochs(records, r)), r.epochs) for r in runs)
                per_epoch = _seconds_per_epoch(spent, records)
                say('book table: %d of %d epochs recorded; training %s epoch %d%s'
                    % (recorded, total, run.name, epoch, '' if per_epoch is None else
                       ', about %.1f h left at %.0f min per epoch'
                       % ((total - recorded) * per_epoch / 3600, per_epoch / 60)))
                _train(run, directory, epoch, work_dir, device, data_dir)
            records.append(_diagnosed(run, directory, epoch, record_path, devices, data_dir))
            if trained:  # an epoch found trained says nothing of the time left
                spent.append(time.time() - start)
            say(_diagnosis_line(run, records[-1]))
    return records


def _train(run, directory, epoch, work_dir, device, data_dir):
    """Train ``run`` up to ``epoch`` with the train command, from its last checkpoint; its
    output goes to the end of the run's log."""
    argv = train_argv(run, directory, epoch, bool(list_checkpoints(directory)), device, data_dir)
    log_path = os.path.join(work_dir, 'logs', run.name + '.log')
    with open(log_path, 'ab') as log:
        log.write(('\n$ %s\n' % ' '.join(argv)).encode())
        log.flush()
        child = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=child_env(),
                                 cwd=ROOT)
        try:
            code = child.wait()
        except BaseException:
            # Ctrl-C or SIGTERM of this process: the child stops too (it keeps its finished
            # epochs), then the reason goes on.
            child.terminate()
            child.wait()
            raise
    if code in (129, 130, 143):
        raise KeyboardInterrupt('the train command of %s was stopped (exit %d)'
                                % (run.name, code))
    if code != 0:
        raise RunFailed('the train command of %s exited with %d; its output is in %s'
                        % (run.name, code, log_path), code)


def _diagnosed(run, directory, epoch, record_path, devices, data_dir):
    """Diagnose checkpoint ``epoch`` of ``run``; append its line to the record, return it."""
    import mxnet
    found = diagnose(directory, epoch, devices[:run.devices], data_dir, run.test_limit)
    stats = found.pop('stats')
    batch_size, lr = training.book_setting(run.devices)
    record = dict(found, devices=run.devices, seed=run.seed, step=training.STEP,
                  warmup_steps=run.warmup_steps, train_limit=run.train_limit,
                  test_limit=run.test_limit, epoch=epoch, batch_size=batch_size, lr=lr,
                  **{k: stats[k] for k in ('seconds', 'train_loss', 'train_acc', 'test_acc',
                                           'images_per_sec')},
                  device_names=[str(d) for d in devices[:run.devices]],
                  commit=_commit(), mxnet=mxnet.__version__, cpu=cpu_model(),
                  recorded=datetime.datetime.now(datetime.timezone.utc).strftime(
                      '%Y-%m-%dT%H:%M:%SZ'))
    if run.dtype != 'float32':  # the book's lines keep the fields they always had
        record['dtype'] = run.dtype
    append_record(record_path, record)
    return record


def _diagnosis_line(run, record):
    return ('%s epoch %d: test_acc %.4f (device 0: %.4f), precise BatchNorm %.4f, batch '
            'statistics %.4f' % (run.name, record['epoch'], record['test_acc'],
                                 record['acc_running'][0], record['acc_precise_bn'],
                                 record['acc_batch_stats']))


def _seconds_per_epoch(spent, records):
    seconds = spent or [r['seconds'] for r in records]
    return sum(seconds) / len(seconds) if seconds else None


def summarize(values):
    """``{'n', 'mean', 'low', 'high'}`` of a list of numbers (None for an empty list)."""
    if not values:
        return None
    return {'n': len(values), 'mean': sum(values) / len(values), 'low': min(values),
            'high': max(values)}
