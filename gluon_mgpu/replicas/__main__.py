"""``python -m gluon_mgpu.replicas``: the command line is ``gluon_mgpu/commands/replicas.py``."""
import sys

from gluon_mgpu.runtime.startup import before_mxnet

before_mxnet('python -m gluon_mgpu.replicas')  # threads, checks, then MXNet: one line if refused
from gluon_mgpu.commands.replicas import main  # noqa: E402

sys.exit(main())
