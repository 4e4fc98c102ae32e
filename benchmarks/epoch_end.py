"""How the book's measure moves over the steps of one epoch: a paired experiment from one saved
state of the book table's runs (issue 32, item 7; docs/book-comparison.md, "Diagnosis").

The epoch after a saved checkpoint is trained again with ``gluon_mgpu.train`` as the train
command trains it (the same weights, per-device statistics, data order, step and threads), and
the test accuracy the book prints, device 0's running statistics, is read on the first
``--test-limit`` test images after chosen steps: every ``--every`` steps, and after each of the
last ``--last`` steps. The run's own checkpoint of that epoch, when there is one, checks the
replay: every weight and running statistic on every device must come out equal bit for bit
(exit 1 if not).

    .venv/bin/python benchmarks/epoch_end.py --checkpoint-dir RUN --from-epoch 2 \\
        --output docs/records/epoch-end.json

An epoch at the book's settings: 30 to 60 minutes on 2 cores, plus about 20 s per probe.
"""
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from gluon_mgpu.commands import cli  # noqa: E402  (no MXNet: the threads are chosen later)
from gluon_mgpu.runtime import files, startup  # noqa: E402

PROG = 'benchmarks/epoch_end.py'
TEST_BATCH = 500
# Format 3, the book table's runs (commit 9bf9b9a), recorded its settings as a dict; these are
# the ones the replay needs, read again as the train command's flags.
_FORMAT_3 = 'gluon_mgpu checkpoint 3'
_FORMAT_3_FLAGS = ('num_gpus', 'batch_size', 'lr', 'seed', 'train_limit', 'test_limit', 'dtype',
                   'model', 'warmup_steps', 'kvstore')


def checkpoint_json(directory, epoch):
    """The JSON of a saved epoch, read with the standard library only (before MXNet starts);
    ``cli.UsageError`` for a file that is none."""
    path = os.path.join(directory, 'epoch-%04d.json' % epoch)
    try:
        record = files.read_json(path)
        if not (isinstance(record, dict) and isinstance(record.get('devices'), list)
                and 1 <= len(record['devices']) <= 1024):
            raise ValueError('it lists no devices')
        return record
    except files.InputError as e:
        reason = e.reason
    except (OSError, ValueError) as e:
        reason = 'cannot be read (%s)' % (getattr(e, 'strerror', None) or str(e)[:100] or 'empty')
    raise cli.UsageError('--checkpoint-dir %s --from-epoch %d: %s %s; give a folder of the book '
                         'table\'s runs and one of its saved epochs' % (directory, epoch, path,
                                                                        reason))


def read_run(directory, epoch, record):
    """Checkpoint ``record`` of epoch ``epoch`` in ``directory``, checked as the package checks
    its own (a format-3 record of the book table's runs is read as the format it would be
    today), and the run's settings; ``CheckpointError`` for a checkpoint that is not one of the
    book table's float32 runs."""
    from gluon_mgpu.commands import train
    from gluon_mgpu.handlers import checkpoint
    if record.get('format') == _FORMAT_3:
        args, optimizer = record.get('args'), record.get('optimizer')
        files_ = record.get('files')
        states = optimizer.get('states') if isinstance(optimizer, dict) else None
        if not (isinstance(args, dict) and isinstance(files_, dict) and isinstance(states, dict)
                and not any(states.values())):
            raise checkpoint.not_ours(checkpoint.checkpoint_path(directory, epoch, 'json'),
                                      'it is no format-3 checkpoint of an SGD run')
        record = dict(record, format=checkpoint.FORMAT, optimizer={
            k: optimizer.get(k) for k in ('lr', 'num_update')}, files={
            k: files_.get(k) for k in checkpoint.KINDS}, argv=[
            '--%s=%s' % (k.replace('_', '-'), args[k]) for k in _FORMAT_3_FLAGS
            if args.get(k) is not None])
    record = checkpoint.read_checkpoint(directory, epoch, record)
    run = train.recorded_settings(directory, record)
    import book_table
    differ = book_table.settings_difference(book_table.Run(
        run.num_gpus, run.seed, run.warmup_steps or 0, run.epochs, run.train_limit,
        run.test_limit, run.dtype), run, ignore=('batch_size', 'lr'))  # replayed as they were
    differ += ['--dtype %s' % run.dtype] if run.dtype != 'float32' else []
    differ += ['--warmup-steps %d' % run.warmup_steps] if run.warmup_steps else []
    if differ or len(record['devices']) != run.num_gpus:
        why = ', '.join(differ or ['devices %s' % json.dumps(record['devices'])[:60]])[:200]
        raise checkpoint.CheckpointError(
            '%s is not a run the replay trains as it was (%s): it replays the book table\'s '
            'float32 runs without warmup' % (checkpoint.checkpoint_path(directory, epoch, 'json'),
                                             why))
    return record, run


