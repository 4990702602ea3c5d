"""skyrl-tinker: a Tinker API server on skyrl-trainers, driven by the official ``tinker`` client.

Start it with ``skyrl-tinker serve --base-model tiny-random`` and point a client at it with
``tinker.ServiceClient(base_url="http://127.0.0.1:8000", api_key="tml-local")``.
"""
