"""Write the ``config.to_dict()`` of each decoder family perfd reads (perfd.analytics.steps.hf_spec)
as its Hugging Face config class builds it by default (the released model's shape, no weights, no
network), one JSON file per family: what ``StepHook(model=config.to_dict())`` is handed.

    python tests/data/hf_configs/make_configs.py     # needs transformers (5.23 made the files here)
"""

from __future__ import annotations

import json
from pathlib import Path

import transformers

# file stem -> (config class, causal-LM class): the test builds the model on the meta device.
FAMILIES: dict[str, tuple[str, str]] = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "mistral": ("MistralConfig", "MistralForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel"),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM"),
    "gemma": ("GemmaConfig", "GemmaForCausalLM"),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM"),
    "phi3": ("Phi3Config", "Phi3ForCausalLM"),
    "falcon": ("FalconConfig", "FalconForCausalLM"),
    "opt": ("OPTConfig", "OPTForCausalLM"),
    "starcoder2": ("Starcoder2Config", "Starcoder2ForCausalLM"),
    "granite": ("GraniteConfig", "GraniteForCausalLM"),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM"),
}


def main() -> None:
    here = Path(__file__).resolve().parent
    for stem, (config_cls, _) in FAMILIES.items():
        cfg = getattr(transformers, config_cls)()
        text = json.dumps(cfg.to_dict(), indent=1, sort_keys=True, default=str)
        (here / f"{stem}.json").write_text(text + "\n")
    (here / "transformers_version.txt").write_text(transformers.__version__ + "\n")


if __name__ == "__main__":
    main()