def probe_steps(steps_per_epoch, every, last):
    """Every ``every``-th step, and each of the last ``last`` steps (from 1), ascending."""
    chosen = set(range(every, steps_per_epoch + 1, every)) if every else set()
    chosen |= set(range(max(1, steps_per_epoch - last + 1), steps_per_epoch + 1))
    return sorted(chosen)


def _saved_epoch(directory, epoch, net):
    """The run's own checkpoint of ``epoch``, if it saved one, as ``(params, replicas)`` (dicts
    of arrays by name; a 1-device run's replicas are empty), read before the replay trains so
    that a file it cannot compare with is one line, not an error after the epoch. Its sha256 is
    not checked: a changed file is what the comparison reports."""
    from mxnet import nd
    from gluon_mgpu.handlers import checkpoint
    if epoch not in checkpoint.list_checkpoints(directory):
        return None
    found = []
    for kind in checkpoint.KINDS:
        path = checkpoint.checkpoint_path(directory, epoch, kind)
        try:
            arrays = nd.load(path) or {}  # nd.save of an empty dict loads back as []
        except Exception as e:  # MXNetError for a file that holds no arrays
            raise checkpoint.not_ours(path, 'it cannot be loaded (%s)'
                                      % (str(e).splitlines() or ['empty'])[0][:100]) from None
        if not isinstance(arrays, dict):
            raise checkpoint.not_ours(path, 'it holds arrays without names')
        found.append(arrays)
    params = net._collect_params_with_prefix()
    for kind, arrays in zip(checkpoint.KINDS, found):
        names = {key: key.rsplit('@', 1)[0] if kind == 'replicas' else key for key in arrays}
        missing = sorted(set(params) - set(names.values())) if kind == 'params' else []
        wrong = [key for key in sorted(arrays) if names[key] not in params
                 or arrays[key].shape != params[names[key]].shape]
        if missing or wrong:
            raise checkpoint.not_ours(
                checkpoint.checkpoint_path(directory, epoch, kind),
                'it lacks %s' % missing[0] if missing else 'it holds %s of shape %s, which is no '
                'parameter of the network' % (wrong[0][:80], arrays[wrong[0]].shape))
    return tuple(found)


