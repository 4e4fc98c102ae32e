"""The book's accuracy table at full scale, over several seeds, resumable: this project measuring
itself. Each epoch of each run is trained by ``python -m gluon_mgpu.train`` (one checkpoint
folder per run), diagnosed (the test accuracy with each device's running statistics, with
precise BatchNorm, with batch statistics) and appended as one JSON line to the record,
docs/records/book-table.jsonl; ``--page`` then fills the tables of docs/book-comparison.md and
of both notebooks from the records (the record's reader and the accuracy table made of it are
``book_records.py``) and draws the accuracy table as a picture, docs/figures/book-accuracy.png
(``book_figure.py``). docs/notebooks.md ("The book, side by side") explains it. A line also
names what a float32 result depends on beyond the code and the seed (docs/book-comparison.md
measured it): the CPU, the instruction sets oneDNN could pick (``cpu_flags``), its cap
``DNNL_MAX_CPU_ISA`` and the thread count; lines recorded before 2026-11-27 name the CPU only.
From issue 45 on, a line also names its data: ``data_sha256``, of the four files in order.

    .venv/bin/python lab/book_table.py --seeds 0 1 2 --warmup-steps 50   # 10-20 h, 2 cores
    .venv/bin/python lab/book_table.py --dtype bfloat16 --epochs 1 --seeds 0 1 2
    .venv/bin/python lab/book_table.py --page       # after new record lines (minutes)
    .venv/bin/python lab/book_table.py --tables     # the tables of the records only

Every value of the accuracy table names its run's machine (a key, and a legend of the machines:
the CPU, oneDNN's kernels and the threads). A table of one machine's runs is made the same way
from a record of its own: ``--seeds 0 1 2 --record mine.jsonl``, then ``--tables --record
mine.jsonl``.

Stopped by Ctrl-C, SIGTERM or a reboot, the same command continues where it was: an epoch
counts once its line is in the record; only the epoch in progress is lost.
"""
import argparse
import collections
import contextlib
import datetime
import errno
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, 'lab'))  # book_records, beside this file

import gluon_mgpu  # noqa: E402,F401  (first: it sets the threads MXNet starts with)
from gluon_mgpu import (CheckpointError, CommandError, DataError, DataNotFoundError,  # noqa: E402
                        DeferredInterrupt, Parser, UsageError, atomic_path, book_setting,
                        evaluate_accuracy, find_data_dir, format_devices, get_devices,
                        init_training, list_checkpoints, load_data_fashion_mnist, lock_dir,
                        new_network, open_input, output_problem, read_checkpoint,
                        recorded_settings, resolve, restore, run_command)
import mxnet  # noqa: E402
from mxnet import autograd, nd  # noqa: E402
from mxnet.gluon import nn  # noqa: E402
from measuring import cpu_model, kernel_setting  # noqa: E402
import book_dips  # noqa: E402
import book_figure  # noqa: E402
import book_records  # noqa: E402
from book_records import (RUN_EPOCHS, plural, record_key, summarize,  # noqa: E402
                          table_records)

PROG = 'lab/book_table.py'
DEFAULT_RECORD = book_records.DEFAULT_RECORD
# The bfloat16 runs (--dtype bfloat16, docs/precision.md): a record of their own, never the book's.
DEFAULT_BF16_RECORD = os.path.join(book_records.RECORDS, 'bf16-table.jsonl')
DEFAULT_WORK_DIR = os.path.join(os.path.expanduser('~'), '.cache', 'gluon_mgpu', 'book-table')
PAGE = os.path.join(ROOT, 'docs', 'book-comparison.md')
FIGURE = book_figure.FIGURE  # the accuracy table as a picture, drawn with the tables
NOTEBOOKS = {'en': os.path.join(ROOT, 'notebooks', 'multiple-gpus-gluon.ipynb'),
             'zh': os.path.join(ROOT, 'notebooks', 'multiple-gpus-gluon.zh.ipynb')}
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


def append_record(path, record):
    """Append one line to the record file and flush it to disk.

    Raises
    ------
    CommandError
        When the path is not a regular file of ours or the disk refuses the write.
    """
    problem = output_problem(path)
    if problem:
        raise CommandError('cannot append to the record %s: %s' % (path, problem))
    line = (json.dumps(record, sort_keys=True, allow_nan=False) + '\n').encode('utf-8')
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        try:
            size = os.fstat(fd).st_size
            try:
                written = os.write(fd, line)
                if written != len(line):  # a full disk or a file size limit
                    raise OSError(errno.ENOSPC, 'only %d of the line\'s %d bytes could be '
                                  'written; the record is left as it was' % (written, len(line)))
                os.fsync(fd)
            except OSError:
                os.ftruncate(fd, size)  # the record keeps whole lines
                raise
        finally:
            os.close(fd)
    except OSError as e:
        raise CommandError('cannot append to the record %s: %s' % (path, e.strerror or e)) \
            from None


def recorded(records, run, epoch):
    """Whether epoch ``epoch`` of ``run`` has its line in ``records``."""
    return any(record_key(r) == run.key() and r['epoch'] == epoch for r in records)


