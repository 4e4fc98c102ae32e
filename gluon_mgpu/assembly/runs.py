"""A run, from its resolved settings to ``train``: ``run(Run)`` builds the data, the devices, the
network, its Trainer and the event handlers, trains, and prints the summary line. The train
command resolves one ``Run`` from its flags (``commands/train.py``: ``resolve``); the sweep builds
one per device count and calls the same ``run`` (docs/outputs.md).
"""
import argparse
import contextlib
import os
import re
import shlex
import sys

from ..commands.cli import UsageError
from ..runtime import files, startup
from ..runtime.choices import DIST_KVSTORES, JOB_KVSTORES

# A Run's fields that are not settings of the run: see Run.
DERIVED = ('given', 'now', 'argv', 'recorded', 'outputs', 'devices')
NOT_RECORDED = ('checkpoint_dir', 'resume', 'debug', 'force_dtype')  # not settings of a run
# Files a run writes outside its checkpoint folder, recorded with its settings.
OUTPUTS = ('metrics_json', 'plot', 'save_params')
JOINED = []  # the kvstore of the job this process joined, never freed (see _join_job)


def from_record(args):
    """The outputs a resume writes where its record, not this command line, names them:
    ``[(dest, '--flag path')]``."""
    return [(k, '--%s %s' % (k.replace('_', '-'), getattr(args, k))) for k in OUTPUTS
            if getattr(args, k) is not None and k not in args.now]


class Run(argparse.Namespace):
    """A run's settings, resolved once (``resolve``) and read-only: every flag's value with the
    per-device defaults filled in, ``given`` (the flags given, on ``--resume`` with the run's
    recorded ones), ``now`` and ``argv`` (those of this command line), ``num_workers``,
    ``outputs`` (``_check_outputs``'s, checked once) and ``recorded``: on ``--resume``, the
    settings its latest checkpoint records (a ``Run``; None for one that could not be read).

    A ``Run`` built directly (the sweep's, one per device count) names the settings it sets;
    the others are the train command's defaults below (``tests/test_sweep.py`` checks they
    agree). ``label``, for a setting of a sweep, starts its progress lines (``'2 devices, '``);
    the sweep has announced its devices and checked ``--dtype`` for all its settings, and its
    ``running on`` line also gives the batch and learning rate, which change between settings;
    ``devices``, the setting's, resolved with the others (``plan_sweep``; default: from
    ``num_gpus`` and ``device``); ``most_devices``, its largest setting's count, which its
    training images must cover before the first setting trains (default: ``num_gpus``).
    """

    kvstore, loader, model, parallel, balance = 'device', 'array', 'resnet18', 'data', 'even'
    checkpoint_dir = save_params = metrics_json = plot = warmup_steps = check_replicas = None
    device_weights = label = most_devices = devices = None
    resume = sync_bn = quiet = False
    num_workers, outputs = 1, {}

    def __init__(self, **settings):
        vars(self).update(settings)

    def __setattr__(self, name, value=None):
        raise AttributeError('Run.%s: a run is resolved once (resolve) and read-only' % name)

    __delattr__ = __setattr__


def network_name(args):
    """The network ``args`` describe, as checkpoints record it: ``resnet18(10)``."""
    from .. import model
    return model.network_name(args.model, args.num_gpus if args.sync_bn else None)


def check_dtype(prog, dtype, devices, force):
    """``precision.check_dtype``: its refusal a ``UsageError``, its notes warnings on stderr."""
    from ..runtime.precision import check_dtype as check
    try:
        notes = check(dtype, devices, force)
    except ValueError as e:
        raise UsageError('--dtype %s: %s' % (dtype, e)) from None
    for note in notes:
        print('%s: warning: --dtype %s: %s' % (prog, dtype, note), file=sys.stderr, flush=True)


def data_error(e, data_dir=None):
    """The ``UsageError`` for an error of ``load_data_fashion_mnist``."""
    from ..data import DataError, DataNotFoundError
    if isinstance(e, (DataError, DataNotFoundError)):
        flag = '' if data_dir is None else '--data-dir %s: ' % data_dir
        return UsageError('%s%s' % (flag, e))
    return UsageError(str(e).replace('train_limit', '--train-limit')
                      .replace('test_limit', '--test-limit')
                      .replace('or None for all', 'or leave it out for all'))


