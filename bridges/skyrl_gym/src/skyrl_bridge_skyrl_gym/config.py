"""Options of the ``skyrl_gym`` env (section ``env`` of a run config)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator
from skyrl_core.catalog import CatalogEnvConfig

from skyrl_bridge_skyrl_gym.catalog import PEER_ENVS


class SkyRLGymConfig(CatalogEnvConfig):
    name: str = Field("gsm8k", min_length=1, description="The skyrl-gym env (`skyrl envs --catalog skyrl_gym`): "
                                                          "gsm8k, gsm8k_multi_turn, text2sql, search, aime.")
    args: dict[str, Any] = Field(default_factory=dict, description="The peer env's env_config options: text2sql: "
                                 "db_path; search: search_url, topk, timeout, log_requests.")
    max_turns: int = Field(1, ge=1, description="Turn limit, passed to the peer as extras['max_turns'] as SkyRL's "
                           "generator does; default: the peer's own (gsm8k 1, gsm8k_multi_turn 5, text2sql 5, "
                           "search 2).")
    data_files: dict[str, str] = Field(default_factory=dict, description="Split -> file of SkyRL rows (JSONL or "
                                       "parquet: data_source, prompt, env_class, reward_spec, extra_info); empty: "
                                       "the built-in rows (gsm8k and gsm8k_multi_turn only).")

    @model_validator(mode="before")
    @classmethod
    def _peer_max_turns(cls, data: Any) -> Any:
        """No max_turns given: the named peer env's own default."""
        if isinstance(data, dict) and data.get("max_turns") is None:
            known = PEER_ENVS.get(str(data.get("name") or "gsm8k"))
            data = {**data, "max_turns": known.max_turns if known else 1}
        return data

    @model_validator(mode="after")
    def _known_name(self) -> SkyRLGymConfig:
        known = PEER_ENVS.get(self.name)
        if known is None:
            raise ValueError(f"env.name={self.name!r} is not a skyrl-gym env this bridge runs; choose one of "
                             f"{', '.join(n for n, e in PEER_ENVS.items() if e.supported)}")
        if not known.supported:
            raise ValueError(f"skyrl-gym's {self.name!r} is not supported by this bridge: {known.why_unsupported}")
        unknown = sorted(set(self.args) - set(known.config_fields))
        if unknown:
            accepted = ", ".join(known.config_fields) or "none"
            raise ValueError(f"env.args has {', '.join(map(repr, unknown))}, which skyrl-gym's {self.name!r} does not "
                             f"take (its env_config options: {accepted})")
        return self
