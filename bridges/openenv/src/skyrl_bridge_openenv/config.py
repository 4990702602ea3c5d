"""Options of the ``openenv`` env id."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator
from skyrl_core.catalog import CatalogEnvConfig


class OpenEnvConfig(CatalogEnvConfig):
    """Which OpenEnv env, how to run it, and how the model's text becomes its typed action."""

    name: str = Field("demo", min_length=1, description=(
        "The OpenEnv env: an installed OpenEnv env package's name (`skyrl envs --catalog openenv` lists them), "
        "'demo' (a one-step sum env shipped with the bridge), or 'module:EnvironmentClass'."))
    max_turns: int = Field(4, ge=1, description="Episode is truncated after this many actions.")
    mode: Literal["inprocess", "server", "url"] = Field("inprocess", description=(
        "'inprocess': build the Environment in this process; 'server': start OpenEnv's own HTTP/WebSocket server "
        "for it on 127.0.0.1 (a free port, a subprocess stopped on close) and talk through OpenEnv's client; "
        "'url': connect to a running OpenEnv server at env.url."))
    url: str | None = Field(None, description="Base URL of a running OpenEnv server (mode 'url'), e.g. "
                                              "http://127.0.0.1:8000.")
    action: str | None = Field(None, description=(
        "'module:ActionClass' when the env's action class cannot be read from its type hints (default: from "
        "Environment[Action, Observation, State] or step()'s annotation; in mode 'url' with an unknown env, "
        "from the server's /schema)."))
    render: str = Field("auto", description=(
        "How an observation becomes the message's text: 'auto' (its text/message/content/prompt field when it "
        "has one, else the JSON of its fields other than reward/done/metadata), 'json', or a field name."))
    instructions: bool = Field(True, description="Add to the prompt which action fields the reply must give.")
    timeout_s: float = Field(30.0, gt=0, description="Longest wait for one server reply (reset or step) in "
                                                     "modes 'server' and 'url'; past it the episode ends "
                                                     "truncated with info['error'].")
    server_start_timeout_s: float = Field(60.0, gt=0, description="Longest wait for the server of mode "
                                                                  "'server' to answer /health.")
    train_tasks: int = Field(256, ge=1, description="Rows of split 'train': each one a reset seed (0, 1, ...).")
    test_tasks: int = Field(32, ge=1, description="Rows of split 'test': seeds 1,000,000 and up.")

    @model_validator(mode="after")
    def _url_for_url_mode(self) -> OpenEnvConfig:
        if self.mode == "url" and not self.url:
            raise ValueError("mode 'url' needs env.url (e.g. env.url=http://127.0.0.1:8000)")
        if self.url and not self.url.startswith(("http://", "https://", "ws://", "wss://")):
            raise ValueError(f"env.url must start with http://, https://, ws:// or wss://, got {self.url!r}")
        if self.mode != "url":  # an unknown env is an error where the config is read, not in every episode
            from .catalog import resolve

            resolve(self.name, self.action)
        return self