# Each device's replica of a network and its gradients, in float32 bytes (tests/test_cli.py
# counts them): resnet18 11,183,626 parameters (with BatchNorm's statistics), 11,175,818 trained.
REPLICA_BYTES = {'resnet18': (11183626 + 11175818) * 4, 'lenet': (44426 + 44426) * 4}


def devices_for(num_gpus, device, model=None):
    """``get_devices(num_gpus, device)``, with its refusal as the command's ``UsageError``; and
    ``check_memory`` for replicas of ``model`` on them."""
    from ..devices import get_devices
    flags = '--num-gpus %d --device %s' % (num_gpus, device)
    try:
        found = get_devices(num_gpus, device)
    except ValueError as e:
        raise UsageError('%s: %s' % (flags, e)) from None
    check_memory(found, model, flags)
    return found


# What training on simulated devices costs beyond what the process holds once its data is
# loaded, measured with MXNet 1.9.1 on 2 cores (resnet18 and lenet, 1 to 8 devices, batches of 2
# per device, hybridized): address space 768 MiB for the run (the engine's threads, oneDNN) and,
# per device, 96 MiB (its threads' stacks and malloc arenas) plus 3.5 times its replica with
# gradients (resnet18: 380 MiB per device); resident memory 3 times the replica per device.
RUN_COST = {'address': 768 << 20, 'resident': 0}
DEVICE_COST = {'address': (96 << 20, 3.5), 'resident': (0, 3.0)}