def run_table(runs, work_dir, record_path, devices, device='auto', data_dir=None,
              progress=None, wait_seconds=60):
    """Train and diagnose every epoch of ``runs`` that has no line in the record; return the
    records.

    Resumable at any point: each (run, epoch) is looked up in ``record_path``, so a line
    deleted (as a record error advises) is made again; a checkpoint found in a run's folder
    (``work_dir/<run name>``) is diagnosed or resumed from; one whose later epochs exist
    without it is trained again from the start in ``<run name>-again``; a folder another
    process holds is waited for. ``devices`` diagnose (as many as the largest run has);
    ``progress`` gets a line before each epoch and after each diagnosis.

    Raises
    ------
    RunFailed
        When a train command fails; KeyboardInterrupt when stopped.
    """
    say = progress or (lambda line: None)
    os.makedirs(os.path.join(work_dir, 'logs'), exist_ok=True)
    records = book_records.read_records(record_path)
    plan = [(run, e) for run in runs for e in range(1, run.epochs + 1)]
    spent = []  # wall seconds of the epochs this call trained: train command and diagnosis
    waiting_for = None
    for run, epoch in plan:
        directory = os.path.join(work_dir, run.name)
        while not recorded(records, run, epoch):
            saved = list_checkpoints(directory)
            if epoch not in saved and saved and saved[-1] > epoch:
                directory = os.path.join(work_dir, run.name + '-again')
                continue
            # One runner per run at a time: two started together both found the folder free,
            # and the second's train command was refused (exit 2) instead of waiting.
            runner = _runner_lock(work_dir, run)
            holder = (_is_locked(directory) if runner is not None else
                      'another book_table.py trains or diagnoses %s (it holds %s)'
                      % (run.name, _runner_path(work_dir, run)))
            if holder:  # one training at a time: a run another process holds is waited for
                if runner is not None:
                    runner.close()
                if holder != waiting_for:
                    say('waiting: %s' % holder)
                waiting_for = holder
                time.sleep(wait_seconds)
                continue
            with runner:
                records = book_records.read_records(record_path)  # another runner's lines too
                if recorded(records, run, epoch):
                    break
                saved = list_checkpoints(directory)
                waiting_for, start = None, time.time()
                if saved:  # what is diagnosed or resumed must be this run's
                    check_run_folder(run, directory, epoch if epoch in saved else saved[-1],
                                     data_dir)
                trained = epoch not in saved
                if trained:
                    done = sum(recorded(records, r, e) for r, e in plan)
                    per_epoch = _seconds_per_epoch(spent, records)
                    left = _epochs_to_train(plan, records, work_dir)
                    say('book table: %d of %d epochs recorded; training %s epoch %d%s'
                        % (done, len(plan), run.name, epoch, '' if per_epoch is None else
                           ', about %.1f h left (%d epochs to train) at %.0f min per epoch'
                           % (left * per_epoch / 3600, left, per_epoch / 60)))
                    try:
                        _train(run, directory, epoch, work_dir, device, data_dir)
                    except RunFailed as e:
                        if 'is in use by another run' not in str(e):
                            raise
                        # A train command started into the folder since _is_locked looked.
                        say('waiting: %s is in use by another run' % directory)
                        time.sleep(wait_seconds)
                        continue
                record = _diagnosed(run, directory, epoch, record_path, devices, data_dir)
                records.append(record)
                if trained:  # an epoch found trained says nothing of the time left
                    spent.append((time.time() - start) / (epoch - (saved[-1] if saved else 0)))
                say('%s epoch %d: test_acc %.4f (device 0: %.4f), precise BatchNorm %.4f, batch '
                    'statistics %.4f' % (run.name, epoch, record['test_acc'],
                                         record['acc_running'][0], record['acc_precise_bn'],
                                         record['acc_batch_stats']))
    return records


def _runner_path(work_dir, run):
    return os.path.join(work_dir, 'logs', run.name + '.runner')


def _runner_lock(work_dir, run):
    """This process's hold on ``run`` (``flock`` on ``logs/<run>.runner``, released when the
    file is closed or the process ends), or None while another process holds it."""
    import fcntl
    path = _runner_path(work_dir, run)
    try:
        f = open(os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644), 'r+b')
    except OSError as e:
        raise CommandError('cannot write the lock %s: %s' % (path, e.strerror or e)) from None
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        return None
    return f


def _epochs_to_train(plan, records, work_dir):
    """How many epochs the train command still has to run for ``plan``'s unrecorded epochs:
    per run, from its last checkpoint (or the start) up to its last unrecorded epoch. An epoch
    recorded without its checkpoint costs nothing until a later one needs it: then the run
    trains from the start (as epoch 4 of a run recorded elsewhere does, all four epochs)."""
    last = {}
    for run, epoch in plan:
        if not recorded(records, run, epoch):
            last[run] = max(last.get(run, 0), epoch)
    total = 0
    for run, epoch in last.items():
        try:
            saved = [e for e in list_checkpoints(os.path.join(work_dir, run.name)) if e <= epoch]
        except OSError:  # an estimate: the loop reports an unreadable folder when it gets there
            saved = []
        total += epoch - (saved[-1] if saved else 0)
    return total


def train_argv(run, directory, epochs, resume, device='auto', data_dir=None):
    """The command that trains ``run`` up to epoch ``epochs`` in checkpoint folder ``directory``."""
    argv = [sys.executable, '-m', 'gluon_mgpu.train', '--num-gpus', str(run.devices),
            '--seed', str(run.seed), '--epochs', str(epochs), '--checkpoint-dir', directory,
            '--device', device]
    if resume:
        argv.append('--resume')
    for flag, value in (('--warmup-steps', run.warmup_steps or None),
                        ('--dtype', None if run.dtype == 'float32' else run.dtype),
                        ('--train-limit', run.train_limit), ('--test-limit', run.test_limit),
                        ('--data-dir', data_dir)):
        if value is not None:
            argv += [flag, str(value)]
    return argv


# What a run's settings may differ in from the book table's command line and still be its run:
# where it runs, how long, and what it prints, writes or checks besides.
_NOT_A_SETTING = {'epochs', 'checkpoint_dir', 'resume', 'device', 'data_dir', 'given', 'argv',
                  'now', 'recorded', 'outputs', 'debug', 'force_dtype', 'quiet', 'plot',
                  'metrics_json', 'save_params', 'check_replicas'}


def settings_difference(run, settings):
    """How a train command's ``settings`` (``gluon_mgpu.resolve``'s) differ from those with which
    this script trains ``run``: ``['--seed 1 (the table's run: 0)', ...]``, empty for none."""
    wanted = resolve(train_argv(run, settings.checkpoint_dir or '.', settings.epochs, False)[3:])
    return ['--%s %s (the table\'s run: %s)' % (k.replace('_', '-'), v, getattr(wanted, k, None))
            for k, v in sorted(vars(settings).items())
            if k not in _NOT_A_SETTING and getattr(wanted, k, None) != v]


