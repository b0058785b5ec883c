"""[model.lora]: which modules get an adapter, how many parameters it trains, what rl refuses.

Parameter counts are checked on real model shapes built on the meta device (no weights), against
r * (d_in + d_out) per adapted matrix computed from the shapes alone.
"""

import json
import warnings
from pathlib import Path

import peft
import pytest
import torch
from pydantic import ValidationError
from transformers import AutoModelForCausalLM, PreTrainedModel, Qwen3Config, Qwen3MoeConfig

from lorarl.config.loader import load_config
from lorarl.config.model import LoraConfig
from lorarl.config.run import RLConfig
from lorarl.trainer.model import apply_lora, check_lora_for_rl, check_vllm_can_serve, parameter_summary

# Qwen3-0.6B and Qwen3-4B (their config.json): hidden, intermediate, layers, heads, kv heads.
QWEN3_SHAPES = {"0.6B": (1024, 3072, 28, 16, 8), "4B": (2560, 9728, 36, 32, 8)}
HEAD_DIM = 128
VOCAB = 151936


def qwen3_on_meta(hidden: int, intermediate: int, layers: int, heads: int, kv_heads: int) -> PreTrainedModel:
    config = Qwen3Config(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=intermediate,
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                         head_dim=HEAD_DIM, tie_word_embeddings=True)  # fmt: skip
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def dense_lora_params(r: int, hidden: int, intermediate: int, layers: int, heads: int, kv_heads: int,
                      modules: tuple[str, ...]) -> int:  # fmt: skip
    q, kv = heads * HEAD_DIM, kv_heads * HEAD_DIM
    d_in_out = {"q_proj": (hidden, q), "k_proj": (hidden, kv), "v_proj": (hidden, kv), "o_proj": (q, hidden),
                "gate_proj": (hidden, intermediate), "up_proj": (hidden, intermediate),
                "down_proj": (intermediate, hidden)}  # fmt: skip
    return layers * sum(r * sum(d_in_out[m]) for m in modules)


ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@pytest.mark.parametrize("size", QWEN3_SHAPES)
def test_trainable_parameters_are_r_times_d_in_plus_d_out(size: str) -> None:
    shapes = QWEN3_SHAPES[size]
    model = apply_lora(qwen3_on_meta(*shapes), LoraConfig(rank=16, alpha=32))
    summary = parameter_summary(model)
    expected = dense_lora_params(16, *shapes, ALL)
    assert summary["params/trainable"] == expected
    assert summary["params/trainable_bytes"] == 4 * expected  # float32
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert all(".lora_A." in n or ".lora_B." in n for n in trainable)


@pytest.mark.parametrize(
    ("target_modules", "modules"),
    [
        # "all-linear": every linear layer but the output head; here the seven projections.
        ("all-linear", ALL),
        # A string is a regular expression that must match the whole module path.
        (r"model\.layers\.\d+\.self_attn\.(q|v)_proj", ("q_proj", "v_proj")),
        # Names the model lacks are ignored.
        (["q_proj", "o_proj", "c_attn", "w1"], ("q_proj", "o_proj")),
        # Dotted suffixes.
        (["self_attn.o_proj", "mlp.down_proj"], ("o_proj", "down_proj")),
    ],
)
def test_target_modules_forms(target_modules: list[str] | str, modules: tuple[str, ...]) -> None:
    shapes = QWEN3_SHAPES["0.6B"]
    model = apply_lora(qwen3_on_meta(*shapes), LoraConfig(rank=8, target_modules=target_modules))
    assert parameter_summary(model)["params/trainable"] == dense_lora_params(8, *shapes, modules)


@pytest.mark.parametrize(
    ("exclude_modules", "layers_left"),
    [
        (["down_proj"], None),
        # A regex: every module of the first two layers.
        (r"model\.layers\.[01]\..*", 26),
    ],
)
def test_exclude_modules(exclude_modules: list[str] | str, layers_left: int | None) -> None:
    hidden, intermediate, layers, heads, kv = QWEN3_SHAPES["0.6B"]
    model = apply_lora(
        qwen3_on_meta(hidden, intermediate, layers, heads, kv), LoraConfig(exclude_modules=exclude_modules)
    )
    if layers_left is None:
        expected = dense_lora_params(8, hidden, intermediate, layers, heads, kv, ALL[:-1])
    else:
        expected = dense_lora_params(8, hidden, intermediate, layers_left, heads, kv, ALL)
    assert parameter_summary(model)["params/trainable"] == expected


