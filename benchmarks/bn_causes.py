"""Why our 1-device runs sit low: the three causes docs/book-comparison.md names, each tested on
one saved state of the book table's runs (issue 52, item 3; "Do our runs sit low?").

The weights of checkpoint ``--epoch`` stay as they are; only device 0's BatchNorm running
statistics change, and the test accuracy the book prints (device 0, running statistics) is read
on the first ``--test-limit`` test images after each change, paired on the same images:

- ``saved``: the statistics as the run left them (the book's measure);
- ``cudnn_variance``: as cuDNN would have kept them. MXNet on the CPU updates the running
  variance with the batch's biased variance (checked here on one layer, exactly); cuDNN
  (``cudnnBatchNormalizationForwardTraining``) with the unbiased one, so over a run every
  layer's running variance is larger by ``N / (N - 1)``, ``N`` its values per channel in a
  batch (images times height times width). ``N`` is taken from the epoch's last batch, the
  short one (96 images at the book's setting), so this is the largest correction cuDNN makes;
- ``without_last_batch``: the epoch's last batch's update taken back (the short one at the
  book's setting; its statistics computed on the saved weights: ``(R - 0.1 B) / 0.9``);
- ``fixed_weights_own_order``: the running statistics rebuilt at the saved weights from precise
  BatchNorm (the first 512 training images) by the training update (momentum 0.9) over the
  epoch's own last ``--batches`` batches, the short one last: the same batches and the same
  average as ``saved``, but no lag behind weights that moved while it was taken;
- ``fixed_weights_other_order``: the same over another data order's last batches (the order of
  seed ``seed + 1000`` at that epoch): how far the data order alone moves the measure;
- ``precise_bn``: the statistics of the first 512 training images (the table's column).

    .venv/bin/python benchmarks/bn_causes.py --checkpoint-dir RUN --epoch 3 \\
        --output docs/records/bn-causes-1dev-seed3-e3.json

About 2 minutes per read of 2,000 test images and 40 s per batch on 2 busy cores.
"""
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import book_table  # noqa: E402  (imports the package first: its thread settings)
import epoch_end  # noqa: E402

from gluon_mgpu.commands import cli  # noqa: E402
from gluon_mgpu.runtime import files  # noqa: E402

PROG = 'benchmarks/bn_causes.py'
MOMENTUM = 0.9  # gluon.nn.BatchNorm's default, the chapter's


def _stats(net, device):
    """Device ``device``'s running statistics of ``net``, copied, by their place in the network
    (``'3.0.bn1.running_var'``: the same in every copy of it, unlike ``Parameter.name``)."""
    return {k: p.data(device).copy() for k, p in net._collect_params_with_prefix().items()
            if k.endswith(('running_mean', 'running_var'))}


def _put(net, device, stats):
    params = net._collect_params_with_prefix()
    for k, v in stats.items():
        params[k].data(device)[:] = v


def cudnn_variance(stats, counts):
    """``stats`` (``_stats``) with every running variance times ``N / (N - 1)``, ``N`` from
    ``counts`` by the same names: cuDNN's unbiased variance averaged over a run."""
    return {k: v * (counts[k] / (counts[k] - 1.0)) if k.endswith('running_var') else v
            for k, v in stats.items()}


def biased_update_check():
    """Largest difference between MXNet's running variance after one CPU training step of a
    BatchNorm layer and the update with the biased variance, and with the unbiased one."""
    import numpy as np
    from mxnet import autograd, nd
    from mxnet.gluon import nn
    x = nd.array(np.random.default_rng(0).normal(1, 3, (96, 8, 4, 4)))
    bn = nn.BatchNorm(in_channels=8)
    bn.initialize()
    with autograd.record():
        y = bn(x)
    y.backward()
    var = x.asnumpy().var(axis=(0, 2, 3))
    n = 96 * 4 * 4
    got = bn.running_var.data().asnumpy()
    return {'biased': float(abs(got - (MOMENTUM + (1 - MOMENTUM) * var)).max()),
            'unbiased': float(abs(got - (MOMENTUM + (1 - MOMENTUM) * var * n / (n - 1))).max())}