def check_memory(devices, model, flags):
    """``UsageError`` (naming ``flags``) when simulated CPU ``devices`` would hold more replicas of
    ``model`` (with their gradients, ``REPLICA_BYTES``) than this machine has memory, or would
    need more than this process may use (``ulimit -v``, a cgroup's limit: ``DEVICE_COST`` each
    beyond what the process uses now, an estimate the refusal says it is)."""
    from ..runtime import threads
    per_device, memory = REPLICA_BYTES.get(model), threads.memory_bytes()
    if not (per_device and len(devices) > 1 and all(d.device_type == 'cpu' for d in devices)):
        return
    n = len(devices)
    if memory and n * per_device > memory:
        raise UsageError('%s: %d simulated devices would each hold a replica of %s with its '
                         'gradients (%.1f MiB), %.1f GiB in all, more than this machine\'s %.1f '
                         'GiB of memory; pass --num-gpus %d or fewer'
                         % (flags, n, model, per_device / 2 ** 20, n * per_device / 2 ** 30,
                            memory / 2 ** 30, memory // per_device))
    used = dict(zip(('address', 'resident'), threads.memory_used()))
    for limit, what, kind in threads.memory_limits():
        fixed, times = DEVICE_COST[kind]
        cost, start = fixed + times * per_device, used[kind] + RUN_COST[kind]
        if start + n * cost > limit:
            fit = max(0, int((limit - start) // cost))
            raise UsageError('%s: %d simulated devices would need about %.1f GiB more %s '
                             '(estimated: about %d MiB each for a replica of %s, its gradients '
                             'and buffers%s, as measured with MXNet 1.9.1 on a 2-core machine), '
                             'but this process may use %.1f GiB (%s) and needs %.1f GiB '
                             'besides; pass --num-gpus %s, or raise the limit'
                             % (flags, n, n * cost / 2 ** 30, 'address space' if kind ==
                                'address' else 'memory', cost / 2 ** 20, model, ', its threads'
                                if fixed else '', limit / 2 ** 30, what, start / 2 ** 30,
                                '%d or fewer' % fit if fit > 1 else '1'))


def run(args, prog, handlers=(), resume=None, recorded_argv=None):
    """Train the ``Run`` ``args``, print the summary line and return what was trained.

    Parameters
    ----------
    args : Run
        The train command's ``resolve(argv)``, or a sweep's setting.
    prog : str
        The command, as its lines name it (``python -m gluon_mgpu.train``).
    handlers : list, optional
        Event handlers after the run's own: a ``DeferredInterrupt`` last, which raises a Ctrl-C
        that came inside a ``__del__`` (where Python drops it) right after that step or epoch.
    resume : callable, optional
        With ``--resume``, ``resume(args)`` verifies the latest checkpoint of
        ``--checkpoint-dir`` (locked by then) and returns its record (the train command's).
    recorded_argv : callable, optional
        With ``--checkpoint-dir``, ``recorded_argv(args)`` is the command line every checkpoint
        records (the train command's).

    Returns
    -------
    tuple
        ``(history, train_iter, test_iter)``: ``train``'s history, the data it used.
    """
    from ..handlers import checkpoint
    from ..runtime import horovod
    directory, record = args.checkpoint_dir, None
    with contextlib.ExitStack() as held:
        # Rank 0 of a Horovod job holds the folder and writes, the others read; --resume into
        # no folder is refused by resume, without making one.
        if directory and horovod.worker_rank() in (None, 0) and (
                os.path.isdir(directory) or not args.resume):
            try:
                held.enter_context(checkpoint.lock_dir(directory))
            except (checkpoint.CheckpointError, ValueError) as e:
                raise UsageError('--checkpoint-dir %s: %s' % (directory, e)) from None
        if args.resume:
            try:
                record = resume(args)
            except (checkpoint.CheckpointError, ValueError) as e:
                raise UsageError('--resume: %s' % e) from None
        elif directory:
            done = checkpoint.list_checkpoints(directory)
            if done:
                raise UsageError('--checkpoint-dir %s already holds the checkpoints of a run (up '
                                 'to epoch %d); add --resume to continue it, or pass another '
                                 'folder to start a new run' % (directory, done[-1]))
        # One writer per output: a dist job's workers share a command line, and rank 0 writes.
        for real, (flag, given) in args.outputs.items() if horovod.worker_rank() in (
                None, 0) and args.kvstore not in DIST_KVSTORES else ():
            try:
                held.enter_context(files.lock_file(real))
            except (OSError, ValueError) as e:
                raise UsageError('%s %s: %s' % (flag, given, e)) from None
        return _train(args, prog, list(handlers), record, recorded_argv)


def _train(args, prog, extra, record, recorded_argv):
    """``run`` once its folder and outputs are held: the data, the devices, the network and its
    handlers (``extra`` last), then ``train``."""
    from .. import data, devices as devices_mod
    from ..handlers import checkpoint, events, metrics, progress
    from ..parallel import dist
    try:
        train_iter, test_iter = data.load_data_fashion_mnist(
            args.batch_size, data_dir=args.data_dir, train_limit=args.train_limit,
            test_limit=args.test_limit, seed=args.seed, loader=args.loader)
    except (data.DataError, data.DataNotFoundError, ValueError) as e:
        raise data_error(e, args.data_dir) from None
    # After the data: the device check may log a warning, and bad input gets one line only.
    # The split networks of --parallel layers and channels hold no replicas.
    devices = args.devices or devices_for(
        args.num_gpus, args.device, args.model if args.parallel in ('data', 'scratch') else None)
    needed = args.most_devices or args.num_gpus  # a sweep's largest setting, before its first
    count = train_iter.num_examples  # after --train-limit
    if count < needed:
        raise UsageError('%sthe training data holds %d image%s, fewer than the %d devices, so '
                         'some device would get no data; pass --num-gpus %d or fewer, or a data '
                         'folder with more images' % ('' if args.data_dir is None else
                                                      '--data-dir %s: ' % args.data_dir, count,
                                                      '' if count == 1 else 's', needed, count))
    if args.sync_bn and len(devices) > 1 and os.environ.get('MXNET_ENGINE_TYPE') == 'NaiveEngine':
        raise UsageError('--sync-bn with MXNET_ENGINE_TYPE=NaiveEngine deadlocks (that engine '
                         'computes each operator in the thread that issues it, so the first '
                         'device\'s SyncBatchNorm waits for devices whose work is never issued); '
                         'unset MXNET_ENGINE_TYPE or drop --sync-bn')
    kvstore, rank, save_path, seed = args.kvstore, 0, args.save_params, args.seed
    if args.kvstore in JOB_KVSTORES:
        kvstore, seed = _join_job(args, prog, devices, train_iter)
        rank = kvstore.rank
    if save_path is not None and args.kvstore in dist.DIST_KVSTORES:
        save_path = dist.rank_path(save_path, rank)  # every worker saves its own copy
    lead = rank == 0  # the one worker of a job that prints and writes files
    mode = progress.choose_mode(quiet=args.quiet or not lead)
    if mode != 'quiet':
        where = devices_mod.format_devices(devices)
        if args.kvstore in JOB_KVSTORES:
            where += ' (worker 0 of %d, kvstore %s)' % (args.num_workers, args.kvstore)
        if args.label is not None:
            where += ' (global batch %d, lr %g%s)' % (
                args.batch_size, args.lr, '' if args.dtype == 'float32' else ', ' + args.dtype)
        print('running on:', where, flush=True)
    bar = progress.Progress(args.epochs, getattr(train_iter, 'examples_per_epoch', None), mode,
                            label=args.label or '')
    handlers = [events.LossGuard(), bar]
    if args.parallel == 'data':
        if args.label is None:
            check_dtype(prog, args.dtype, devices, args.force_dtype)
        net, placement, fit = _data_parallel(args, rank, seed, record, devices, kvstore, mode,
                                             handlers, test_iter)
    else:
        net, placement, fit = _split_parallel(args, devices, mode, handlers, test_iter)
    if args.checkpoint_dir is not None:  # only rank 0 of a job writes
        handlers.append(checkpoint.CheckpointHandler(None if rank else args.checkpoint_dir, {
            'argv': recorded_argv(args), 'network': network_name(args), 'workers': args.num_workers,
            'devices': [str(d) for d in devices]}, resume=record))
    if lead:
        handlers += _file_handlers(args, devices, placement)
    try:
        history = fit(train_iter, test_iter, handlers + extra)
    finally:
        bar.close()  # also when training stops with an error
    # --save-params: a dist worker saves to its .rank<r> path; a Horovod worker has the same
    # parameters as rank 0, which saves them.
    if save_path is not None and (lead or args.kvstore != 'horovod'):
        with files.atomic_path(save_path) as tmp:
            net.save_parameters(tmp)
    if lead:
        print(metrics.format_summary(history, devices), flush=True)
    return history, train_iter, test_iter


def _file_handlers(args, devices, placement=None):
    """The handlers that write ``--metrics-json`` and ``--plot``."""
    from .. import devices as devices_mod
    from ..handlers import metrics, plotting
    handlers = []
    if args.metrics_json:
        try:
            handlers.append(metrics.MetricsFile(
                args.metrics_json, {k: v for k, v in vars(args).items() if k not in DERIVED},
                devices, placement))
        except files.OutputError as e:
            raise UsageError('--metrics-json: %s' % e) from None
    if args.plot:
        network = 'LeNet' if args.model == 'lenet' else 'ResNet-18'
        if args.parallel != 'data':
            network += ' split by %s' % args.parallel
        handlers.append(plotting.PlotHandler(args.plot, title='%s, Fashion-MNIST: %s, batch %d, '
                                             'lr %g' % (network, devices_mod.format_devices(
                                                 devices), args.batch_size, args.lr)))
    return handlers


def _data_parallel(args, rank, seed, record, devices, kvstore, mode, handlers, test_iter):
    """The chapter's network (``training.new_network``; with ``--sync-bn``, BatchNorm over all
    ``devices``), its Trainer (``training.init_training``) and handlers (``--parallel data``);
    ``(net, None, fit)``, ``fit`` trains them with ``training.train``."""
    from .. import training
    from ..handlers import checkpoint, events, replica_check
    net = training.new_network(args.model, args.hybridize, len(devices) if args.sync_bn else None,
                               args.dtype)
    trainer = training.init_training(net, devices, args.lr, seed, kvstore, args.dtype,
                                     args.force_dtype)
    if args.warmup_steps is not None:
        handlers.append(events.LinearWarmup(args.warmup_steps, args.lr))
    if record is not None:
        try:
            checkpoint.restore(args.checkpoint_dir, record, net, trainer, devices)
        except checkpoint.CheckpointError as e:
            raise UsageError('--resume: %s' % e) from None
        trainer.set_learning_rate(args.lr)
        if mode != 'quiet':
            print('resuming after epoch %d of %d from %s' % (record['epoch'], args.epochs,
                  checkpoint.checkpoint_path(args.checkpoint_dir, record['epoch'], 'json')),
                  flush=True)
            taken = [flag for _, flag in from_record(args)]
            if taken:
                print('writing %s, as the run\'s record says' % ', '.join(taken), flush=True)
    split_f, line = _split(args, net, devices, test_iter)
    if line is not None and mode != 'quiet':
        print(line, flush=True)
    if args.check_replicas is not None:
        handlers.append(replica_check.ReplicaCheck(args.check_replicas, verbose=mode != 'quiet'))

    def fit(train_iter, test_iter, handlers):  # the chapter's trainer.step(batch_size): each
        return training.train(net, train_iter, test_iter, devices, args.epochs, trainer, handlers,
                              split_f or training.split_batch,  # worker's share of the batch
                              args.batch_size // args.num_workers)
    return net, None, fit


def _split_parallel(args, devices, mode, handlers, test_iter):
    """``--parallel scratch|layers|channels``: the split network (it saves an ordinary
    ``.params`` file) and its handlers; ``(split, placement, fit)``."""
    from .. import parallel, training
    from ..handlers import replica_check
    from ..replicas.placement import format_bytes
    import mxnet as mx
    X, _ = next(iter(test_iter))  # a batch of the run's size, to measure the bytes
    if args.seed is not None:
        mx.random.seed(args.seed)
    try:
        if args.parallel == 'scratch':
            split = parallel.make_parallel('scratch', devices, args.lr)
        else:
            net = parallel.init_one_device(training.new_network(args.model, hybridize=False),
                                           devices[0])
            split = parallel.make_parallel(args.parallel, devices, args.lr, net=net,
                                           micro_batches=args.micro_batches, cut=args.cut,
                                           sample=X.as_in_context(devices[0]))
    except ValueError as e:
        raise UsageError('--parallel %s: %s' % (args.parallel, e)) from None
    placement = split.summary(X)
    if args.hybridize and args.parallel != 'scratch':
        split.hybridize(static_alloc=True)
    if mode != 'quiet':
        if hasattr(split, 'describe'):
            print('split: %s' % split.describe(), flush=True)
        params, activations = (', '.join(map(format_bytes, placement[k]))
                               for k in ('parameter_bytes', 'activation_bytes'))
        print('bytes per device: parameters %s; activations of a batch of %d: %s; copied per '
              'step: %s' % (params, placement['batch_size'], activations,
                            format_bytes(placement['copied_bytes_per_step'])), flush=True)
    if args.check_replicas is not None:
        handlers.append(replica_check.PlacementCheck(verbose=mode != 'quiet'))

    def fit(train_iter, test_iter, handlers):
        return parallel.train_split(split, train_iter, test_iter, args.lr, args.epochs, handlers,
                                    batch_size=args.batch_size)
    return split, placement, fit


def _join_job(args, prog, devices, train_iter):
    """Join a job of several processes (``dist_sync``'s servers or Horovod's ring), take this
    worker's shard and check that every worker trains the same run; return the kvstore and
    the job's shared seed."""
    from ..parallel import dist
    workers = args.num_workers
    if args.batch_size % workers or args.batch_size // workers < len(devices):
        share = max(workers * len(devices), args.batch_size // workers * workers)
        raise UsageError('--batch-size %d cannot be shared by %d workers with %d device(s) '
                         'each (every worker takes an equal share, at least one example per '
                         'device); pass --batch-size %d'
                         % (args.batch_size, workers, len(devices), share))
    if args.save_params is not None and args.kvstore in dist.DIST_KVSTORES:
        _check_rank_paths(args.save_params, workers)
    try:
        train_iter.set_part(workers, 0)
    except ValueError as e:
        raise UsageError('--kvstore %s: %s (--train-limit %s, --batch-size %d)'
                         % (args.kvstore, e, args.train_limit, args.batch_size)) from None
    kv = startup.join_job(args.kvstore, prog,  # waits for every process of the job
                          None if args.kvstore == 'horovod' else dist.job_env()['root'])
    # From here on, leaving normally would wait for the other workers (see main); so would
    # freeing the kvstore (MXNet's barrier), so it is held until a failed worker's os._exit.
    JOINED.append(kv)
    train_iter.set_part(kv.num_workers, kv.rank)
    # Every setting of the run (not where files go, nor what is printed) as rank 0's, seed
    # included: workers started by hand with other flags hung, or trained another run.
    skip = NOT_RECORDED + OUTPUTS + DERIVED + ('num_workers', 'data_dir', 'quiet')
    settings = {k: v for k, v in vars(args).items() if k not in skip}
    try:
        seed = train_iter.seed = dist.shared_run(
            kv, dict(settings, seed=args.given.get('seed')), args.seed)
    except ValueError as e:
        raise UsageError(str(e)) from None
    return kv, seed


def _check_rank_paths(path, workers):
    """Before the job is joined (a worker that fails after it waits for the others at MXNet's
    barrier): every worker's ``--save-params`` file, ``.rank<r>``, can be written. A dist job
    keeps no checkpoints, so one found unwritable after the last epoch would lose the run."""
    from ..parallel import dist
    root, ext = os.path.splitext(os.path.basename(path))
    own = re.compile(re.escape(root) + r'\.rank(0|[1-9][0-9]{0,9})' + re.escape(ext) + r'\Z')
    try:
        present = os.listdir(os.path.dirname(os.path.abspath(path)))
    except OSError:
        present = []
    ranks = {0} | {int(m[1]) for m in map(own.match, present) if m and int(m[1]) < workers}
    for rank in sorted(ranks):
        problem = files.output_problem(dist.rank_path(path, rank))
        if problem:
            raise UsageError('--save-params %s: worker %d saves to %s: %s'
                             % (path, rank, dist.rank_path(path, rank), problem))


def _split(args, net, devices, test_iter):
    """The split of --device-weights, or measured for --balance auto (None: the book's even
    split); and its line, or None."""
    from ..parallel import weighted
    weights, measured = args.device_weights, args.balance == 'auto'
    if measured:
        X, y = next(iter(test_iter))
        share = max(1, min(X.shape[0], args.batch_size // args.num_workers // len(devices)))
        weights = weighted.measure_device_speeds(net, X[:share], y[:share], devices)
    if weights is None:
        return None, None
    batch = args.batch_size // args.num_workers
    values = ', '.join('%s %s' % (d, ('%.1f' % w) if measured else ('%g' % w))
                       for d, w in zip(devices, weights))
    line = 'device weights: %s%s -> slices of %s per batch of %d' % (
        values, ' images/s (measured)' if measured else '',
        ', '.join(map(str, weighted.slice_sizes(batch, weights))), batch)
    return weighted.split_by_weights(weights), line


def kept(args, prog, e, why):
    """What the failed run ``args`` kept (``cli.failure``'s ``saved``, ``why`` its failure): its
    checkpoints and how to resume with ``prog``; after divergence, where to start again."""
    from ..handlers import checkpoint
    directory, diverged = args.checkpoint_dir, why == 'training diverged'
    if why is None or (directory is None and diverged):
        return ''
    if directory is None:
        return '; nothing was saved (pass --checkpoint-dir DIR to keep every finished epoch)'
    done = (checkpoint.list_checkpoints(directory) or [0])[-1]
    resume = '%s --checkpoint-dir %s --resume' % (prog, shlex.quote(directory))
    if diverged:
        with contextlib.suppress(checkpoint.CheckpointError):  # changed since: --resume says
            record = done and checkpoint.read_checkpoint(directory, done)
            if record and checkpoint.nonfinite(directory, record):
                return (', in a new --checkpoint-dir (the checkpoint of epoch %d holds NaN or '
                        'infinite values)' % done)  # its loss was finite, its arrays are not
        return (', in a new --checkpoint-dir, or continue from epoch %d, the last checkpoint '
                'with a finite loss: %s --lr %g' % (done, resume, args.lr / 10) if done else '')
    if done == 0:
        return '%s %s holds no checkpoint yet; run the same command again to start over' % (
            ' before the first epoch finished, so' if isinstance(e, KeyboardInterrupt) else ';',
            directory)
    return '; the checkpoint of epoch %d in %s is complete; to resume: %s' % (done, directory,
                                                                             resume)
