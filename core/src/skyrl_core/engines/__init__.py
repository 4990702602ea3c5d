"""Inference engines that ship with skyrl-core (registered in ``skyrl_core.default_plugins``).

Modules here are imported only when an engine is made, so listing components stays fast.
"""
