"""skyrl-search: Search-R1-style retrieval QA — <search> queries against a local index or a retrieval server."""

from skyrl_core import EnvSpec, hookimpl


@hookimpl
def register_envs(register):
    register(EnvSpec(
        id="search",
        entry_point="skyrl_search.env:SearchEnv",
        config="skyrl_search.config:SearchEnvConfig",
        description="Search-R1: reason, <search> a retriever, answer in <answer>; exact-match reward.",
        max_turns=4,
        stop=("</search>", "</answer>"),
    ))
