"""The binary side of the Tinker wire format: protobuf bodies, zstd, and the tensors inside them.

The client sends ``forward_backward`` as a protobuf ``ForwardBackwardRequest`` (optionally zstd
compressed) and accepts ``ForwardBackwardOutput`` and ``SampleResponse`` results only as protobuf.
The schema is declared here from the field numbers the client uses (written as a descriptor in
code, so the server needs neither the client package nor ``protoc``); fields the server does not
read (images, audio, provenance spans, top-k logprobs) are left out and skipped by the parser.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import zstandard
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from skyrl_core.http_hygiene import shown

_PACKAGE = "skyrl_tinker.wire"
# descriptor_pb2.FieldDescriptorProto types and labels used below
_DOUBLE, _INT64, _INT32, _BOOL, _STRING, _MESSAGE, _BYTES, _UINT32 = 1, 3, 5, 8, 9, 11, 12, 13
_OPTIONAL, _REPEATED = 1, 3

# proto DType enum values
DTYPE_FLOAT32, DTYPE_INT64, DTYPE_INT32 = 1, 2, 3
_NUMPY_OF_DTYPE = {DTYPE_FLOAT32: np.float32, DTYPE_INT64: np.int64, DTYPE_INT32: np.int32}
STOP_REASON = {"stop": 0, "length": 1}
MASK_LOGPROB = -99999.0  # an empty top-k cell (with token id 0), as the client reads it
DECOMPRESS_CHUNK = 1 << 20  # zstd output is read this much at a time and counted as it comes
# The most a valid protobuf datum spends per token: an int32 id, an int64 target and three float32 inputs
# (24 bytes), with room for framing. A compressed body may expand to what the largest valid batch needs.
BYTES_PER_TOKEN = 32


class WireError(ValueError):
    """A body that cannot be decoded (400); the message says what was wrong."""

    status = 400


class BodyTooLargeError(WireError):
    """A compressed body that expands past the server's limit (413)."""

    status = 413


# --- schema --------------------------------------------------------------------------------------

_MESSAGES: dict[str, list[tuple[str, int, int, int, str]]] = {
    # name: [(field, number, type, label, message type)]
    "SparseCsr": [("values", 1, _BYTES, _OPTIONAL, ""), ("crow_indices", 2, _BYTES, _OPTIONAL, ""),
                  ("col_indices", 3, _BYTES, _OPTIONAL, "")],
    "Tensor": [("dense", 1, _BYTES, _OPTIONAL, ""), ("sparse_csr", 2, _MESSAGE, _OPTIONAL, "SparseCsr"),
               ("dtype", 3, _INT32, _OPTIONAL, ""), ("shape", 4, _INT64, _REPEATED, "")],
    "EncodedTextChunk": [("tokens", 1, _BYTES, _OPTIONAL, "")],
    "Chunk": [("encoded_text", 1, _MESSAGE, _OPTIONAL, "EncodedTextChunk")],
    "Datum": [("model_input", 1, _MESSAGE, _REPEATED, "Chunk")],
    "LossConfigValue": [("number", 1, _DOUBLE, _OPTIONAL, ""), ("text", 2, _STRING, _OPTIONAL, "")],
    "ForwardBackwardRequest": [("model_id", 1, _STRING, _OPTIONAL, ""), ("seq_id", 2, _INT32, _OPTIONAL, ""),
                               ("data", 3, _MESSAGE, _REPEATED, "Datum"), ("loss_fn", 4, _STRING, _OPTIONAL, ""),
                               ("forward_only", 6, _BOOL, _OPTIONAL, "")],
    "BatchedTensor": [("data", 1, _BYTES, _OPTIONAL, ""), ("offsets", 2, _BYTES, _OPTIONAL, ""),
                      ("dtype", 3, _INT32, _OPTIONAL, ""), ("trailing_shape", 4, _INT64, _REPEATED, "")],
    "ArrayRecord": [("type_tag", 1, _STRING, _OPTIONAL, ""), ("num_datums", 3, _INT64, _OPTIONAL, "")],
    "ForwardBackwardOutput": [("loss_fn_output_type", 1, _STRING, _OPTIONAL, ""),
                              ("loss_fn_outputs", 2, _MESSAGE, _REPEATED, "ArrayRecord")],
    "SampledSequence": [("stop_reason", 1, _INT32, _OPTIONAL, ""), ("tokens", 2, _BYTES, _OPTIONAL, ""),
                        ("logprobs", 3, _BYTES, _OPTIONAL, "")],
    "TopkLogprobs": [("token_ids", 1, _BYTES, _OPTIONAL, ""), ("logprobs", 2, _BYTES, _OPTIONAL, ""),
                     ("k", 3, _UINT32, _OPTIONAL, ""), ("length", 4, _UINT32, _OPTIONAL, "")],
    "SampleResponse": [("sequences", 1, _MESSAGE, _REPEATED, "SampledSequence"),
                       ("prompt_logprobs", 2, _BYTES, _OPTIONAL, ""),
                       ("topk_prompt_logprobs", 3, _MESSAGE, _OPTIONAL, "TopkLogprobs")],
}
# map fields: (message, field, number, value type, value message type)
_MAPS = [
    ("Datum", "loss_fn_inputs", 2, _MESSAGE, "Tensor"),
    ("ForwardBackwardRequest", "loss_fn_config", 5, _DOUBLE, ""),
    ("ForwardBackwardRequest", "loss_fn_config_v2", 7, _MESSAGE, "LossConfigValue"),
    ("ArrayRecord", "fields", 2, _MESSAGE, "BatchedTensor"),
    ("ForwardBackwardOutput", "metrics", 3, _DOUBLE, ""),
]
_ONEOFS = {"Tensor": ("encoding", ("dense", "sparse_csr")), "LossConfigValue": ("value", ("number", "text"))}


