"""The fsdp_grpo config: registration, defaults, clear errors, the deprecated strategy alias."""

import pytest
from skyrl_core.config import build_config
from skyrl_core.factory import ConfigError
from skyrl_core.plugins import get_registry
from skyrl_trainers.config import FSDPGRPOConfig
from skyrl_trainers.engine_setup import engine_config_for_policy


def test_registered_with_its_config_class():
    registry = get_registry()
    spec = registry.get("trainer", "fsdp_grpo")
    assert spec.config_class() is FSDPGRPOConfig
    assert spec.load().__name__ == "FSDPGRPOTrainer"
    assert registry.get("engine", "vllm").metadata()["needs_gpu"] is True
    assert registry.get("engine", "hf").provider.name == "skyrl-trainers"


def test_fsdp2_is_a_deprecated_alias_of_fsdp():
    with pytest.warns(FutureWarning, match="fsdp2.*deprecated"):
        cfg = build_config({"env": {"id": "reverse_text"}, "trainer": {"id": "fsdp_grpo", "strategy": "fsdp2"}},
                           registry=get_registry())
    assert cfg.trainer.strategy == "fsdp"


@pytest.mark.parametrize(("override", "message"), [
    ({"policy_loss": "ppo_clipp"}, r"trainer\.policy_loss: .*unknown policy_loss 'ppo_clipp'\. Did you mean 'ppo_clip'"),
    ({"loss_reduction": "mean"}, r"trainer\.loss_reduction: .*token_mean, sequence_mean, sequence_mean_token_sum"),
    ({"lr": 0}, r"trainer\.lr: .*greater than 0"),
    ({"world_sise": 2}, r"trainer\.world_sise: unknown key\. Did you mean 'world_size'"),
    ({"strategy": "megatron"}, r"trainer\.strategy"),
])
def test_bad_values_name_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        build_config({"env": {"id": "reverse_text"}, "trainer": {"id": "fsdp_grpo", **override}},
                     registry=get_registry())


def test_engine_generates_with_the_trained_policy():
    cfg = build_config({"env": {"id": "reverse_text"}, "trainer": {"id": "fsdp_grpo", "model": "tiny-random"}},
                       registry=get_registry())
    engine_cfg = engine_config_for_policy(cfg, seed=7)
    assert (engine_cfg.model, engine_cfg.seed) == ("tiny-random", 7)
    clash = build_config({"env": {"id": "reverse_text"}, "engine": {"id": "hf", "model": "smollm2-135m"},
                          "trainer": {"id": "fsdp_grpo", "model": "tiny-random"}}, registry=get_registry())
    with pytest.raises(ConfigError, match="engine.model='smollm2-135m' differs from trainer.model='tiny-random'"):
        engine_config_for_policy(clash)