def replay(directory, record, run, test_limit, every, last, data_dir=None, decompose=0,
           interrupt=None):
    """Train the epoch after checkpoint ``record`` (of ``run``, both from ``read_run``) again,
    probing device 0's test accuracy.

    Returns
    -------
    dict
        ``probes`` (``step``, ``acc_device0`` on the first ``test_limit`` test images), the
        epoch's test accuracy split over the devices (``test_acc_split``, what the train
        command prints) and on device 0 (``test_acc_device0``, the book's), and ``replay``
        (``bit_equal``, ``max_abs_difference`` over every copy) when the run saved that epoch.
        For each of the last ``decompose`` steps a probe also gives what the step's two parts
        do apart on device 0: ``acc_weights_only`` (the step's new weights with the running
        statistics from before it) and ``acc_stats_only`` (the weights from before it with its
        new running statistics); the values are put back before training goes on.
    """
    import gluon_mgpu  # noqa: F401  (first: it sets the threads MXNet starts with)
    import numpy as np
    from mxnet import nd
    from gluon_mgpu import data, devices as devices_mod, training
    from gluon_mgpu.handlers import checkpoint
    from gluon_mgpu.handlers.events import BatchBegin, BatchEnd, EpochLine

    def device0(net):
        return {name: p.data(devices[0]) for name, p in
                net._collect_params_with_prefix().items()}

    def is_stat(name):
        return name.endswith(('running_mean', 'running_var'))

    class Probe(BatchBegin, BatchEnd):
        def __init__(self, steps, split):
            self.steps, self.split, self.step, self.rows = set(steps), set(split), 0, []
            self.before = None

        def batch_begin(self, estimator, *args, **kwargs):
            if self.step + 1 in self.split:
                self.before = {k: v.copy() for k, v in device0(estimator.net).items()}

        def acc(self, net):
            return training.evaluate_accuracy(probe_iter, net, devices[:1])

        def batch_end(self, estimator, *args, **kwargs):
            self.step += 1
            if self.step not in self.steps:
                return False
            row = {'step': self.step, 'acc_device0': self.acc(estimator.net)}
            if self.step in self.split:
                arrays = device0(estimator.net)
                after = {k: v.copy() for k, v in arrays.items()}
                for key, stats in (('acc_weights_only', True), ('acc_stats_only', False)):
                    for k, v in arrays.items():
                        v[:] = self.before[k] if is_stat(k) == stats else after[k]
                    row[key] = self.acc(estimator.net)
                for k, v in arrays.items():
                    v[:] = after[k]
                nd.waitall()
            self.rows.append(row)
            print('step %d: %s' % (self.step, ', '.join('%s %.4f' % (k, v) for k, v in row.items()
                                                        if k != 'step')), flush=True)
            return False

    batch_size = run.batch_size
    devices = devices_mod.get_devices(run.num_gpus)
    net = training.new_network('resnet18', hybridize=True)
    trainer = training.init_training(net, devices, run.lr)
    checkpoint.restore(directory, record, net, trainer, devices)
    train_iter, test_iter = data.load_data_fashion_mnist(
        batch_size, data_dir, seed=run.seed, train_limit=run.train_limit,
        test_limit=run.test_limit)
    test_x, test_y = data.load_fashion_mnist_arrays('test', data_dir)
    probe_iter = data.ArrayBatches(test_x[:test_limit], test_y[:test_limit], TEST_BATCH)
    train_iter.set_min_batch(len(devices))  # as train() does
    steps = len(train_iter)
    split = probe_steps(steps, 0, decompose) if decompose else []
    probe = Probe(sorted(set(probe_steps(steps, every, last)) | set(split)), split)
    target = _saved_epoch(directory, record['epoch'] + 1, net)  # checked before training
    # The run's history and data order, without saving (the train command's --resume).
    resume = checkpoint.CheckpointHandler(None, {}, resume=record)
    start = time.time()
    history = training.train(net, train_iter, test_iter, devices, num_epochs=record['epoch'] + 1,
                             trainer=trainer, event_handlers=[resume, probe, EpochLine()] + (
                                 [interrupt] if interrupt is not None else []),
                             batch_size=batch_size)
    result = {'checkpoint_dir': os.path.abspath(directory), 'from_epoch': record['epoch'],
              'epoch': record['epoch'] + 1, 'steps': steps, 'test_limit': test_limit,
              'probes': probe.rows, 'test_acc_split': history[-1]['test_acc'],
              'test_acc_device0': training.evaluate_accuracy(test_iter, net, devices[:1]),
              'seconds': time.time() - start}
    if target:
        saved, replicas = target
        worst, copies = 0.0, 0
        for name, param in net._collect_params_with_prefix().items():
            for i, copy in enumerate(param.list_data()):
                want = replicas.get('%s@%d' % (name, i), saved[name]).asnumpy()
                worst = max(worst, float(np.abs(copy.asnumpy() - want).max()))
                copies += 1
        result['replay'] = {'copies': copies, 'max_abs_difference': worst,
                            'bit_equal': worst == 0.0}
    return result