def _build_classes() -> dict[str, Any]:
    file = descriptor_pb2.FileDescriptorProto(name="skyrl_tinker_wire.proto", package=_PACKAGE, syntax="proto3")
    protos = {}
    for name, fields in _MESSAGES.items():
        message = file.message_type.add(name=name)
        oneof = _ONEOFS.get(name)
        if oneof:
            message.oneof_decl.add(name=oneof[0])
        for fname, number, ftype, label, type_name in fields:
            f = message.field.add(name=fname, number=number, type=ftype, label=label)
            if type_name:
                f.type_name = f".{_PACKAGE}.{type_name}"
            if oneof and fname in oneof[1]:
                f.oneof_index = 0
        protos[name] = message
    for owner, fname, number, vtype, vmessage in _MAPS:
        entry_name = "".join(part.capitalize() for part in fname.split("_")) + "Entry"
        entry = protos[owner].nested_type.add(name=entry_name)
        entry.options.map_entry = True
        entry.field.add(name="key", number=1, type=_STRING, label=_OPTIONAL)
        value = entry.field.add(name="value", number=2, type=vtype, label=_OPTIONAL)
        if vmessage:
            value.type_name = f".{_PACKAGE}.{vmessage}"
        protos[owner].field.add(name=fname, number=number, type=_MESSAGE, label=_REPEATED,
                                type_name=f".{_PACKAGE}.{owner}.{entry_name}")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{_PACKAGE}.{name}"))
            for name in _MESSAGES}


_CLASSES = _build_classes()


# --- decoded request -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Bounds:
    """What one forward_backward request may hold, checked from byte and list lengths before anything is
    turned into Python values: a body of a few kB must not cost gigabytes before it is refused."""

    max_datums: int  # per request (--max-batch-datums)
    max_tokens: int  # per datum: the model's context; every loss input has one entry per token

    def largest_body(self) -> int:
        """The size of the largest valid protobuf request (the cap on what a compressed body expands to)."""
        return self.max_datums * (self.max_tokens * BYTES_PER_TOKEN + 256) + 64 * 1024

    def check_datums(self, count: int) -> None:
        if count > self.max_datums:
            raise WireError(f"batch has {count} datums, the server accepts at most {self.max_datums} per request "
                            "(--max-batch-datums)")

    def check_tokens(self, count: int, index: int) -> None:
        if count > self.max_tokens:
            raise WireError(f"datum {index}: {count} tokens, the model's context is {self.max_tokens}")


@dataclass
class DatumIn:
    """One training example: input tokens and named loss inputs (numpy, dense)."""

    tokens: list[int]
    loss_fn_inputs: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass
class ForwardBackwardIn:
    model_id: str
    seq_id: int | None
    data: list[DatumIn]
    loss_fn: str
    loss_fn_config: dict[str, float | str]
    forward_only: bool


