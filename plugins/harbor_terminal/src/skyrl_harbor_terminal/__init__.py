"""skyrl-harbor-terminal: Harbor-format terminal tasks in real containers, rewarded by each task's verifier."""

from skyrl_core import EnvSpec, hookimpl


@hookimpl
def register_envs(register):
    register(EnvSpec(
        id="harbor_terminal",
        entry_point="skyrl_harbor_terminal.env:HarborTerminalEnv",
        config="skyrl_harbor_terminal.config:HarborTerminalConfig",
        description="Harbor/Terminal-Bench tasks: shell commands in a task container, scored by the task's tests.",
        max_turns=16,
        needs_docker=True,
    ))
