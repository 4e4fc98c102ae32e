"""``python -m gluon_mgpu.launch``: runs ``gluon_mgpu/commands/launch.py`` (docs/distributed.md)."""
import sys

if __name__ == '__main__':
    from gluon_mgpu.runtime.startup import before_mxnet, starting
    with starting('python -m gluon_mgpu.launch'):  # a signal until main runs: one line
        before_mxnet('python -m gluon_mgpu.launch', mxnet=False)  # what its processes abort on
        from gluon_mgpu.commands.launch import main
    sys.exit(main())