def build_parser():
    p = cli.Parser(prog=PROG, description=__doc__.split('\n\n')[0])
    p.add_argument('--checkpoint-dir', required=True, help='a run of the book table')
    p.add_argument('--from-epoch', type=cli.whole('--from-epoch'), required=True,
                   help='the saved epoch to start from; the next one is trained')
    p.add_argument('--test-limit', type=cli.whole('--test-limit', 1, 10000), default=2000,
                   help='the probes test on the first N test images (default: 2000)')
    p.add_argument('--every', type=cli.whole('--every', 0), default=10,
                   help='probe every N steps, 0 for none (default: 10)')
    p.add_argument('--last', type=cli.whole('--last', 0), default=20,
                   help='probe after each of the last N steps (default: 20)')
    p.add_argument('--decompose', type=cli.whole('--decompose', 0), default=0,
                   help="for each of the last N steps, also test the step's new weights and its "
                        "new running statistics apart (default: 0)")
    p.add_argument('--output', type=cli.output_file('--output', 'epoch-end.json'),
                   help='write the result as JSON here (checked before the epoch trains)')
    p.add_argument('--data-dir', help="Fashion-MNIST's folder (default: searched)")
    return p


def main(argv=None):
    """Entry point; returns the exit code: 0, 1 when the replay is not the run's epoch or a
    file cannot be written, 2 for bad input, 130/143 when stopped."""
    argv = sys.argv[1:] if argv is None else list(argv)
    return cli.run_command(PROG, argv, lambda: _main(build_parser().parse_args(argv)),
                           lambda e: {'own': _explain(e)})


def _explain(e, prog=PROG):
    from gluon_mgpu.handlers.checkpoint import CheckpointError
    if isinstance(e, CheckpointError):
        return 2, cli.error_line(prog, e)
    if isinstance(e, files.OutputError):
        return 1, cli.error_line(prog, e)
    return None


def _main(args):
    if args.output:
        cli.check_output('--output', args.output, suffixes=('.json',), example='epoch-end.json')
    # SIGTERM or SIGHUP, before MXNet or while it loads: one line and 143 or 129, never silent.
    with startup.starting(PROG):
        record = checkpoint_json(args.checkpoint_dir, args.from_epoch)
        # The run's threads: the train command chose them for its device count; with another
        # count the sums run in another order and the replay parts from the run within a few
        # steps.
        startup.before_mxnet(PROG, len(record['devices']))
        from gluon_mgpu.handlers.interrupts import DeferredInterrupt
    with DeferredInterrupt() as interrupt:  # then as the train command: raised after the step
        return _replay(args, record, interrupt)


def _replay(args, record, interrupt):
    from gluon_mgpu.assembly.runs import data_error
    from gluon_mgpu.data import DataError, DataNotFoundError, find_data_dir
    try:
        find_data_dir(args.data_dir)
    except (DataError, DataNotFoundError) as e:
        raise data_error(e, args.data_dir) from None
    record, run = read_run(args.checkpoint_dir, args.from_epoch, record)
    result = replay(args.checkpoint_dir, record, run, args.test_limit, args.every, args.last,
                    args.data_dir, args.decompose, interrupt)
    if args.output:  # first: a standard output that fails then loses nothing
        with files.atomic_path(args.output) as tmp, open(tmp, 'w') as f:
            json.dump(result, f, indent=1)
            f.write('\n')
    print(json.dumps({k: v for k, v in result.items() if k != 'probes'}), flush=True)
    return 0 if result.get('replay', {}).get('bit_equal', True) else 1


if __name__ == '__main__':
    sys.exit(main())
