"""Testing helpers for env and plugin authors: the conformance checker, the reward-hacking probes and (via
the ``pytest11`` entry point) pytest fixtures. See :func:`check_env` and :func:`check_adversarial`."""

from skyrl_core.probe import Probe
from skyrl_core.testing.adversarial import AdversarialReport, RewardHackError, check_adversarial
from skyrl_core.testing.check import EnvCheckError, check_env

__all__ = ["AdversarialReport", "EnvCheckError", "Probe", "RewardHackError", "check_adversarial", "check_env"]
