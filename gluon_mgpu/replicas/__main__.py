"""``python -m gluon_mgpu.replicas``: the command line is ``gluon_mgpu/commands/replicas.py``."""
import sys

from gluon_mgpu.runtime.startup import before_mxnet, starting

with starting('python -m gluon_mgpu.replicas'):  # a signal until main runs: one line
    before_mxnet('python -m gluon_mgpu.replicas')  # threads, checks, then MXNet
    from gluon_mgpu.commands.replicas import main

sys.exit(main())