# Fashion-MNIST's four files (their names are the data set's own), as a line's data_sha256
# digests them: one after the other.
DATA_FILES = ('train-images-idx3-ubyte.gz', 'train-labels-idx1-ubyte.gz',
              't10k-images-idx3-ubyte.gz', 't10k-labels-idx1-ubyte.gz')


def _data_digest(folder):
    """The sha256 of the four Fashion-MNIST files in ``folder``, one after the other."""
    import hashlib
    digest = hashlib.sha256()
    for name in DATA_FILES:
        with open_input(os.path.join(folder, name)) as f:
            for block in iter(lambda: f.read(1 << 20), b''):
                digest.update(block)
    return digest.hexdigest()


def _other_data(recorded, data_dir):
    """The folder of the data a checkpoint was trained on (its recorded ``--data-dir``, or the
    default search), when it holds other files than the folder this run reads; else None (the
    same folder or files, or a folder gone since, which cannot be compared)."""
    try:
        theirs, ours = find_data_dir(recorded), find_data_dir(data_dir)
        if os.path.realpath(theirs) == os.path.realpath(ours):
            return None
        return theirs if _data_digest(theirs) != _data_digest(ours) else None
    except (OSError, ValueError):  # gone or unreadable: the run's own check reports ours
        return None


def check_run_folder(run, directory, epoch, data_dir=None):
    """Refuse (``CheckpointError``) a checkpoint ``epoch`` in ``run``'s folder that another run
    wrote, or that was trained on other data than ``data_dir``'s (files that differ), before it
    is diagnosed or resumed."""
    try:
        record = read_checkpoint(directory, epoch)
    except CheckpointError as e:  # the train command's fix, in this script's flag
        raise CheckpointError(str(e).replace('--checkpoint-dir', '--work-dir')) from None
    settings = recorded_settings(directory, record)
    differ = settings_difference(run, settings)
    if differ:
        raise CheckpointError(
            '%s holds a run with other settings than %s: %s; move that folder away or pass '
            'another --work-dir' % (directory, run.name, ', '.join(differ)[:300]))
    other = _other_data(settings.data_dir, data_dir)
    if other is not None:
        raise CheckpointError(
            '%s holds a run trained on the data in %s, whose files differ from those this run '
            'reads (%s); pass --data-dir %s, or move that folder away or pass another --work-dir'
            % (directory, other, data_dir or 'the default search', other))


def _restored(directory, record, devices, hybridize):
    """A new ResNet-18 holding checkpoint ``record``'s values on ``devices``, computing in the
    run's dtype."""
    args = recorded_settings(directory, record)
    net = new_network('resnet18', hybridize=hybridize, dtype=args.dtype)
    trainer = init_training(net, devices, args.lr, dtype=args.dtype)
    restore(directory, record, net, trainer, devices)
    return net


def batch_norm_layers(net):
    """Every ``nn.BatchNorm`` inside ``net``, in order (17 in the chapter's ResNet-18)."""
    found = [net] if isinstance(net, nn.BatchNorm) else []
    for child in net._children.values():
        found += batch_norm_layers(child)
    return found


def reestimate_running_stats(net, X, device):
    """Set every BatchNorm's running statistics on ``device`` to those of the batch ``X``.

    One forward and backward pass in training mode with momentum 0, so that MXNet's own update
    writes the batch's mean and (biased) variance; no weight changes, and the other devices'
    copies stay.

    Parameters
    ----------
    net : mxnet.gluon.Block
        Initialized on ``device``, not hybridized (a hybridized graph holds its own momentum).
    X : mxnet.nd.NDArray
        A batch of training images.
    device : mxnet.Context

    Raises
    ------
    ValueError
        If ``net`` is hybridized or holds no BatchNorm.
    """
    if getattr(net, '_active', False):
        raise ValueError('%s is hybridized, so its BatchNorm momentum cannot change; pass a '
                         'network that is not (new_network(..., hybridize=False)) and '
                         'hybridize it afterwards' % type(net).__name__)
    layers = batch_norm_layers(net)
    if not layers:
        raise ValueError('%s holds no nn.BatchNorm, so there are no running statistics to '
                         're-estimate' % type(net).__name__)
    saved = [layer._kwargs['momentum'] for layer in layers]
    try:
        for layer in layers:
            layer._kwargs['momentum'] = 0.0
        with autograd.record():
            out = net(X.as_in_context(device))
        out.backward()
        nd.waitall()
    finally:
        for layer, momentum in zip(layers, saved):
            layer._kwargs['momentum'] = momentum


