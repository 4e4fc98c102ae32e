"""``python -m gluon_mgpu.compare``: the command line is ``gluon_mgpu/commands/compare.py``."""
import sys

if __name__ == '__main__':
    from gluon_mgpu.runtime.startup import before_mxnet
    before_mxnet('python -m gluon_mgpu.compare')  # threads, checks, then MXNet: one line if refused
    from gluon_mgpu.commands.compare import main
    sys.exit(main())
