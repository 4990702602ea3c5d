"""``tinker://`` checkpoints on disk: written atomically, listed, and read back after a restart.

Layout under the checkpoint dir::

    <run_id>/run.json                          owner (tenant), base model, LoRA spec, creation time
    <run_id>/weights/<name>/                   save_weights: adapter.safetensors, optimizer.pt, meta.json
    <run_id>/sampler_weights/<name>/           save_weights_for_sampler: adapter.safetensors, meta.json

``tinker://<run_id>/weights/<name>`` names the folder ``<run_id>/weights/<name>``. Run ids and names
are checked against one pattern each (:data:`RUN_ID`, :data:`NAME`) before any path is built from
them, so no id reaches outside its run's folder. A checkpoint is written into a hidden sibling folder
and renamed into place, so a crash never leaves a half-written checkpoint under a real name, and
listing skips hidden folders. ``meta.json`` records whether the owner published it (``public``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from skyrl_core.http_hygiene import shown

from skyrl_tinker.tenants import DEFAULT_TENANT

KINDS = {"weights": "training", "sampler_weights": "sampler"}
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")  # both matched with fullmatch
# new run ids are run-<32 hex>; runs written before that were <session>:train:<n>. No '.', no '/'.
RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_:-]{0,127}")


class CheckpointError(ValueError):
    """A bad or unknown checkpoint path, or a name already taken; the message says which."""


def new_run_id() -> str:
    """An unguessable run id (also the model id of a model made by create_model)."""
    return f"run-{secrets.token_hex(16)}"


def check_run_id(run_id: str) -> str:
    if not isinstance(run_id, str) or not RUN_ID.fullmatch(run_id):
        raise CheckpointError(f"{shown(run_id)} is not a training run id (letters, digits, '_', '-' or ':')")
    return run_id


@dataclass(frozen=True)
class TinkerPath:
    run_id: str
    kind: str  # "weights" or "sampler_weights"
    name: str

    def __post_init__(self) -> None:
        if self.kind not in KINDS or not RUN_ID.fullmatch(self.run_id) or not NAME.fullmatch(self.name):
            raise CheckpointError(f"checkpoint path {shown(str(self))} is not tinker://<run_id>/(weights|sampler_weights)/"
                                  "<name> (run id: letters, digits, '_', '-', ':'; name: letters, digits, '.', '_', '-')")

    @classmethod
    def parse(cls, path: str) -> TinkerPath:
        if not isinstance(path, str) or not path.startswith("tinker://"):
            raise CheckpointError(f"checkpoint path {shown(path)} must start with tinker://")
        parts = path.removeprefix("tinker://").split("/")
        if len(parts) != 3:
            raise CheckpointError(f"checkpoint path {shown(path)} is not tinker://<run_id>/(weights|sampler_weights)/<name>")
        return cls(*parts)

    def __str__(self) -> str:
        return f"tinker://{self.run_id}/{self.kind}/{self.name}"


class CheckpointStore:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).expanduser()
        self.root.mkdir(parents=True, exist_ok=True)

    # --- runs ------------------------------------------------------------------------------------

    def _run_dir(self, run_id: str) -> Path:
        """The run's folder; the one place a run id becomes a path."""
        return self.root / check_run_id(run_id)

    def write_run(self, run_id: str, owner: str, base_model: str, spec: dict[str, Any]) -> None:
        folder = self._run_dir(run_id)
        folder.mkdir(parents=True, exist_ok=True)
        _write_json_atomic(folder / "run.json", {"owner": owner, "base_model": base_model, "lora": spec,
                                                 "created": time.time()})

    def read_run(self, run_id: str) -> dict[str, Any]:
        """The run's record; ``owner`` is ``DEFAULT_TENANT`` for runs written before tenants."""
        run_file = self._run_dir(run_id) / "run.json"
        try:
            run = json.loads(run_file.read_text())
        except (OSError, ValueError):
            run = None
        if not isinstance(run, dict):
            raise CheckpointError(f"unknown training run {shown(run_id)}")
        return {"owner": DEFAULT_TENANT, **run}

    def runs(self, owner: str) -> list[tuple[str, dict[str, Any]]]:
        """``owner``'s runs and their records, oldest first (unreadable ones are left out)."""
        found = []
        for run_file in self.root.glob("*/run.json"):
            with contextlib.suppress(CheckpointError):
                run = self.read_run(run_file.parent.name)
                if run["owner"] == owner:
                    found.append((run_file.parent.name, run))
        return sorted(found, key=lambda item: (item[1].get("created", 0), item[0]))

    # --- checkpoints -----------------------------------------------------------------------------

    def save(self, path: TinkerPath, adapter: dict[str, torch.Tensor], meta: dict[str, Any],
             optimizer: dict[str, Any] | None = None, *, overwrite: bool = False) -> None:
        """Write the checkpoint atomically (tmp folder, then rename)."""
        final = self.folder(path)
        if final.exists() and not overwrite:
            raise CheckpointError(f"checkpoint {path} already exists (pass overwrite=True or choose another name)")
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.parent / f".{path.name}.partial-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        try:
            save_file(adapter, str(tmp / "adapter.safetensors"))
            if optimizer is not None:
                torch.save(optimizer, tmp / "optimizer.pt")
            _write_json_atomic(tmp / "meta.json", {**meta, "time": time.time()})
            if final.exists():
                old = final.parent / f".{path.name}.old-{uuid.uuid4().hex[:8]}"
                final.rename(old)
                tmp.rename(final)
                shutil.rmtree(old, ignore_errors=True)
            else:
                tmp.rename(final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    def meta(self, path: TinkerPath) -> dict[str, Any]:
        """A checkpoint's ``meta.json`` (its ``time`` tells one save from the next), without its weights."""
        meta_file = self.folder(path) / "meta.json"
        if not meta_file.exists():
            raise CheckpointError(f"checkpoint {path} does not exist")
        return json.loads(meta_file.read_text())

    def load(self, path: TinkerPath, *, optimizer: bool = False
             ) -> tuple[dict[str, torch.Tensor], dict[str, Any], dict[str, Any] | None]:
        folder = self.folder(path)
        meta = self.meta(path)
        weights = load_file(str(folder / "adapter.safetensors"))
        opt = None
        if optimizer:
            if not (folder / "optimizer.pt").exists():
                raise CheckpointError(f"checkpoint {path} has no optimizer state (sampler checkpoints never do)")
            opt = torch.load(folder / "optimizer.pt", weights_only=True)
        return weights, meta, opt

    def delete(self, path: TinkerPath) -> None:
        folder = self.folder(path)
        if not folder.exists():
            raise CheckpointError(f"checkpoint {path} does not exist")
        shutil.rmtree(folder)

    def is_public(self, path: TinkerPath) -> bool:
        try:
            return json.loads((self.folder(path) / "meta.json").read_text()).get("public") is True
        except (OSError, ValueError):
            return False

    def set_public(self, path: TinkerPath, public: bool) -> None:
        """Publish (any tenant may then load and sample it) or unpublish a checkpoint. Saving over it
        writes a fresh, unpublished one."""
        meta_file = self.folder(path) / "meta.json"
        try:
            meta = json.loads(meta_file.read_text())
        except (OSError, ValueError):
            raise CheckpointError(f"checkpoint {path} does not exist") from None
        _write_json_atomic(meta_file, {**meta, "public": public})

    def folder(self, path: TinkerPath) -> Path:
        return self._run_dir(path.run_id) / path.kind / path.name

    def list(self, run_id: str) -> list[dict[str, Any]]:
        """Checkpoints of a run, oldest first, as Tinker ``Checkpoint`` objects."""
        out = []
        for kind, ctype in KINDS.items():
            for folder in (self._run_dir(run_id) / kind).glob("*/meta.json"):
                folder = folder.parent
                if not NAME.fullmatch(folder.name):  # hidden: a checkpoint being written or replaced
                    continue
                meta = json.loads((folder / "meta.json").read_text())
                size = sum(f.stat().st_size for f in folder.iterdir() if f.is_file())
                path = TinkerPath(run_id, kind, folder.name)
                out.append({"checkpoint_id": f"{kind}/{folder.name}", "checkpoint_type": ctype,
                            "time": _iso(meta.get("time", 0.0)), "tinker_path": str(path), "size_bytes": size,
                            "public": meta.get("public") is True, "user_metadata": meta.get("user_metadata")})
        return sorted(out, key=lambda c: c["time"])


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat()


def _write_json_atomic(target: Path, data: dict[str, Any]) -> None:
    tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, target)