def causes(directory, epoch, test_limit=2000, batches=10, data_dir=None, log=print):
    """The accuracies of the module docstring for checkpoint ``epoch`` of the 1-device run in
    ``directory``; a dict (see ``main``'s output)."""
    import numpy as np
    from mxnet import nd
    from gluon_mgpu import data, devices as devices_mod
    from gluon_mgpu.handlers import checkpoint
    record = checkpoint.read_checkpoint(directory, epoch)
    run = book_table._settings(directory, record)
    if run.num_gpus != 1 or run.dtype != 'float32':
        raise cli.UsageError('--checkpoint-dir %s: a run on %d devices in %s; give a 1-device '
                             'float32 run of the book table' % (directory, run.num_gpus,
                                                                run.dtype))
    device = devices_mod.get_devices(1)[0]
    net = book_table._restored(directory, record, [device], hybridize=True)  # reads
    plain = book_table._restored(directory, record, [device], hybridize=False)  # statistics
    test_x, test_y = (a[:test_limit] for a in data.load_fashion_mnist_arrays('test', data_dir))
    test_iter = data.ArrayBatches(test_x, test_y, 500)
    images = data.load_fashion_mnist_arrays('train', data_dir)[0][:run.train_limit]

    counts = {}  # values per channel in the first batch read (the last one), by _stats' names
    names = {id(p): k for k, p in plain._collect_params_with_prefix().items()}
    for layer in book_table.batch_norm_layers(plain):
        layer.register_forward_hook(lambda block, inputs, output: counts.setdefault(
            names[id(block.running_var)], int(np.prod(inputs[0].shape)) // inputs[0].shape[1]))

    def batch_statistics(index):
        X = nd.array(data.to_tensor(images[index]), dtype='float32')
        book_table.reestimate_running_stats(plain, X, device)
        return _stats(plain, device)

    def read(stats):
        _put(net, device, stats)
        nd.waitall()
        return book_table.evaluate_accuracy(test_iter, net, [device])

    def ema(start, order):
        stats = {k: v.copy() for k, v in start.items()}
        full = len(order) // run.batch_size * run.batch_size
        bounds = [(full - run.batch_size * i, full - run.batch_size * (i - 1))
                  for i in range(batches, 0, -1)] + ([(full, len(order))] if full < len(order)
                                                      else [])
        for lo, hi in bounds:
            b = batch_statistics(order[lo:hi])
            for k in stats:
                stats[k] = MOMENTUM * stats[k] + (1 - MOMENTUM) * b[k]
        return stats

    saved = _stats(net, device)
    t0 = time.time()
    result = {'checkpoint_dir': os.path.abspath(directory), 'epoch': epoch, 'seed': run.seed,
              'test_limit': test_limit, 'batches': batches, 'update_check': biased_update_check()}
    acc = result['acc'] = {}
    acc['saved'] = read(saved)
    log('saved %.4f' % acc['saved'])
    order = data.ArrayBatches(images, images, run.batch_size, shuffle=True,
                              seed=run.seed).order(epoch - 1)
    size = len(order) % run.batch_size or run.batch_size  # the first statistics: ``counts``
    last = batch_statistics(order[len(order) - size:])
    precise = batch_statistics(slice(0, book_table.PRECISE_BN_IMAGES))
    result['values_per_channel'] = {k[:-len('.running_var')]: n
                                    for k, n in sorted(counts.items())}
    acc['cudnn_variance'] = read(cudnn_variance(saved, counts))
    log('cudnn_variance %.4f' % acc['cudnn_variance'])
    acc['without_last_batch'] = read({k: (v - (1 - MOMENTUM) * last[k]) / MOMENTUM
                                      for k, v in saved.items()})
    log('without_last_batch %.4f (%d images)' % (acc['without_last_batch'], size))
    acc['precise_bn'] = read(precise)
    log('precise_bn %.4f' % acc['precise_bn'])
    acc['fixed_weights_own_order'] = read(ema(precise, order))
    log('fixed_weights_own_order %.4f' % acc['fixed_weights_own_order'])
    other = data.ArrayBatches(images, images, run.batch_size, shuffle=True,
                              seed=run.seed + 1000).order(epoch - 1)
    acc['fixed_weights_other_order'] = read(ema(precise, other))
    log('fixed_weights_other_order %.4f' % acc['fixed_weights_other_order'])
    result['seconds'] = time.time() - t0
    return result


def build_parser():
    p = cli.Parser(prog=PROG, description=__doc__.split('\n\n')[0])
    p.add_argument('--checkpoint-dir', required=True, help='a 1-device run of the book table')
    p.add_argument('--epoch', type=cli.whole('--epoch'), required=True, help='its saved epoch')
    p.add_argument('--test-limit', type=cli.whole('--test-limit', 1, 10000), default=2000,
                   help='test images read after each change (default 2000)')
    p.add_argument('--batches', type=cli.whole('--batches', 1, 200), default=10,
                   help='full batches averaged at the saved weights (default 10)')
    p.add_argument('--output', type=cli.output_file('--output', 'bn-causes.json'),
                   help='write the result as JSON')
    p.add_argument('--data-dir', help="Fashion-MNIST's folder (default: searched)")
    return p


def main(argv=None):
    """Entry point; returns the exit code: 0, 1 when the output cannot be written, 2 for bad
    input, 130/143 when stopped."""
    argv = sys.argv[1:] if argv is None else list(argv)
    return cli.run_command(PROG, argv, lambda: _main(build_parser().parse_args(argv)),
                           lambda e: {'own': epoch_end._explain(e, PROG)})


def _main(args):
    if args.output:
        cli.check_output('--output', args.output, suffixes=('.json',), example='bn-causes.json')
    result = causes(args.checkpoint_dir, args.epoch, args.test_limit, args.batches,
                    args.data_dir, log=lambda line: print(line, flush=True))
    if args.output:
        with files.atomic_path(args.output) as tmp, open(tmp, 'w') as f:
            json.dump(result, f, indent=1)
            f.write('\n')
    return 0


if __name__ == '__main__':
    sys.exit(main())
