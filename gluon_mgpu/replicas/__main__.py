"""``python -m gluon_mgpu.replicas``: the command line is ``gluon_mgpu/commands/replicas.py``."""
import sys

from gluon_mgpu.runtime.startup import starting

with starting('python -m gluon_mgpu.replicas'):  # a signal until main handles it: one line
    from gluon_mgpu.commands.replicas import main  # its flags come before MXNet

sys.exit(main())
