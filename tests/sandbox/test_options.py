"""The shared ``backend`` option: auto or an installed backend (with machines, where an env needs them),
a message listing the choices otherwise, and a description read from the registry."""

from __future__ import annotations

import subprocess
import sys

import pytest
from pydantic import BaseModel, Field, ValidationError
from skyrl_sandbox import backend_names, registered
from skyrl_sandbox.options import MachineBackend, WorkerBackend, backend_description


class Options(BaseModel):
    worker: WorkerBackend = Field("auto", description=backend_description("Where the worker runs."))
    machine: MachineBackend = "auto"


MACHINES = [name for name, backend in registered().items() if backend.has_machines]


@pytest.mark.parametrize("name", ["auto", *backend_names()])
def test_a_worker_backend_is_auto_or_any_installed_backend(name):
    assert Options(worker=name).worker == name


@pytest.mark.parametrize("name", ["auto", *MACHINES])
def test_a_machine_backend_is_auto_or_an_installed_backend_with_machines(name):
    assert Options(machine=name).machine == name


def test_an_unknown_backend_is_refused_with_the_choices():
    with pytest.raises(ValidationError) as caught:
        Options(worker="firejail")
    assert f"sandbox backend 'firejail' is not installed; choose one of auto, {', '.join(backend_names())}" in str(
        caught.value)


def test_a_backend_without_machines_is_no_machine_backend():
    assert not registered()["subprocess"].has_machines
    with pytest.raises(ValidationError) as caught:
        Options(machine="subprocess")
    assert f"sandbox backend 'subprocess' has no machines; choose one of auto, {', '.join(MACHINES)}" in str(
        caught.value)


def test_the_schema_lists_the_choices():
    properties = Options.model_json_schema()["properties"]
    assert properties["worker"]["enum"] == ["auto", *backend_names()]
    assert properties["machine"]["enum"] == ["auto", *MACHINES]


def test_the_description_names_every_installed_backend_and_what_it_protects_with():
    text = Options.model_fields["worker"].description
    for name, backend in registered().items():
        assert f"{name}: {backend.protects}" in text
    assert "SKYRL_SANDBOX=<name>" in text and text.endswith("Where the worker runs.")
    machines_only = backend_description(machines=True)
    assert "subprocess:" not in machines_only and all(f"{name}: " in machines_only for name in MACHINES)


def test_importing_skyrl_sandbox_does_not_import_the_options_or_pydantic():
    code = "import sys, skyrl_sandbox; print('skyrl_sandbox.options' in sys.modules, 'pydantic' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
