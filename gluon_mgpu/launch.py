"""``python -m gluon_mgpu.launch``: runs ``gluon_mgpu/commands/launch.py`` (docs/distributed.md)."""
import sys

if __name__ == '__main__':
    from gluon_mgpu.runtime.startup import before_mxnet
    before_mxnet('python -m gluon_mgpu.launch', mxnet=False)  # what its processes would abort on
    from gluon_mgpu.commands.launch import main
    sys.exit(main())
