"""skyrl-reverse-text: the tutorial plugin, a worked example of a third-party SkyRL environment."""

from skyrl_core import EnvSpec, hookimpl


@hookimpl
def register_envs(register):
    register(EnvSpec(
        id="reverse_text",
        entry_point="skyrl_reverse_text.env:ReverseTextEnv",
        config="skyrl_reverse_text.env:ReverseTextConfig",
        description="Reverse a short string; answer inside <answer></answer>; retries allowed.",
        max_turns=2,
        reward_range=(0.0, 1.0),
    ))