@pytest.mark.parametrize(
    ("lora", "says"),
    [
        (LoraConfig(target_modules=["c_attn", "w1"]), "target_modules = ['c_attn', 'w1'] adapts no module"),
        # A bare name as a string is a regex, which must match a whole path such as model.layers.0.self_attn.q_proj.
        (LoraConfig(target_modules="q_proj"), "target_modules = 'q_proj' adapts no module"),
        (LoraConfig(target_modules=["q_proj"], exclude_modules=["q_proj"]), "exclude_modules = ['q_proj']"),
    ],
)
def test_adapting_nothing_is_an_error_naming_the_setting(lora: LoraConfig, says: str) -> None:
    with pytest.raises(ValueError, match="adapts no module") as e:
        apply_lora(qwen3_on_meta(*QWEN3_SHAPES["0.6B"]), lora)
    assert says in str(e.value)
    assert "[model.lora]" in str(e.value)
    assert "Linear modules of this model: down_proj, gate_proj, k_proj, lm_head, o_proj" in str(e.value)


def test_a_regex_or_all_linear_from_the_command_line_is_a_string() -> None:
    """The command line gives list-or-string keys as lists; a one-item list that is no module name
    is the string the user meant."""

    def lora(*flags: str) -> LoraConfig:
        return load_config(RLConfig, ["--model.name", "m", *flags]).lora

    assert lora("--model.lora.target_modules", "all-linear").target_modules == "all-linear"
    assert lora("--model.lora.target_modules", r".*\.q_proj").target_modules == r".*\.q_proj"
    assert lora("--model.lora.exclude_modules", r".*\.0\..*").exclude_modules == r".*\.0\..*"
    assert lora("--model.lora.target_modules", "q_proj").target_modules == ["q_proj"]
    assert lora("--model.lora.target_modules", "q_proj,v_proj").target_modules == ["q_proj", "v_proj"]
    assert lora().exclude_modules == [] and lora().modules_to_save == []


