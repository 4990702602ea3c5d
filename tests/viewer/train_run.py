"""``python train_run.py run ...``: the ``skyrl`` CLI with the viewer tests' engine registered."""

import sys

from skyrl_core.cli import main
from skyrl_core.plugins import get_plugin_manager
from skyrl_core.registry import Provider
from viewer_support import ViewerTestPlugin

if __name__ == "__main__":
    get_plugin_manager().register_plugin(ViewerTestPlugin(), Provider("skyrl-viewer-tests", "0.0.test"))
    sys.exit(main())
