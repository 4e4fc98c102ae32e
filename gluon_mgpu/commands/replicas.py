"""Walk the chapter's inspection cells: ``python -m gluon_mgpu.replicas --num-gpus 2`` initializes
ResNet-18 on the devices, runs one forward pass per device, prints the first convolution's weight
on every device as the book does, then the full replica report (docs/replicas.md).
"""
import sys

from .. import devices as devices_mod
from . import cli
from ..assembly import runs
from ..replicas import format_replica_report, get_replica, inspect_replicas, inspection_cells

PROG = 'python -m gluon_mgpu.replicas'


def build_parser():
    p = cli.Parser(prog=PROG, description="Show that the chapter's ResNet-18 has the same "
                   "parameters on every device after initialization and one forward pass.")
    p.add_argument('--num-gpus', type=cli.Parser.whole('--num-gpus'), default=2,
                   help='number of devices (default: 2, as the chapter)')
    p.add_device_flag()
    p.add_seed_flag('seed for the initialization and the random batch (default: none)')
    p.add_debug_flag()
    return p


def run(args):
    import mxnet as mx
    from mxnet.gluon.parameter import DeferredInitializationError

    from .. import training
    devices = runs.devices_for(args.num_gpus, args.device, 'resnet18')
    print('running on:', devices_mod.format_devices(devices))
    if args.seed is not None:
        mx.random.seed(args.seed)

    def before_forward(net):
        print('net.initialize(init=init.Normal(sigma=%g), ctx=%s)'
              % (training.INIT_SIGMA, devices_mod.format_devices(devices)))
        try:
            inspect_replicas(net)
        except DeferredInitializationError as e:
            print('inspect_replicas(net) before a forward pass:', e)

    # The book's 4 images; at least one per device when there are more devices.
    cells = inspection_cells(devices, training.INIT_SIGMA, before_forward)
    net, x, weight = cells['net'], cells['x'], cells['weight']
    print('x %s split: %s' % (x.shape, ', '.join('%s on %s' % (p.shape, p.context)
                                                 for p in cells['parts'])))
    print('one forward pass per device: %s'
          % ', '.join('%s on %s' % (o.shape, o.context) for o in cells['outputs']))
    print("weight = net[0].params.get('weight'): %s, shape %s" % (weight.name, weight.shape))
    # A context the parameters do not live on: the book's cpu(0) on GPUs, else the next cpu.
    other = mx.cpu() if mx.cpu() not in devices else mx.cpu(max(d.device_id for d in devices) + 1)
    try:
        get_replica(weight, other)
    except ValueError as e:
        print('weight.data(%s): %s' % (other, e))
    for d in devices:
        print('weight.data(%s)[0]:%r' % (d, weight.data(d)[0]))
    print('\n' + format_replica_report(inspect_replicas(net)))


def main(argv=None):
    """Entry point of ``python -m gluon_mgpu.replicas``; returns the exit code (2: bad input)."""
    return cli.run_report(PROG, sys.argv[1:] if argv is None else list(argv),
                          build_parser().parse_args, run, 'before the report was complete')
