"""The model's text -> the env's typed OpenEnv ``Action``; an ``Observation`` -> message text.

An action with a single field, a string, takes the reply's raw text. Any other action takes one JSON object
holding its fields (the reply may wrap it in a ```json fence or in prose, but must hold exactly one object).
``metadata`` (the base ``Action``'s free-form dict) is not the model's to set. Text that does not make a valid
action never reaches the env: the caller answers it with :meth:`ActionCodec.expected`.
"""

from __future__ import annotations

import json
import re
import typing
from typing import Any

from pydantic import BaseModel, Field, ValidationError, create_model

from skyrl_bridge_openenv._peer import load_openenv_core

load_openenv_core()  # openenv.core without its web UI's import time

MAX_DECODE_TRIES = 64
_FENCE = re.compile(r"^```[A-Za-z0-9_-]*\s*\n?(.*?)\n?```$", re.DOTALL)
TEXT_FIELDS = ("text", "message", "content", "prompt")
SKIP_FIELDS = ("metadata",)


class ActionCodec:
    def __init__(self, action_cls: type[BaseModel]) -> None:
        self.action_cls = action_cls
        self.fields = {name: info for name, info in action_cls.model_fields.items() if name not in SKIP_FIELDS}
        only = next(iter(self.fields.values())) if len(self.fields) == 1 else None
        self.raw_field = next(iter(self.fields)) if only is not None and only.annotation is str else None

    # -- describing --------------------------------------------------------------------------------

    def describe_fields(self) -> str:
        parts = []
        for name, info in self.fields.items():
            kind = _type_name(info.annotation)
            need = "required" if info.is_required() else f"optional, default {info.get_default(call_default_factory=True)!r}"
            parts.append(f"- {name} ({kind}, {need})" + (f": {info.description}" if info.description else ""))
        return "\n".join(parts) or "(no fields: reply {})"

    def instructions(self) -> str:
        if self.raw_field is not None:
            return f"Your whole reply is sent to the environment as its `{self.raw_field}`."
        return "Reply with one JSON object with these fields:\n" + self.describe_fields()

    def expected(self, why: str) -> str:
        return (f"Invalid action: {why}. Reply with one JSON object with these fields:\n{self.describe_fields()}\n"
                "Nothing was sent to the environment.")

    # -- parsing -----------------------------------------------------------------------------------

    def parse(self, text: str) -> tuple[BaseModel | None, str | None]:
        """``(action, None)`` or ``(None, message for the model)``."""
        if self.raw_field is not None:
            return self._validate({self.raw_field: text})
        objects, why = json_objects(text)
        if why:
            return None, self.expected(why)
        if len(objects) != 1:
            return None, self.expected("the reply holds no JSON object" if not objects
                                       else f"the reply holds {len(objects)} JSON objects; send exactly one")
        (data,) = objects
        unknown = sorted(str(key) for key in data if key not in self.fields)
        if unknown:
            return None, self.expected(f"unknown field(s) {', '.join(repr(k[:40]) for k in unknown[:5])}")
        return self._validate(data)

    def _validate(self, data: dict[str, Any]) -> tuple[BaseModel | None, str | None]:
        from openenv.core.env_server.serialization import deserialize_action

        try:
            return deserialize_action(data, self.action_cls), None  # the peer's own action parsing
        except ValidationError as exc:
            problems = "; ".join(f"field {'.'.join(map(str, e['loc'])) or '(object)'}: {e['msg']}"
                                 for e in exc.errors()[:5])
            return None, self.expected(problems)
        except (TypeError, ValueError) as exc:
            return None, self.expected(f"{type(exc).__name__}: {str(exc)[:200]}")

    def to_text(self, action: Any) -> str:
        """The reply that parses to ``action`` (an Action, a dict of its fields, or raw text)."""
        if isinstance(action, str):
            return action
        data = action.model_dump(mode="json", exclude=set(SKIP_FIELDS)) if isinstance(action, BaseModel) else dict(action)
        if self.raw_field is not None:
            return str(data[self.raw_field])
        return json.dumps({k: v for k, v in data.items() if k not in SKIP_FIELDS}, ensure_ascii=False)


def json_objects(text: str) -> tuple[list[dict[str, Any]], str | None]:
    """The JSON objects in ``text``: the whole text (or its ```fence```) when it is one, else the top-level objects
    found in it; ``(objects, None)`` or ``([], why)``."""
    stripped = text.strip()
    fenced = _FENCE.match(stripped)
    if fenced:
        stripped = fenced.group(1).strip()
    try:
        whole = json.loads(stripped)
    except (ValueError, RecursionError):
        pass
    else:
        return ([whole], None) if isinstance(whole, dict) else ([], f"the reply is JSON {type(whole).__name__}, not an object")
    decoder = json.JSONDecoder()
    found: list[dict[str, Any]] = []
    at, tries = stripped.find("{"), 0
    while at != -1 and tries < MAX_DECODE_TRIES:
        tries += 1
        try:
            value, end = decoder.raw_decode(stripped, at)
        except (ValueError, RecursionError):
            at = stripped.find("{", at + 1)
            continue
        if isinstance(value, dict):
            found.append(value)
        at = stripped.find("{", end)
    if not found:
        return [], "the reply is not a JSON object"
    return found, None


def _type_name(annotation: Any) -> str:
    names = {str: "string", int: "integer", float: "number", bool: "boolean", list: "list", dict: "object"}
    if annotation in names:
        return names[annotation]
    origin = typing.get_origin(annotation)
    if origin in names:
        return names[origin]
    if origin is typing.Literal:
        return "one of " + ", ".join(json.dumps(a) for a in typing.get_args(annotation))
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if args and origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        return " or ".join(_type_name(a) for a in args)
    return getattr(annotation, "__name__", str(annotation))


def render(observation: dict[str, Any], rule: str = "auto") -> str:
    """Message text of an observation's fields (reward, done and metadata already left out)."""
    if rule not in ("auto", "json"):
        if rule not in observation:
            raise ValueError(f"env.render={rule!r}: the observation has no such field (fields: "
                             f"{', '.join(observation) or 'none'})")
        value = observation[rule]
        return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    if rule == "auto":
        for name in TEXT_FIELDS:
            if isinstance(observation.get(name), str):
                return observation[name]
    return json.dumps(observation, ensure_ascii=False, default=str)


_JSON_TYPES: dict[str, Any] = {"string": str, "integer": int, "number": float, "boolean": bool, "array": list,
                               "object": dict}


def action_model_from_schema(schema: dict[str, Any], title: str = "RemoteAction") -> type[BaseModel]:
    """An ``Action`` subclass from a server's ``/schema`` action JSON schema (plain fields; others typed Any)."""
    from openenv.core.env_server.types import Action

    required = set(schema.get("required", ()))
    fields: dict[str, Any] = {}
    for name, spec in (schema.get("properties") or {}).items():
        if name in SKIP_FIELDS or not isinstance(spec, dict):
            continue
        kinds = [s.get("type") for s in spec.get("anyOf", [spec]) if isinstance(s, dict)]
        typed = [_JSON_TYPES[k] for k in kinds if k in _JSON_TYPES]
        annotation: Any = typed[0] if len(typed) == 1 else Any
        if "null" in kinds and annotation is not Any:
            annotation = annotation | None
        default = ... if name in required else spec.get("default")
        fields[name] = (annotation, Field(default, description=spec.get("description")))
    return create_model(str(schema.get("title") or title), __base__=Action, **fields)