def evaluate_with_batch_stats(data_iter, net, device):
    """Accuracy of ``net`` on ``data_iter`` with BatchNorm normalizing by each batch's own
    statistics (training mode, no gradients), on one ``device``.

    The result depends on the batch size: the issue's and docs' numbers use batches of 500.
    Running statistics may change on ``device`` (MXNet updates them in training mode), so use
    a copy of the network that is not needed afterwards.
    """
    def in_train_mode(X):
        with autograd.train_mode():
            return net(X)

    return evaluate_accuracy(data_iter, in_train_mode, [device])


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
    def batches(size, images):  # (the first images of the training set, the test set)
        return load_data_fashion_mnist(size, data_dir, images, test_limit, shuffle=False)

    record = read_checkpoint(directory, epoch)
    test_iter = batches(recorded_settings(directory, record).batch_size, 1)[1]
    stats_iter = batches(BATCH_STATS_BATCH, 1)[1]

    net = _restored(directory, record, devices, hybridize=True)
    acc_running = [evaluate_accuracy(test_iter, net, [d]) for d in devices]
    plain = _restored(directory, record, devices, hybridize=False)
    X, _ = next(iter(batches(PRECISE_BN_IMAGES, PRECISE_BN_IMAGES)[0]))
    reestimate_running_stats(plain, X, devices[0])
    plain.hybridize(static_alloc=True)
    acc_precise = evaluate_accuracy(test_iter, plain, devices[:1])
    acc_batch = evaluate_with_batch_stats(stats_iter, net, devices[0])
    return {'stats': record['history'][epoch - 1], 'step': record['step'],
            'acc_running': acc_running,
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


class RunFailed(CommandError):
    """A run's train command failed; the message names its log."""


class RunRefused(RunFailed, UsageError):
    """A run's train command refused its input (its exit code 2): bad input, as its line says."""


def _is_locked(directory):
    """The refusal of checkpoint folder ``directory``'s lock if another process holds it."""
    if os.path.isdir(directory):
        try:
            lock_dir(directory).release()
        except CheckpointError as e:  # in this script's words: it has no --checkpoint-dir
            return str(e).replace('pass another --checkpoint-dir', 'pass another --work-dir')
        except ValueError as e:  # a folder whose .lock or files are no run's
            raise CheckpointError(str(e)) from None
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


def _train(run, directory, epoch, work_dir, device, data_dir):
    """Train ``run`` up to ``epoch`` with the train command, from its last checkpoint; its
    output goes to the end of the run's log."""
    argv = train_argv(run, directory, epoch, bool(list_checkpoints(directory)), device, data_dir)
    log_path = log_file(work_dir, run)
    try:
        fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as e:
        raise CommandError('cannot write the log %s: %s' % (log_path, e.strerror or e)) \
            from None
    with os.fdopen(fd, 'ab') as log:
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
    if code == 2:  # it refused its input: its own line says why
        raise RunRefused('the train command of %s refused its input: %s (its output is in %s)'
                         % (run.name, _last_line(log_path), log_path))
    if code != 0:
        raise RunFailed('the train command of %s exited with %d; its output is in %s'
                        % (run.name, code, log_path))


def log_file(work_dir, run):
    """The log of ``run``'s train commands in ``work_dir``."""
    return os.path.join(work_dir, 'logs', run.name + '.log')


def _last_line(path):
    with open(path, 'rb') as f:
        f.seek(max(0, os.fstat(f.fileno()).st_size - 2000))
        lines = f.read().decode('utf-8', 'replace').strip().splitlines()
    return lines[-1][:300] if lines else 'no output'


def _diagnosed(run, directory, epoch, record_path, devices, data_dir):
    """Diagnose checkpoint ``epoch`` of ``run``; append its line to the record, return it.
    The line names the data it was trained on: the sha256 of the four files, in order."""
    found = diagnose(directory, epoch, devices[:run.devices], data_dir, run.test_limit)
    stats = found.pop('stats')
    batch_size, lr = book_setting(run.devices)
    record = dict(found, devices=run.devices, seed=run.seed,
                  warmup_steps=run.warmup_steps, train_limit=run.train_limit,
                  test_limit=run.test_limit, epoch=epoch, batch_size=batch_size, lr=lr,
                  **{k: stats[k] for k in ('seconds', 'train_loss', 'train_acc', 'test_acc',
                                           'images_per_sec')},
                  device_names=[str(d) for d in devices[:run.devices]],
                  commit=_commit(), mxnet=mxnet.__version__, cpu=cpu_model(),
                  data_sha256=_data_digest(find_data_dir(data_dir)),
                  **kernel_setting(child_env()),
                  recorded=datetime.datetime.now(datetime.timezone.utc).strftime(
                      '%Y-%m-%dT%H:%M:%SZ'))
    if run.dtype != 'float32':  # the book's lines keep the fields they always had
        record['dtype'] = run.dtype
    append_record(record_path, record)
    return record


def _seconds_per_epoch(spent, records, cpu=None):
    """Seconds per epoch for the time left: the epochs this call trained, else the recorded
    epochs of this processor (``cpu``, default this machine's), else every recorded epoch."""
    cpu = cpu_model() if cpu is None else cpu
    seconds = spent or [r['seconds'] for r in records if r.get('cpu') == cpu] \
        or [r['seconds'] for r in records]
    return book_records.total(seconds) / len(seconds) if seconds else None


# The page's tables beside the accuracy table: the runs seen three ways, the old step, bfloat16.


# Student's t at 97.5% by degrees of freedom, for the 95% prediction interval of one more draw.
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
         9: 2.262, 10: 2.228, 15: 2.131, 20: 2.086, 30: 2.042}


def prediction_interval(values):
    """The 95% prediction interval of one more draw from the distribution of ``values`` (at
    least 2): ``mean +- t(n-1) * s * sqrt(1 + 1/n)``, ``s`` the sample standard deviation."""
    n = len(values)
    if n < 2:
        raise ValueError('a prediction interval needs at least 2 values, got %d' % n)
    mean = book_records.total(values) / n
    s = math.sqrt(book_records.total((v - mean) ** 2 for v in values) / (n - 1))
    # Between the table's rows, the smaller row's t: the wider, cautious interval.
    t = _T975[max(k for k in _T975 if k <= n - 1)]
    half = t * s * math.sqrt(1 + 1 / n)
    return mean - half, mean + half


def interval_text(low, high):
    """``'95% prediction interval 0.40 to 0.90'``, clipped to accuracies; an interval that
    holds every accuracy says that it cannot tell anything."""
    text = '95%% prediction interval %.2f to %.2f' % (max(low, 0.0), min(high, 1.0))
    if low <= 0.0 and high >= 1.0:
        text += ', every accuracy: the seeds spread too widely to tell'
    return text


def _spread(values):
    s = summarize(values)
    return 'mean %.2f (%.2f-%.2f, %s)' % (s['mean'], s['low'], s['high'], plural(s['n'], 'seed'))


