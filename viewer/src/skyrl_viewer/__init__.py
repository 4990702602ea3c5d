"""skyrl-viewer: ``skyrl view RUN_DIR [RUN_DIR ...]``, a local web page for training runs.

Metrics charts (several runs overlaid, live while a run writes), sample trajectories with a token
view, and RLM recursion trees, read straight from run folders; ``--export`` writes one HTML file.
"""
