"""Run config: YAML + dotted overrides, validated per component with errors that name the key."""

from __future__ import annotations

import pytest
from skyrl_core.config import build_config, load_yaml, parse_overrides
from skyrl_core.factory import ConfigError
from skyrl_core.registry import RegistryError


def resolve(*layers, registry, **kw):
    return build_config(*layers, registry=registry, **kw)


def test_overrides_parse_values_as_yaml():
    assert parse_overrides(["trainer.lr=1e-6", "env.max_turns=3", "generator.stop=['</sql>']", "run.output_dir=x"]) == {
        "trainer": {"lr": 1e-6}, "env": {"max_turns": 3}, "generator": {"stop": ["</sql>"]}, "run": {"output_dir": "x"}}


@pytest.mark.parametrize("bad", ["trainer.lr", "=3", "a..b=1"])
def test_malformed_override_is_named(bad):
    with pytest.raises(ConfigError, match="section.key=value"):
        parse_overrides([bad])


def test_yaml_then_overrides_later_wins(tmp_path, skyrl_plugin_manager):
    path = tmp_path / "run.yaml"
    path.write_text("env: {id: reverse_text, max_turns: 2}\ngenerator: {n_samples_per_prompt: 8}\nengine: {id: openai}\n")
    cfg = resolve(load_yaml(path), parse_overrides(["env.max_turns=5"]), registry=skyrl_plugin_manager.registry,
                  need_trainer=False)
    assert cfg.env.max_turns == 5 and cfg.env.partial_credit == 0.5
    assert cfg.generator.n_samples_per_prompt == 8 and cfg.generator_id == "default"
    assert cfg.to_dict()["env"] == {"id": "reverse_text", "max_turns": 5, "max_action_chars": 50000, "reward_range": None,
                                    "partial_credit": 0.5, "dataset_size": 64}


def test_unknown_key_names_the_key_and_the_allowed_ones(skyrl_plugin_manager):
    with pytest.raises(ConfigError) as err:
        resolve({"env": {"id": "reverse_text", "max_turn": 3}, "engine": {"id": "openai"}},
                registry=skyrl_plugin_manager.registry, need_trainer=False)
    message = str(err.value)
    assert "env.max_turn: unknown key. Did you mean 'max_turns'?" in message
    assert "Allowed keys: dataset_size, max_action_chars, max_turns, partial_credit" in message


def test_bad_value_names_the_key_and_the_value(skyrl_plugin_manager):
    with pytest.raises(ConfigError) as err:
        resolve({"env": {"id": "reverse_text"}, "generator": {"temperature": "hot"}, "engine": {"id": "openai"}},
                registry=skyrl_plugin_manager.registry, need_trainer=False)
    assert "generator.temperature" in str(err.value) and "'hot'" in str(err.value)


def test_unknown_section_and_unknown_id(skyrl_plugin_manager):
    registry = skyrl_plugin_manager.registry
    with pytest.raises(ConfigError, match="unknown config section 'trainr'. Did you mean 'trainer'"):
        resolve({"env": {"id": "reverse_text"}, "trainr": {}}, registry=registry)
    with pytest.raises(RegistryError, match="unknown generator id 'defualt'. Did you mean 'default'"):
        resolve({"env": {"id": "reverse_text"}, "generator": {"id": "defualt"}}, registry=registry, need_trainer=False)


def test_a_training_run_needs_a_trainer(skyrl_plugin_manager):
    with pytest.raises(ConfigError, match="trainer.id is required"):
        resolve({"env": {"id": "reverse_text"}, "engine": {"id": "openai"}}, registry=skyrl_plugin_manager.registry)


def test_missing_or_invalid_yaml_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_yaml(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("env: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_yaml(bad)


def test_malformed_yaml_names_the_file_and_line(tmp_path):
    bad = tmp_path / "run.yaml"
    bad.write_text("env:\n  max_turns: 3\n  id: x: y\n")
    with pytest.raises(ConfigError) as caught:
        load_yaml(bad)
    message = str(caught.value)
    assert message.startswith(f"{bad}:3:") and "mapping values are not allowed here" in message
    assert "3 |   id: x: y" in message and "<unicode string>" not in message
    with pytest.raises(ConfigError) as caught:
        parse_overrides(["trainer.lr=[1"])
    assert "override 'trainer.lr=[1': value is not valid YAML" in str(caught.value)
    assert "<unicode string>" not in str(caught.value)


def test_env_spec_can_name_its_default_generator(skyrl_plugin_manager, register_skyrl_plugin):
    from skyrl_core import EnvSpec, GeneratorSpec, hookimpl

    class TreeEnvPlugin:
        @hookimpl
        def register_envs(self, register):
            register(EnvSpec(id="tree_env", entry_point="skyrl_reverse_text.env:ReverseTextEnv",
                             default_generator="tree_gen"))

        @hookimpl
        def register_generators(self, register):
            register(GeneratorSpec(id="tree_gen", entry_point="skyrl_core.generator:MultiTurnGenerator",
                                   config="skyrl_core.generator:GeneratorConfig"))

    register_skyrl_plugin(TreeEnvPlugin())
    registry = skyrl_plugin_manager.registry
    engine = {"engine": {"id": "openai"}}
    assert resolve({"env": {"id": "tree_env"}, **engine}, registry=registry, need_trainer=False).generator_id == "tree_gen"
    explicit = {"env": {"id": "tree_env"}, "generator": {"id": "default"}, **engine}
    assert resolve(explicit, registry=registry, need_trainer=False).generator_id == "default"


def test_env_run_defaults_are_the_lowest_layer_and_skip_options_a_component_lacks(skyrl_plugin_manager,
                                                                                   register_skyrl_plugin):
    from skyrl_core import EnvSpec, hookimpl
    from skyrl_core.config import env_run_defaults

    class PresetPlugin:
        @hookimpl
        def register_envs(self, register):
            register(EnvSpec(id="preset_env", entry_point="skyrl_reverse_text.env:ReverseTextEnv", run_defaults={
                "env": {"max_turns": 4, "partial_credit": 0.25},
                "generator": {"temperature": 0.7, "n_samples_per_prompt": 6},
                "engine": {"not_an_openai_option": 1}}))

    register_skyrl_plugin(PresetPlugin())
    registry = skyrl_plugin_manager.registry
    layers = [{"env": {"id": "preset_env"}, "engine": {"id": "openai"}}, parse_overrides(["env.max_turns=2"])]
    defaults = env_run_defaults(layers, registry)
    assert "engine" not in defaults  # the openai engine declares no such option: left out, not an error
    cfg = resolve(defaults, *layers, registry=registry, need_trainer=False)
    assert cfg.env.max_turns == 2 and cfg.env.partial_credit == 0.25  # an override beats the env's default
    assert cfg.generator.temperature == 0.7 and cfg.generator.n_samples_per_prompt == 6
    assert env_run_defaults([{"env": {"id": "no_such_env"}}], registry) == {}


def test_nested_config_errors_name_the_nested_keys():
    from pydantic import BaseModel, ConfigDict
    from skyrl_core.factory import validate_config

    class Limits(BaseModel):
        model_config = ConfigDict(extra="forbid")
        max_depth: int = 1

    class Outer(BaseModel):
        model_config = ConfigDict(extra="forbid")
        limits: Limits = Limits()

    with pytest.raises(ConfigError, match=r"env.limits.max_dept: unknown key. Did you mean 'max_depth'\? Allowed keys: max_depth$"):
        validate_config(Outer, {"limits": {"max_dept": 2}}, "env")