def diagnosis_rows(records, warmup_steps=()):
    """Per configuration and epoch, test accuracy normalized three ways over seeds: dicts with
    ``setting`` (its words), ``devices``, ``warmup_steps``, ``epoch``, ``seeds``, ``book`` (the
    book's value or None) and a ``summarize`` of each of ``_SUMMARIES`` (the columns of
    ``format_diagnosis``)."""
    rows = []
    for n, w in [(2, 0), (1, 0)] + [(2, w) for w in warmup_steps]:
        by_epoch = table_records(records, n, w)
        book = book_records.BOOK_TRAINING[n]['test_acc']
        for e in sorted(by_epoch):
            rs = by_epoch[e]
            rows.append({
                'setting': plural(n, 'device') + (', warmup %d steps' % w if w else ''),
                'devices': n, 'warmup_steps': w,
                'epoch': e, 'seeds': sorted(r['seed'] for r in rs),
                'book': book[e - 1] if e <= len(book) else None,
                'running0': summarize([r['acc_running'][0] for r in rs]),
                'running_other': summarize([a for r in rs for a in r['acc_running'][1:]]),
                'precise': summarize([r['acc_precise_bn'] for r in rs]),
                'batch': summarize([r['acc_batch_stats'] for r in rs]),
                'train_acc': summarize([r['train_acc'] for r in rs])})
    return rows


# What the bfloat16 rows compare, seed by seed: the book's measure, then two that a chaotic first
# epoch moves less (the running statistics lag the weights; docs/book-comparison.md's diagnosis).
DTYPE_MEASURES = (("device 0 running stats (book's)", lambda r: r['acc_running'][0]),
                  ('precise BatchNorm', lambda r: r['acc_precise_bn']),
                  ('train_acc (epoch mean)', lambda r: r['train_acc']))


def dtype_rows(records, bf16_records):
    """bfloat16 against float32 (docs/precision.md): per device count and epoch that
    ``bf16_records`` hold and per measure of ``DTYPE_MEASURES``, the values over seeds in both
    dtypes, each bfloat16 seed judged against float32's 95% prediction interval; rows of cell
    texts, headed by the titles."""
    lines = [['setting', 'epoch', 'measure', 'float32', 'bfloat16',
              'same seeds: bfloat16 - float32', 'bfloat16 against float32\'s spread']]
    for n in (2, 1):
        ours = table_records(bf16_records, n, dtype='bfloat16')
        base = table_records(records, n)
        for e in sorted(ours):
            for name, measure in DTYPE_MEASURES:
                lines.append([plural(n, 'device'), str(e), name] + _beside_float32(
                    {r['seed']: measure(r) for r in base.get(e, [])},
                    {r['seed']: measure(r) for r in ours[e]}))
    return lines


def _beside_float32(old, new):
    """The cells of one bfloat16 row: float32's values ``old`` and bfloat16's ``new`` (each
    ``{seed: value}``), their same-seed difference and the verdict."""
    if len(old) < 2:
        verdict = 'not judged: float32 has %s so far' % plural(len(old), 'seed')
    else:
        low, high = prediction_interval(list(old.values()))
        inside = sum(low <= v <= high for v in new.values())
        verdict = '%d of %d inside float32\'s %s' % (inside, len(new), interval_text(low, high))
    return [_spread(list(old.values())) if old else 'not run', _spread(list(new.values())),
            _same_seed_change(old, new), verdict]


def _same_seed_change(old, new):
    """The cell of the mean of ``new[seed] - old[seed]`` over the seeds both ``{seed: value}``
    hold, with how many those are: ``'+0.012 (3 seeds)'``, ``'-'`` for none."""
    both = set(new) & set(old)
    if not both:
        return '-'
    return '%+.3f (%s)' % (book_records.total(new[k] - old[k] for k in both) / len(both),
                           plural(len(both), 'seed'))


def _cell_of(summary):
    if summary is not None and summary['n'] == 1:
        return '%.3f' % summary['mean']
    return book_records.mean_low_high(summary, 3)


_SUMMARIES = ('running0', 'running_other', 'precise', 'batch', 'train_acc')


_DIAGNOSIS_TITLES = ['setting', 'epoch', 'seeds', "book's test_acc",
                     'device 0 running stats (book\'s measure)', 'other devices\' running stats',
                     'precise BatchNorm', 'batch statistics', 'train_acc (epoch mean)']


def format_diagnosis(rows):
    """The diagnosis rows as lists of cell texts, headed by the column titles."""
    return [_DIAGNOSIS_TITLES] + [
        [r['setting'], str(r['epoch']), ' '.join(map(str, r['seeds'])),
         '-' if r['book'] is None else '%.2f' % r['book']] + [_cell_of(r[k]) for k in _SUMMARIES]
        for r in rows]


def old_step_cells(records, old_records):
    """The runs of the book's step beside those of the old one (``book_records.OLD_STEP``), which
    divided an epoch's short last batch by its own size: per setting and epoch, cell texts
    headed by their titles. Up to the last step of epoch 1 the two runs of a seed are the same
    run, so epoch 1's change is what one short step taken right before the test does."""
    lines = [['setting', 'epoch', 'old step: device 0 (book\'s measure)', 'book\'s step',
              'same seeds: book\'s - old', 'old step: precise BatchNorm', 'book\'s step',
              'same seeds: book\'s - old']]
    for n in (1, 2):
        new = table_records(records, n)
        old = table_records(old_records, n)
        for e in sorted(set(new) | set(old)):
            line = [plural(n, 'device'), str(e)]
            for measure in (lambda r: r['acc_running'][0], lambda r: r['acc_precise_bn']):
                before = {r['seed']: measure(r) for r in old.get(e, [])}
                after = {r['seed']: measure(r) for r in new.get(e, [])}
                line += [book_records.mean_low_high(summarize(list(before.values())), 3),
                         book_records.mean_low_high(summarize(list(after.values())), 3),
                         _same_seed_change(before, after)]
            lines.append(line)
    return lines


def _markdown_table(lines):
    def row(cells):
        return '| ' + ' | '.join(str(c).replace('|', '\\|') for c in cells) + ' |'
    return [row(lines[0]), '|' + '---|' * len(lines[0])] + [row(line) for line in lines[1:]]


