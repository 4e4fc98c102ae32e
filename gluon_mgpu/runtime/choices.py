"""The lists a user chooses from, each defined once: the command-line parsers (which read the
flags before MXNet starts, so this module imports nothing) and the library both take them from
here."""

__all__ = ['MODELS', 'DTYPES', 'DEVICES', 'LOADERS', 'METHODS', 'DIST_KVSTORES', 'JOB_KVSTORES',
           'KVSTORES']

MODELS = ('resnet18', 'lenet')  # model.resnet18 (the chapter's), model.lenet
DTYPES = ('float32', 'bfloat16')  # what the network computes in (runtime/precision.py)
DEVICES = ('auto', 'gpu', 'cpu')  # devices.get_devices: GPUs if enough, else simulated CPUs
LOADERS = ('array', 'gluon')  # data.LOADERS
METHODS = ('data', 'scratch', 'layers', 'channels')  # parallel.options: how training is split
DIST_KVSTORES = ('dist_sync', 'dist_device_sync')  # with servers (parallel/dist.py)
JOB_KVSTORES = DIST_KVSTORES + ('horovod',)  # a job of several processes
KVSTORES = ('device', 'local') + JOB_KVSTORES