def decompress(body: bytes, encoding: str | None, max_bytes: int) -> bytes:
    """``body`` as sent, or zstd-decompressed when ``Content-Encoding`` says so. Decompression stops
    with :class:`BodyTooLargeError` as soon as the output passes ``max_bytes`` (a zstd bomb holds at
    most ``max_bytes`` plus one chunk in memory)."""
    if not encoding or encoding.lower() == "identity":
        return body
    if encoding.lower() != "zstd":
        raise WireError(f"unsupported Content-Encoding {shown(encoding)}; this server accepts zstd or none")
    chunks, size = [], 0
    try:
        with zstandard.ZstdDecompressor().stream_reader(body) as reader:
            while chunk := reader.read(DECOMPRESS_CHUNK):
                size += len(chunk)
                if size > max_bytes:
                    raise BodyTooLargeError(f"the zstd body decompresses to more than {max_bytes:,} bytes, the "
                                            "most a valid request of this server needs")
                chunks.append(chunk)
    except zstandard.ZstdError:
        raise WireError("body is not valid zstd") from None
    return b"".join(chunks)


def parse_forward_backward(body: bytes, bounds: Bounds) -> ForwardBackwardIn:
    """Decode a protobuf ``ForwardBackwardRequest`` within ``bounds``: the datum count, each datum's token
    count and each tensor's entry count are checked from byte lengths before any of them is materialised."""
    msg = _CLASSES["ForwardBackwardRequest"]()
    try:
        msg.ParseFromString(body)
    except Exception:  # protobuf raises DecodeError or RuntimeError depending on the backend
        raise WireError("body is not a ForwardBackwardRequest protobuf") from None
    bounds.check_datums(len(msg.data))
    config: dict[str, float | str] = {k: float(v) for k, v in msg.loss_fn_config.items()}
    for key, value in msg.loss_fn_config_v2.items():
        config[key] = value.text if value.WhichOneof("value") == "text" else float(value.number)
    data = []
    for i, datum in enumerate(msg.data):
        if not all(chunk.HasField("encoded_text") for chunk in datum.model_input):
            raise WireError(f"datum {i}: only token chunks (EncodedTextChunk) are supported; "
                            "image and audio chunks are not")
        size = sum(len(chunk.encoded_text.tokens) for chunk in datum.model_input)
        if size % 4:
            raise WireError(f"datum {i}: its token chunks are not whole int32 ids ({size} bytes)")
        bounds.check_tokens(size // 4, i)
        tokens = np.frombuffer(b"".join(chunk.encoded_text.tokens for chunk in datum.model_input), np.int32).tolist()
        inputs = {name: _tensor(tensor, f"datum {i} loss_fn_inputs[{shown(name)}]", bounds.max_tokens)
                  for name, tensor in datum.loss_fn_inputs.items()}
        data.append(DatumIn(tokens, inputs))
    return ForwardBackwardIn(msg.model_id, msg.seq_id or None, data, msg.loss_fn, config, msg.forward_only)


def _tensor(msg: Any, where: str, max_entries: int) -> np.ndarray:
    np_dtype = _NUMPY_OF_DTYPE.get(msg.dtype)
    if np_dtype is None:
        raise WireError(f"{where}: unsupported dtype code {msg.dtype}")
    shape = _bounded_shape([int(s) for s in msg.shape], where, max_entries)
    try:
        if msg.WhichOneof("encoding") == "sparse_csr":
            csr = msg.sparse_csr
            values = np.frombuffer(csr.values, dtype=np_dtype)
            crow = np.frombuffer(csr.crow_indices, dtype=np.int64)
            cols = np.frombuffer(csr.col_indices, dtype=np.int64)
            if len(shape) != 2 or len(crow) != shape[0] + 1 or len(cols) != len(values):
                raise WireError(f"{where}: malformed sparse CSR tensor")
            dense = np.zeros(shape, dtype=np_dtype)
            for row in range(shape[0]):
                lo, hi = int(crow[row]), int(crow[row + 1])
                dense[row, cols[lo:hi]] = values[lo:hi]
            return dense
        if len(msg.dense) > max_entries * np.dtype(np_dtype).itemsize:
            raise WireError(f"{where}: has more than {max_entries} entries (one per token at most)")
        flat = np.frombuffer(msg.dense, dtype=np_dtype)
        return (flat.reshape(shape) if shape else flat).copy()  # frombuffer arrays are read-only
    except WireError:
        raise
    except (ValueError, IndexError):
        raise WireError(f"{where}: data does not match shape {shape}") from None


def _bounded_shape(shape: list[int], where: str, max_entries: int) -> list[int]:
    """``shape`` if no dimension is negative and it holds at most ``max_entries`` entries (a valid loss input
    holds one per token; a sparse tensor is expanded, so its shape alone could ask for petabytes)."""
    if len(shape) > 8 or any(n < 0 for n in shape) or int(np.prod(shape, dtype=object)) > max_entries:
        raise WireError(f"{where}: shape {shape[:8]} is negative or holds more than {max_entries} entries "
                        "(one per token at most)")
    return shape


def tensor_from_json(value: Any, where: str, max_entries: int) -> np.ndarray:
    """A ``TensorData`` JSON object (``data``, ``dtype``, ``shape``, optional CSR indices) as numpy, of at
    most ``max_entries`` entries."""
    if not isinstance(value, Mapping):
        raise WireError(f"{where}: must be a TensorData object (data, dtype, shape)")
    np_dtype = {"float32": np.float32, "int64": np.int64}.get(value.get("dtype"))
    if np_dtype is None:
        raise WireError(f"{where}: dtype must be float32 or int64, got {shown(value.get('dtype'))}")
    raw, shape = value.get("data", []), value.get("shape")
    try:
        if isinstance(raw, list) and len(raw) > max_entries:
            raise WireError(f"{where}: has more than {max_entries} entries (one per token at most)")
        data = np.asarray(raw, dtype=np_dtype)
        shape = _bounded_shape(list(shape or [len(data)]), where, max_entries)
        if value.get("sparse_crow_indices") is not None:
            crow, cols = value["sparse_crow_indices"], value.get("sparse_col_indices") or []
            dense = np.zeros(shape, dtype=np_dtype)
            for row in range(shape[0]):
                dense[row, cols[crow[row]:crow[row + 1]]] = data[crow[row]:crow[row + 1]]
            return dense
        return data.reshape(shape)
    except WireError:
        raise
    except (ValueError, IndexError, TypeError, OverflowError):
        raise WireError(f"{where}: data does not fit dtype {value.get('dtype')} and shape {shown(shape)}") from None


# --- encoded results -----------------------------------------------------------------------------

def encode_forward_backward_output(outputs: Sequence[Mapping[str, np.ndarray]], metrics: Mapping[str, float],
                                   output_type: str = "ArrayRecord") -> bytes:
    """Per-datum 1-D float32 arrays as one batched ``ArrayRecord`` (concatenated, with byte offsets)."""
    msg = _CLASSES["ForwardBackwardOutput"](loss_fn_output_type=output_type)
    for key, value in metrics.items():
        msg.metrics[key] = float(value)
    record = msg.loss_fn_outputs.add(type_tag=output_type, num_datums=len(outputs))
    names = list(outputs[0]) if outputs else []
    for name in names:
        arrays = [np.ascontiguousarray(o[name], dtype=np.float32).reshape(-1) for o in outputs]
        offsets = np.cumsum([0] + [a.nbytes for a in arrays], dtype=np.int64)
        record.fields[name].data = b"".join(a.tobytes() for a in arrays)
        record.fields[name].offsets = offsets.tobytes()
        record.fields[name].dtype = DTYPE_FLOAT32
    return msg.SerializeToString()


def encode_sample_response(sequences: Sequence[tuple[str, Sequence[int], Sequence[float]]],
                           prompt_logprobs: Sequence[float] | None = None,
                           prompt_topk: tuple[np.ndarray, np.ndarray] | None = None) -> bytes:
    """``(stop_reason, tokens, logprobs)`` per sample; prompt logprobs with NaN where none (position 0);
    top-k prompt logprobs as ``(token ids, logprobs)``, both ``[len(prompt), k]``, empty rows masked."""
    msg = _CLASSES["SampleResponse"]()
    for stop_reason, tokens, logprobs in sequences:
        msg.sequences.add(stop_reason=STOP_REASON[stop_reason], tokens=np.asarray(tokens, np.int32).tobytes(),
                          logprobs=np.asarray(logprobs, np.float32).tobytes())
    if prompt_logprobs is not None:
        msg.prompt_logprobs = np.asarray(prompt_logprobs, np.float32).tobytes()
    if prompt_topk is not None:
        ids, lps = prompt_topk
        msg.topk_prompt_logprobs.token_ids = np.ascontiguousarray(ids, np.int32).tobytes()
        msg.topk_prompt_logprobs.logprobs = np.ascontiguousarray(lps, np.float32).tobytes()
        msg.topk_prompt_logprobs.length, msg.topk_prompt_logprobs.k = ids.shape
    return msg.SerializeToString()