def record_report(records, old_records, bf16_records, devices, other_runs=()):
    """The parts of a report that come from the records alone: ``seconds`` (rows of seconds
    per epoch and the speed-up in ``compare``'s table, for ``devices``), ``accuracy``,
    ``machines`` (the legend of the machines its values name), ``old_step``, ``diagnosis``,
    ``dtypes`` (see ``page_blocks``), ``dips`` (``{devices: book_dips.dip_cells}`` of the
    records and ``other_runs``, ``book_dips.read_other_runs``, for 1 and 2 devices) and
    ``pooled`` (``book_dips.pooled`` of each)."""
    warmups = sorted({r['warmup_steps'] for r in records if r['warmup_steps']})
    gpu_runs = book_records.read_gpu_runs()
    dips = {d: book_dips.dip_cells(records, other_runs, gpu_runs, d) for d in (1, 2)}
    whole = book_records.read_gpu_runs(whole=True)
    return {'seconds': book_records.training_rows(devices, records),
            'accuracy': book_records.accuracy_cells(records, gpu_runs), 'dips': dips,
            'pooled': [book_dips.pooled(dips[d], whole['later', d]) for d in (1, 2)],
            'machines': book_records.machine_legend(records),
            'old_step': old_step_cells(records, old_records),
            'diagnosis': diagnosis_rows(records, warmups),
            'dtypes': dtype_rows(records, bf16_records)}


def record_blocks(report):
    """The page's tables made of ``record_report``'s parts, ``{name: Markdown text}``."""
    tables = {'seconds': book_records.table_lines(report['seconds']),
              'accuracy': book_records.format_accuracy_cells(report['accuracy']),
              'machines': book_records.format_machine_legend(report['machines']),
              'old-step': report['old_step'], 'diagnosis': format_diagnosis(report['diagnosis']),
              'bf16': report['dtypes']}

    def block(lines, answer=None):  # the table, then the answer's paragraph if there is one
        return '\n'.join(_markdown_table(lines) + (['', answer] if answer else []))
    blocks = {name: block(lines) for name, lines in tables.items()}
    for name, d in (('dips-1', 1), ('dips', 2)):
        blocks[name] = block(book_dips.dip_rows(report['dips'][d]),
                             book_dips.dip_answer(report['dips'][d]))
    blocks['pooled'] = block(book_dips.pooled_rows(report['pooled']),
                             book_dips.pooled_text(report['pooled']))
    return blocks


def page_blocks(report):
    """Every generated part of ``docs/book-comparison.md``, ``{name: Markdown text}``: the
    ``record_blocks`` and, from the report's ``compare`` (what ``python -m gluon_mgpu.compare
    --json`` printed), ``record``, ``date`` and ``mxnet_version``, the rest. The page's prose is
    written by hand around them (``update_page``)."""
    found = report['compare']
    book, ours = found['book'], found['ours']
    blocks = dict(record_blocks(report), generated=(
        'Generated by `%s --page` on %s with MXNet %s; %s; the runs are recorded in `%s`.'
        % (PROG, report['date'], report['mxnet_version'], found['devices'], report['record'])))
    blocks['rows'] = '\n'.join(_markdown_table(book_records.table_lines(found['rows'])) + [''] +
                               ['- ' + n for n in found['notes'] + book_records.notes()])
    printed = []
    for i in range(2):
        printed += ['Out[4], device %d: the book (%s)' % (i, book['devices'][i]), '', '```',
                    book['out4'][i], '```', '', 'ours (%s)' % ours['devices'][i], '', '```',
                    ours['out4'][i], '```', '']
    printed += ['Out[5], both devices: the book', '', '```', book['out5'], '```', '']
    for i in range(2):
        printed += ['ours (%s)' % ours['devices'][i], '', '```', ours['out5'][i], '```', '']
    blocks['printed'] = '\n'.join(printed).rstrip()
    return blocks


_BLOCK = re.compile(r'(<!-- begin compare: ([\w-]+) -->\n)(.*?)(<!-- end compare: \2 -->)',
                    re.S)


def read_blocks(text):
    """The generated blocks of a page, ``{name: text}``."""
    return {m.group(2): m.group(3).rstrip('\n') for m in _BLOCK.finditer(text)}


def update_page(text, blocks):
    """``text`` (the page) with each generated block replaced by ``blocks[name]``.

    Raises
    ------
    ValueError
        When the page holds none of the blocks (it is not a page this command writes).
    """
    found = read_blocks(text)
    if not found:
        raise ValueError('it holds no "<!-- begin compare: NAME -->" block, so it is not the '
                         'page whose tables this script fills')
    missing = [name for name in blocks if name not in found]
    if missing:  # a renamed or deleted marker: that table would silently stay as it was
        raise ValueError('it holds no block "<!-- begin compare: %s -->" ... "<!-- end compare: '
                         '%s -->", so that table would not be updated' % (missing[0], missing[0]))

    def fill(m):
        new = blocks.get(m.group(2))
        return m.group(0) if new is None else m.group(1) + new + '\n' + m.group(4)
    return _BLOCK.sub(fill, text)


def fill_notebook_table(source, cells):
    """``source`` (a Markdown cell) with its table's cells after the first column replaced by
    ``cells`` (``book_records.notebook_table``); the rows' titles stay the notebook's."""
    lines = source.split('\n')
    rows = [i for i, line in enumerate(lines) if line.startswith('|')][2:]
    if len(rows) != len(cells):
        raise ValueError('the notebook\'s table has %d rows, the records give %d: edit the '
                         'cell\'s rows first' % (len(rows), len(cells)))
    for i, values in zip(rows, cells):
        title = lines[i].strip('|').split('|')[0].strip()
        lines[i] = '| %s | %s |' % (title, ' | '.join(values))
    return '\n'.join(lines)