@pytest.mark.parametrize(
    ("value", "message"),
    [("model.(q_proj", "not a valid regular expression"), (["q_proj", ".*v_proj"], "not patterns")],
)
def test_target_modules_that_can_never_match_are_refused_at_load(value: list[str] | str, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        LoraConfig(target_modules=value)


def test_modules_to_save_trains_the_whole_module_for_sft_and_rl_refuses_it(tmp_path: Path) -> None:
    hidden, intermediate, layers, heads, kv = QWEN3_SHAPES["0.6B"]
    # PEFT matches these names as suffixes of module paths: "norm" alone would also take q_norm,
    # input_layernorm, ... of every layer.
    lora = LoraConfig(modules_to_save=["model.norm"])
    model = apply_lora(qwen3_on_meta(hidden, intermediate, layers, heads, kv), lora)
    # The final RMSNorm (one weight of size hidden) is trained in full next to the adapter.
    expected = dense_lora_params(8, hidden, intermediate, layers, heads, kv, ALL) + hidden
    assert parameter_summary(model)["params/trainable"] == expected

    with pytest.raises(ValueError, match=r"\[model.lora\] modules_to_save trains \['model.norm'\] in full.*vLLM"):
        check_lora_for_rl(lora)
    check_lora_for_rl(LoraConfig())

    # An sft adapter with modules_to_save cannot start an rl run either.
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    saved = {"r": 8, "lora_alpha": 16.0, "use_rslora": False, "modules_to_save": ["lm_head"]}
    (adapter / "adapter_config.json").write_text(json.dumps(saved))
    with pytest.raises(ValueError, match=r"init_adapter .* trains \['lm_head'\] in full"):
        check_lora_for_rl(LoraConfig(init_adapter=adapter))
    (adapter / "adapter_config.json").write_text(json.dumps(saved | {"modules_to_save": None, "r": 16}))
    with pytest.raises(ValueError, match="r=16"):  # and it still checks what check_init_adapter checks
        check_lora_for_rl(LoraConfig(init_adapter=adapter))


# Qwen3-30B-A3B (its config.json), two of its 48 layers: every layer is a sparse MoE block.
MOE = {"hidden": 2048, "moe_intermediate": 768, "experts": 128, "heads": 32, "kv_heads": 4, "layers": 2}


def qwen3_moe(on_meta: bool, hidden: int, moe_intermediate: int, experts: int, heads: int, kv_heads: int,
              layers: int) -> PreTrainedModel:  # fmt: skip
    config = Qwen3MoeConfig(vocab_size=VOCAB if on_meta else 64, hidden_size=hidden, intermediate_size=3 * hidden,
                            moe_intermediate_size=moe_intermediate, num_experts=experts, num_experts_per_tok=2,
                            num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                            head_dim=HEAD_DIM if on_meta else 16, decoder_sparse_step=1, mlp_only_layers=[],
                            tie_word_embeddings=False)  # fmt: skip
    torch.manual_seed(0)
    if on_meta:
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(config)
    return AutoModelForCausalLM.from_config(config)


def test_moe_experts_are_fused_parameters_that_peft_adapts_per_expert() -> None:
    """transformers 5 stores Qwen3-MoE experts as 3D parameters, not nn.Linear. PEFT maps the
    expert projections named in target_modules onto them (gate_proj + up_proj -> the fused
    gate_up_proj at rank 2r, down_proj -> down_proj): one LoRA per expert."""
    h, i, e, heads, kv, layers = MOE.values()
    model = qwen3_moe(True, **MOE)
    assert tuple(model.model.layers[0].mlp.experts.gate_up_proj.shape) == (e, 2 * i, h)
    assert tuple(model.model.layers[0].mlp.experts.down_proj.shape) == (e, h, i)
    r = 8
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PEFT warns that it converted the v4 names
        model = apply_lora(model, LoraConfig(rank=r))
    q, kvd = heads * HEAD_DIM, kv * HEAD_DIM
    attention = r * ((h + q) + 2 * (h + kvd) + (q + h))
    experts = e * (2 * r * (h + 2 * i) + r * (i + h))
    assert parameter_summary(model)["params/trainable"] == layers * (attention + experts)
    cfg = model.peft_config["default"]
    assert cfg.target_parameters == {"gate_up_proj", "down_proj"}
    check_vllm_can_serve(model)  # rl serves it (tests/unit/trainer/test_moe_lora.py)

    # "all-linear" resolves to the same, plus the router's weight (not an nn.Linear either).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = apply_lora(qwen3_moe(True, **MOE), LoraConfig(rank=r, target_modules="all-linear"))
    assert model.peft_config["default"].target_parameters == {"gate_up_proj", "down_proj", "gate.weight"}
    router = r * (h + e)
    assert parameter_summary(model)["params/trainable"] == layers * (attention + experts + router)

    # Attention only: nothing of the experts is adapted, and vLLM can serve it.
    model = apply_lora(
        qwen3_moe(True, **MOE), LoraConfig(rank=r, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    )
    assert parameter_summary(model)["params/trainable"] == layers * attention
    check_vllm_can_serve(model)

    # gate_proj alone cannot be adapted: PEFT fused it with up_proj.
    with pytest.raises(ValueError, match=r"\[model.lora\] target_modules = \['q_proj', 'gate_proj'\]: .*up_proj"):
        apply_lora(qwen3_moe(True, **MOE), LoraConfig(target_modules=["q_proj", "gate_proj"]))


def test_moe_expert_lora_trains_and_round_trips_on_a_tiny_model(tmp_path: Path) -> None:
    tiny = {"hidden": 32, "moe_intermediate": 16, "experts": 4, "heads": 2, "kv_heads": 1, "layers": 2}
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(1))
    base_logits = qwen3_moe(False, **tiny)(input_ids=ids).logits
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = apply_lora(qwen3_moe(False, **tiny), LoraConfig(rank=4))
    # A fresh adapter (B = 0) is the base model.
    assert torch.allclose(model(input_ids=ids).logits, base_logits, atol=1e-6)

    model(input_ids=ids).logits.logsumexp(-1).sum().backward()
    expert_lora = {n: p for n, p in model.named_parameters() if p.requires_grad and ".experts." in n}
    assert len(expert_lora) == 2 * 2 * 2  # layers x (gate_up_proj, down_proj) x (A, B)
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for n, p in expert_lora.items() if "lora_B" in n)

    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(std=0.05)
    trained = model(input_ids=ids).logits
    assert not torch.allclose(trained, base_logits, atol=1e-4)
    model.save_pretrained(tmp_path / "adapter")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reloaded = peft.PeftModel.from_pretrained(qwen3_moe(False, **tiny), str(tmp_path / "adapter"))
    assert torch.allclose(reloaded(input_ids=ids).logits, trained, atol=1e-5)
