"""The app's routing as a whole: every route of every router asks for a key when the server has keys.

No model is loaded: nothing here gets past authentication, so the service is a stand-in and the app's
lifespan (which starts it) never runs.
"""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
from fastapi.testclient import TestClient
from skyrl_tinker.app import ServerConfig, create_app
from skyrl_tinker.routes import ROUTERS


@pytest.mark.parametrize("config", [ServerConfig(api_key="tml-secret-0123456789"),
                                    ServerConfig(api_keys={"tml-alice-0123456789abcdef": "alice"})],
                         ids=["api-key", "api-keys"])
def test_every_route_needs_a_key(config):
    client = TestClient(create_app(config, SimpleNamespace()), base_url="http://127.0.0.1")
    operations = [(method, re.sub(r"\{[^}]+\}", "x", route.path))
                  for router in ROUTERS for route in router.routes for method in route.methods]
    assert len(operations) > 30 and ("GET", "/api/v1/x") in operations  # the catch-all too
    option = "--api-key" if config.api_key else "--api-keys"
    for method, path in [*operations, ("GET", "/openapi.json"), ("GET", "/docs")]:
        for headers in ({}, {"X-API-Key": "tml-wrong"}):
            response = client.request(method, path, headers=headers, json={})
            assert response.status_code == 401, (method, path, response.text)
            assert response.json() == {"detail": f"missing or wrong API key (X-API-Key); the server was started "
                                                 f"with {option}"}