def _fill_marked(source, name, lines, what):
    """``source`` (the Markdown cell of the table) with the lines between its ``<!-- begin
    NAME -->`` and ``<!-- end NAME -->`` markers replaced by ``lines``.

    Raises
    ------
    ValueError
        When the cell holds no such markers (naming ``what`` would not be written).
    """
    marked = re.compile(r'(<!-- begin %s -->\n)(.*?)(<!-- end %s -->)' % (name, name), re.S)
    if len(marked.findall(source)) != 1:
        raise ValueError('its book-table cell holds no "<!-- begin %s -->" ... "<!-- end %s -->" '
                         'lines, so %s would not be written' % (name, name, what))
    return marked.sub(lambda m: m.group(1) + ''.join(line + '\n' for line in lines) +
                      m.group(3), source)


def fill_notebook_legend(source, lines):
    """``source`` with the legend of the machines (``book_records.notebook_legend``) between
    its ``machines`` markers (``_fill_marked``)."""
    return _fill_marked(source, 'machines', lines, 'the legend of the machines')


def fill_notebook_dips(source, report, lang):
    """``source`` with ``record_report``'s answers in ``lang`` between their markers
    (``_fill_marked``): the dip question's (``book_dips.format_dips``) for 1 device
    (``dips-1``) and 2 (``dips``), and whether our runs sit low (``book_dips.format_pooled``,
    ``pooled``)."""
    for name, lines, what in (
            ('dips-1', book_dips.format_dips(report['dips'][1], lang),
             'the 1-device answer to the dip question'),
            ('dips', book_dips.format_dips(report['dips'][2], lang),
             'the answer to the dip question'),
            ('pooled', book_dips.format_pooled(report['pooled'], lang),
             'the answer whether our runs sit low')):
        source = _fill_marked(source, name, lines, what)
    return source


def child_env():
    """This environment, with the repository first on ``PYTHONPATH`` (for a child process)."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (ROOT, os.environ.get('PYTHONPATH')) if p))


def _compared(device, data_dir):
    """What ``python -m gluon_mgpu.compare --json`` prints: the chapter's cells and the step
    beside the book's, as rows and as printed (exit code 1, a mismatch, shows on the page)."""
    argv = [sys.executable, '-m', 'gluon_mgpu.compare', '--json', '--device', device] + (
        ['--data-dir', data_dir] if data_dir else [])
    done = subprocess.run(argv, capture_output=True, text=True, env=child_env(), cwd=ROOT)
    if done.returncode not in (0, 1):
        line = (done.stderr.strip().splitlines() or ['no output'])[-1][:300]
        raise (RunRefused if done.returncode == 2 else RunFailed)(
            'python -m gluon_mgpu.compare exited with %d: %s' % (done.returncode, line))
    return json.loads(done.stdout)


def write_page(devices, data_dir=None, tables_only=False, record=None, device='auto'):
    """Fill docs/book-comparison.md's tables and the notebooks' from the records (``record``,
    default ``DEFAULT_RECORD``) and draw the figure of the accuracy table (``FIGURE``,
    ``book_figure``); the chapter's cells and the step run again (a few minutes),
    unless ``tables_only``: then only the tables made of the records change (seconds)."""
    import nbformat
    record = record or DEFAULT_RECORD
    records = book_records.read_records(record)
    if not records:  # the tables would be emptied, the page's, the notebooks' and the figure's
        raise PageError('%s %s; the tables are made of the epochs a record holds: pass --record '
                        'with one that book_table.py trained into'
                        % (record, 'holds no line' if os.path.exists(record) else 'does not exist'))
    # The other runs' machines are the default record's: a record of one's own stands alone.
    other = book_dips.read_other_runs() if os.path.abspath(record) == DEFAULT_RECORD else []
    report = record_report(records, book_records.read_records(book_records.OLD_STEP_RECORD,
                                                              step=book_records.OLD_STEP),
                           book_records.read_records(DEFAULT_BF16_RECORD), devices, other)
    if tables_only:
        blocks = record_blocks(report)
    else:
        report.update(compare=_compared(device, data_dir), record=os.path.relpath(record, ROOT),
                      mxnet_version=mxnet.__version__, date=datetime.date.today().isoformat())
        blocks = page_blocks(report)
    new = {}  # every file is made before any is written: one that cannot be leaves all as they were
    with _page_file(PAGE), open_input(PAGE) as f:
        new[PAGE] = update_page(f.read().decode('utf-8'), blocks)
    for lang, path in NOTEBOOKS.items():
        with _page_file(path):
            nb = nbformat.read(path, as_version=4)
            cells = [c for c in nb.cells if 'book-table' in c.metadata.get('tags', [])]
            if len(cells) != 1:
                raise ValueError('it holds %d cells tagged book-table, not one' % len(cells))
            cells[0].source = fill_notebook_dips(fill_notebook_legend(fill_notebook_table(
                cells[0].source, book_records.notebook_table(report['accuracy'], lang)),
                book_records.notebook_legend(report['machines'], lang)), report, lang)
            new[path] = nbformat.writes(nb).rstrip('\n') + '\n'  # as nbformat.write ends it
    new[FIGURE] = book_figure.draw(book_figure.figure_data(
        report['accuracy'], book_records.read_gpu_runs(), report['machines']))
    for path in new:  # a link or a folder found now, not after the page is written
        with _page_file(path):
            problem = output_problem(path)
            if problem:
                raise ValueError(problem)
    for path, text in new.items():
        with atomic_path(path) as tmp, open(tmp, 'wb') as f:
            f.write(text if isinstance(text, bytes) else text.encode('utf-8'))
    return list(new)


class PageError(UsageError, ValueError):
    """A page or notebook whose tables cannot be filled; the message names it and the fix."""


@contextlib.contextmanager
def _page_file(path):
    try:
        yield
    except (OSError, ValueError, KeyError, AttributeError, UnicodeDecodeError) as e:
        name = os.path.relpath(path, ROOT)
        raise PageError('%s: %s; its tables are filled in place, so restore it (git checkout -- '
                        '%s) and run this again; no file was written'
                        % (name, getattr(e, 'reason', None) or getattr(e, 'strerror', None)
                           or str(e)[:200] or type(e).__name__, name)) from None


