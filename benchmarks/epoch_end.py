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
        --output docs/epoch-end.json

An epoch at the book's settings: 30 to 60 minutes on 2 cores, plus about 20 s per probe.
"""
import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

TEST_BATCH = 500
SETTINGS = ('batch_size', 'lr', 'seed', 'num_gpus', 'train_limit', 'test_limit')


def checkpoint_json(directory, epoch):
    """The JSON of a saved epoch, read with the standard library only (before MXNet starts)."""
    with open(os.path.join(directory, 'epoch-%04d.json' % epoch)) as f:
        return json.load(f)


def probe_steps(steps_per_epoch, every, last):
    """Every ``every``-th step, and each of the last ``last`` steps (from 1), ascending."""
    chosen = set(range(every, steps_per_epoch + 1, every)) if every else set()
    chosen |= set(range(max(1, steps_per_epoch - last + 1), steps_per_epoch + 1))
    return sorted(chosen)


def settings(record):
    """The settings of a checkpoint's run that the replay needs, by name (format 3 keeps them
    as ``args``; format 4 as its command line)."""
    if 'args' in record:
        return {k: record['args'][k] for k in SETTINGS}
    from gluon_mgpu.commands import train
    parsed = train.parse_args(record['argv'])
    return {k: getattr(parsed, k) for k in SETTINGS}


def replay(directory, record, test_limit, every, last, data_dir=None, decompose=0):
    """Train the epoch after checkpoint ``record`` again, probing device 0's test accuracy.

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

    run = settings(record)
    batch_size = run['batch_size']
    devices = devices_mod.get_devices(run['num_gpus'])
    net = training.new_network('resnet18', hybridize=True)
    trainer = training.init_training(net, devices, run['lr'])
    checkpoint.restore(directory, record, net, trainer, devices)
    train_iter, test_iter = data.load_data_fashion_mnist(
        batch_size, data_dir, seed=run['seed'], train_limit=run['train_limit'],
        test_limit=run['test_limit'])
    test_x, test_y = data.load_fashion_mnist_arrays('test', data_dir)
    probe_iter = data.ArrayBatches(test_x[:test_limit], test_y[:test_limit], TEST_BATCH)
    train_iter.set_min_batch(len(devices))  # as train() does
    steps = len(train_iter)
    split = probe_steps(steps, 0, decompose) if decompose else []
    probe = Probe(sorted(set(probe_steps(steps, every, last)) | set(split)), split)
    # The run's history and data order, without saving (the train command's --resume).
    resume = checkpoint.CheckpointHandler(None, {}, resume=record)
    start = time.time()
    history = training.train(net, train_iter, test_iter, devices, num_epochs=record['epoch'] + 1,
                             trainer=trainer, event_handlers=[resume, probe, EpochLine()],
                             batch_size=batch_size)
    result = {'checkpoint_dir': os.path.abspath(directory), 'from_epoch': record['epoch'],
              'epoch': record['epoch'] + 1, 'steps': steps, 'test_limit': test_limit,
              'probes': probe.rows, 'test_acc_split': history[-1]['test_acc'],
              'test_acc_device0': training.evaluate_accuracy(test_iter, net, devices[:1]),
              'seconds': time.time() - start}
    if record['epoch'] + 1 in checkpoint.list_checkpoints(directory):
        saved = nd.load(checkpoint.checkpoint_path(directory, record['epoch'] + 1, 'params'))
        replicas = nd.load(checkpoint.checkpoint_path(directory, record['epoch'] + 1,
                                                      'replicas'))
        worst, copies = 0.0, 0
        for name, param in net._collect_params_with_prefix().items():
            for i, copy in enumerate(param.list_data()):
                want = replicas.get('%s@%d' % (name, i), saved[name]).asnumpy()
                worst = max(worst, float(np.abs(copy.asnumpy() - want).max()))
                copies += 1
        result['replay'] = {'copies': copies, 'max_abs_difference': worst,
                            'bit_equal': worst == 0.0}
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(prog='benchmarks/epoch_end.py', description=__doc__.split(
        '\n\n')[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--checkpoint-dir', required=True, help='a run of the book table')
    parser.add_argument('--from-epoch', type=int, required=True,
                        help='the saved epoch to start from; the next one is trained')
    parser.add_argument('--test-limit', type=int, default=2000)
    parser.add_argument('--every', type=int, default=10)
    parser.add_argument('--last', type=int, default=20)
    parser.add_argument('--output', help='write the result as JSON here')
    parser.add_argument('--data-dir', help="Fashion-MNIST's folder (default: searched)")
    parser.add_argument('--decompose', type=int, default=0,
                        help="for each of the last N steps, also test the step's new weights "
                             "and its new running statistics apart")
    args = parser.parse_args(argv)
    try:
        record = checkpoint_json(args.checkpoint_dir, args.from_epoch)
        devices = len(record['devices'])
    except (OSError, ValueError, KeyError, TypeError) as e:
        parser.error('--checkpoint-dir %s --from-epoch %d: no checkpoint of a run to start from '
                     '(%s); give a folder of the book table\'s runs and one of its saved epochs'
                     % (args.checkpoint_dir, args.from_epoch, e))
    # The run's threads: the train command chose them for its device count; with another
    # count the sums run in another order and the replay parts from the run within a few steps.
    os.environ.setdefault('GLUON_MGPU_CPU_DEVICES', str(devices))
    from gluon_mgpu.handlers.checkpoint import CheckpointError
    from gluon_mgpu.runtime.files import atomic_path, output_problem
    problem = args.output and output_problem(args.output)
    if problem:  # before the epoch's training, not after it
        parser.error('--output %s: %s' % (args.output, problem))
    try:
        result = replay(args.checkpoint_dir, record, args.test_limit, args.every, args.last,
                        args.data_dir, args.decompose)
    except CheckpointError as e:
        parser.error(str(e))
    print(json.dumps({k: v for k, v in result.items() if k != 'probes'}), flush=True)
    if args.output:
        with atomic_path(args.output) as tmp, open(tmp, 'w') as f:
            json.dump(result, f, indent=1)
            f.write('\n')
    return 0 if result.get('replay', {}).get('bit_equal', True) else 1


if __name__ == '__main__':
    sys.exit(main())