def build_parser():
    p = Parser(prog=PROG, description='Train the runs of the book\'s accuracy table that '
               'are not yet recorded (1 and 2 devices, the book\'s settings, full data, each '
               'seed), one epoch at a time, resumable; or, with --page, fill the tables of '
               'docs/book-comparison.md and the notebooks from the records.')
    pages = p.add_mutually_exclusive_group()
    pages.add_argument('--page', action='store_true',
                       help='train nothing: fill docs/book-comparison.md\'s tables and the '
                            'notebooks\' accuracy table from the records (default: off)')
    pages.add_argument('--tables', action='store_true',
                       help='as --page, but only the tables made of the records and their '
                            'figure (seconds; the chapter\'s cells and the step are not run '
                            'again)')
    # The run flags' defaults are filled in by _main: None says a flag was not given.
    p.add_argument('--seeds', type=Parser.whole('--seeds', 0, 2 ** 31 - 1, example='0 1 2'),
                   nargs='+', metavar='S',
                   help='the seeds of the runs (default: 0 1 2)')
    p.add_argument('--warmup-steps', type=Parser.whole('--warmup-steps'), default=None,
                   metavar='N',
                   help='also train epoch 1 of each seed on 2 devices with a linear '
                        'learning-rate warmup of N steps, as rows of their own (default: none)')
    p.add_argument('--epochs', type=Parser.whole('--epochs', 1, RUN_EPOCHS, example=RUN_EPOCHS),
                   help='epochs per run, at most the table\'s %d (default: %d, the book\'s)'
                        % (RUN_EPOCHS, RUN_EPOCHS))
    p.add_argument('--dtype', choices=('float32', 'bfloat16'),
                   help='what the runs compute in; bfloat16 runs go to a record of their own '
                        '(default: float32, the book\'s)')
    p.add_argument('--record', metavar='PATH', type=Parser.output_file(
                       '--record', 'docs/records/book-table.jsonl'),
                   help='the record to append to, or with --page or --tables, to make the '
                        'tables of (default: docs/records/book-table.jsonl, or '
                        'docs/records/bf16-table.jsonl for bfloat16)')
    p.add_argument('--work-dir', metavar='DIR', type=_folder('--work-dir'),
                   help='the runs\' checkpoints (45 MB per epoch) and logs (default: %s)'
                        % DEFAULT_WORK_DIR.replace(os.path.expanduser('~'), '~'))
    p.add_device_flag()
    p.add_data_flags()
    p.add_debug_flag()
    return p


def _folder(flag):
    def parse(text):
        if not text.strip():
            raise argparse.ArgumentTypeError('%s expects a folder, got %r; for example %s '
                                             '~/book-table' % (flag, text, flag))
        return os.path.expanduser(text)
    return parse


# What training takes and --page/--tables do not: given with them, they are refused. --record
# is taken by both: the tables are made of the record it names.
_RUN_FLAGS = ('seeds', 'warmup_steps', 'epochs', 'dtype', 'work_dir', 'train_limit',
              'test_limit')


def main(argv=None):
    """Entry point; returns the exit code (2 for bad input, 1 when a run failed)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    return run_command(PROG, argv, lambda: _main(build_parser().parse_args(argv)),
                       lambda e: {'saved': _saved})


def _saved(e, why):  # the failure table's clause on what a stop kept
    return ('; the finished epochs are recorded, give the same command again to continue'
            if isinstance(e, KeyboardInterrupt) else '')


def _main(args):
    if args.record:
        Parser.check_output('--record', args.record, suffixes=('.jsonl',),
                            example='docs/records/book-table.jsonl')
    try:
        pair = get_devices(2, args.device)
        find_data_dir(args.data_dir)
    except (ValueError, DataError, DataNotFoundError) as e:
        raise UsageError(str(e)) from None
    if args.page or args.tables:
        given = ['--' + k.replace('_', '-') for k in _RUN_FLAGS if getattr(args, k) is not None]
        if given:
            raise UsageError('{0} {1}: {0} trains nothing, so {1} would be ignored; leave {1} out'
                             .format('--page' if args.page else '--tables', given[0]))
        for path in write_page(pair, args.data_dir, tables_only=args.tables,
                               record=args.record, device=args.device):
            print('wrote', os.path.relpath(path, ROOT))
        return 0
    args.seeds = args.seeds or [0, 1, 2]
    args.epochs = args.epochs or RUN_EPOCHS
    args.dtype = args.dtype or 'float32'
    args.work_dir = args.work_dir or DEFAULT_WORK_DIR
    record = args.record or (DEFAULT_BF16_RECORD if args.dtype == 'bfloat16' else DEFAULT_RECORD)
    problem = output_problem(record)
    if problem:
        raise UsageError('--record %s: %s' % (record, problem))
    book_records.read_records(record)  # a bad record stops us before any run
    problem = work_dir_problem(args.work_dir)
    if problem:
        raise UsageError('--work-dir %s: %s; pass a folder you can write to'
                         % (args.work_dir, problem))
    runs = plan_runs(list(dict.fromkeys(args.seeds)), args.warmup_steps or 0, args.epochs,
                     args.train_limit, args.test_limit, args.dtype)
    for run in runs:  # the train commands' output goes to files of ours only
        problem = output_problem(log_file(args.work_dir, run))
        if problem:
            raise UsageError('--work-dir %s: %s %s; remove it or pass another --work-dir'
                             % (args.work_dir, log_file(args.work_dir, run), problem))
    print('running on:', format_devices(pair), flush=True)
    with DeferredInterrupt() as interrupt:
        def progress(line):
            print(line, flush=True)
            interrupt.check()  # a signal that landed inside a __del__ stops us between epochs
        try:
            run_table(runs, args.work_dir, record, pair, args.device, args.data_dir,
                      progress=progress)
        except CheckpointError as e:  # a folder of another run, or damaged: bad input
            raise UsageError(str(e)) from None
    print('all %d epochs recorded in %s; %s --page fills the page\'s tables'
          % (sum(r.epochs for r in runs), os.path.relpath(record, ROOT), PROG))
    return 0


if __name__ == '__main__':
    sys.exit(main())
