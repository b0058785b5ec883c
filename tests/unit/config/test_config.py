import json
import sys
from pathlib import Path

import pytest

from lorarl.config.loader import ConfigError, load_config, load_run
from lorarl.config.run import RLConfig, RLRunMode
from lorarl.config.sft import SFTConfig
from lorarl.inference.server import adapter_slots, served_lora_rank
from lorarl.variants import variant_configs


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def test_files_merge_left_to_right(tmp_path: Path) -> None:
    a = write(tmp_path / "a.toml", '[model]\nname = "m"\n[trainer.optim]\nlr = 1e-3\nweight_decay = 0.1\n')
    b = write(tmp_path / "b.toml", "seed = 2\n[trainer.optim]\nlr = 2e-3\n")
    cfg = load_config(RLConfig, ["@", a, f"@{b}"])
    assert cfg.model.name == "m"
    assert cfg.seed == 2
    assert cfg.trainer.optim.lr == 2e-3
    # Tables merge key by key: b's [trainer.optim] keeps a's weight_decay.
    assert cfg.trainer.optim.weight_decay == 0.1


def test_lists_replace(tmp_path: Path) -> None:
    a = write(tmp_path / "a.toml", '[model]\nname = "m"\n[inference]\nurls = ["http://a", "http://b"]\n')
    b = write(tmp_path / "b.toml", '[inference]\nurls = ["http://c"]\n')
    assert load_config(RLConfig, ["@", a, "@", b]).inference.urls == ["http://c"]


def test_cli_overrides_files_wherever_it_appears(tmp_path: Path) -> None:
    a = write(tmp_path / "a.toml", 'seed = 1\n[model]\nname = "m"\n')
    assert load_config(RLConfig, ["@", a, "--seed", "3"]).seed == 3
    assert load_config(RLConfig, ["--seed", "3", "@", a]).seed == 3


def test_nested_dotted_overrides() -> None:
    cfg = load_config(
        RLConfig,
        [
            "--model.name",
            "m",
            "--trainer.optim.lr",
            "1e-4",
            "--orchestrator.sampling.temperature=0.7",
            "--orchestrator.advantage.type",
            "rloo",
            "--trainer.loss.type=cispo",
            "--trainer.loss.ratio_high",
            "4",
        ],
    )
    assert cfg.trainer.optim.lr == 1e-4
    assert cfg.orchestrator.sampling.temperature == 0.7
    assert cfg.orchestrator.advantage.type == "rloo"
    assert (cfg.trainer.loss.type, cfg.trainer.loss.ratio_high) == ("cispo", 4.0)
    assert load_config(RLConfig, ["--model.name", "m", "--model.lora.use_rslora"]).lora.use_rslora is True


def test_null_unsets_a_list_as_it_unsets_a_string(tmp_path: Path) -> None:
    a = tmp_path / "a.toml"
    a.write_text('[model]\nname = "m"\n[trainer]\ngpu_ids = [6, 7]\n[inference]\ngpu_ids = [0]\n')
    cfg = load_config(RLConfig, ["@", str(a), "--trainer.gpu_ids", "null", "--inference.gpu_ids=null"])
    assert cfg.trainer.gpu_ids is None and cfg.inference.gpu_ids is None
    assert load_config(RLConfig, ["@", str(a), "--trainer.gpu_ids", "[1]"]).trainer.gpu_ids == [1]


@pytest.mark.parametrize("flag", ["--dry-run", "--dry_run"])
def test_dry_run_is_a_run_mode_apart_from_the_experiment(flag: str, tmp_path: Path) -> None:
    cfg, mode = load_run(RLConfig, RLRunMode, ["--model.name", "m", flag, "--auto_resume", "2"])
    assert (mode.dry_run, mode.auto_resume) == (True, 2) and "dry_run" not in cfg.model_dump()
    assert load_run(RLConfig, RLRunMode, ["--model.name", "m"])[1].dry_run is False
    # A config file may set a run mode too; a command that takes no run mode refuses the flag.
    path = tmp_path / "rl.toml"
    path.write_text('overwrite = true\n[model]\nname = "m"\n')
    assert load_run(RLConfig, RLRunMode, ["@", str(path)])[1].overwrite is True
    with pytest.raises(ConfigError, match="unrecognized arguments: --dry-run"):
        load_config(RLConfig, ["--model.name", "m", "--dry-run"])
    with pytest.raises(ConfigError, match="auto_resume: Input should be greater than or equal to 0"):
        load_run(RLConfig, RLRunMode, ["--model.name", "m", "--auto_resume", "-1"])


@pytest.mark.parametrize(
    "args",
    [
        ["--inference.urls", '["http://a","http://b"]'],
        ["--inference.urls", "http://a", "--inference.urls", "http://b"],
        ["--inference.urls", "http://a,http://b"],
    ],
)
def test_cli_lists(args: list[str]) -> None:
    assert load_config(RLConfig, ["--model.name", "m", *args]).inference.urls == ["http://a", "http://b"]


def test_section_default_is_updated_not_replaced(tmp_path: Path) -> None:
    a = write(tmp_path / "a.toml", '[model]\nname = "m"\n[data]\npath = "d.jsonl"\n[optim]\nweight_decay = 0.1\n')
    cfg = load_config(SFTConfig, ["@", a])
    assert cfg.optim.lr == 1e-3  # SFTConfig's own default, not OptimConfig's
    assert cfg.optim.weight_decay == 0.1


def test_unknown_key_in_file_names_key_and_file(tmp_path: Path) -> None:
    a = write(tmp_path / "x.toml", '[model]\nname = "m"\n[trainer.optim]\nlrr = 1e-4\n')
    with pytest.raises(ConfigError) as exc:
        load_config(RLConfig, ["@", a])
    assert "trainer.optim.lrr" in str(exc.value)
    assert a in str(exc.value)


def test_unknown_key_in_second_file_names_that_file(tmp_path: Path) -> None:
    a = write(tmp_path / "a.toml", '[model]\nname = "m"\n')
    b = write(tmp_path / "b.toml", "[orchestrator.sampling]\ntemprature = 0.5\n")
    with pytest.raises(ConfigError) as exc:
        load_config(RLConfig, ["@", a, "@", b])
    msg = str(exc.value)
    assert "orchestrator.sampling.temprature" in msg
    assert b in msg
    assert a not in msg


def test_unknown_cli_flag() -> None:
    with pytest.raises(ConfigError, match="--trainer.optim.lrr"):
        load_config(RLConfig, ["--model.name", "m", "--trainer.optim.lrr", "1e-4"])


def test_bad_type_names_key_and_source(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as exc:
        load_config(RLConfig, ["--model.name", "m", "--seed", "abc"])
    assert "seed" in str(exc.value)
    assert "command line" in str(exc.value)

    a = write(tmp_path / "a.toml", '[model]\nname = "m"\n[orchestrator.sampling]\ntemperature = -1\n')
    with pytest.raises(ConfigError) as exc:
        load_config(RLConfig, ["@", a])
    assert "orchestrator.sampling.temperature" in str(exc.value)
    assert "greater than 0" in str(exc.value)
    assert a in str(exc.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[trainer]\npacking = "false"\n', 'trainer: packing = "false": packing takes true or false, not a string'),
        ('[inference]\ntime_share = "no"\n', 'inference: time_share = "no": time_share takes true or false'),
        ("[orchestrator.sampling]\ntop_k = true\n", "orchestrator.sampling: top_k = true: top_k takes a number"),
        ('[trainer]\npacking = "{key} {x"\n', 'trainer: packing = "{key} {x": packing takes true or false'),
    ],
)
def test_a_value_of_another_kind_names_its_key_and_the_one_file_that_set_it(
    tmp_path: Path, text: str, message: str
) -> None:
    """A string where true or false is meant (pydantic read "false" as false, and "no" as well), a bool
    where a number is: refused in one line naming the key and the file that set it, not every file that
    set a key of its section."""
    a = write(tmp_path / "a.toml", '[model]\nname = "m"\n[trainer]\nmicro_batch_size = 2\n')
    b = write(tmp_path / "b.toml", text)
    with pytest.raises(ConfigError) as exc:
        load_config(RLConfig, ["@", a, "@", b])
    assert str(exc.value).startswith(message) and str(exc.value).endswith(f"(from {b})")
    cfg = load_config(RLConfig, ["@", a, "--no-trainer.packing", "--inference.time_share"])  # the flags' bools
    assert cfg.trainer.packing is False and cfg.inference.time_share is True


def test_missing_required_key() -> None:
    with pytest.raises(ConfigError) as exc:
        load_config(SFTConfig, ["--model.name", "m"])
    assert "data.path" in str(exc.value)


def test_missing_file(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.toml")
    with pytest.raises(ConfigError, match="not found") as exc:
        load_config(RLConfig, ["@", missing])
    assert missing in str(exc.value)


def test_bad_toml_names_file_and_parser_message(tmp_path: Path) -> None:
    a = write(tmp_path / "a.toml", "[model\nname = 'm'\n")
    with pytest.raises(ConfigError) as exc:
        load_config(RLConfig, ["@", a])
    assert a in str(exc.value)
    assert "line 1" in str(exc.value)


def test_json_file(tmp_path: Path) -> None:
    a = write(tmp_path / "a.json", json.dumps({"model": {"name": "m"}, "trainer": {"optim": {"lr": 3e-4}}}))
    cfg = load_config(RLConfig, [f"@{a}"])
    assert cfg.model.name == "m"
    assert cfg.trainer.optim.lr == 3e-4


def test_round_trip_through_json(tmp_path: Path) -> None:
    cfg = load_config(
        RLConfig,
        ["--model.name", "m", "--trainer.optim.betas", "[0.8, 0.95]", "--inference.urls", "http://a"],
    )
    dumped = write(tmp_path / "dump.json", json.dumps(cfg.model_dump(mode="json")))
    assert load_config(RLConfig, ["@", dumped]) == cfg


def test_help_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        load_config(RLConfig, ["--help"])
    assert exc.value.code == 0
    assert "--trainer.optim.lr" in capsys.readouterr().out


def test_reads_sys_argv_but_not_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["rl", "--model.name", "m"])
    monkeypatch.setenv("seed", "7")
    cfg = load_config(RLConfig)
    assert cfg.model.name == "m"
    assert cfg.seed == 0


@pytest.mark.parametrize(
    ("cls", "section", "required"),
    [(RLConfig, "trainer.parallel", []), (SFTConfig, "parallel", ["--data.path", "d.jsonl"])],
)
def test_fsdp_needs_ranks_to_shard_over(cls: type[RLConfig | SFTConfig], section: str, required: list[str]) -> None:
    args = ["--model.name", "m", *required, f"--{section}.fsdp"]
    with pytest.raises(ConfigError, match=rf"{section}: .*fsdp = true .*needs dp >= 2 \(dp = 1\)"):
        load_config(cls, args)
    cfg = load_config(cls, [*args, f"--{section}.dp", "2"])
    parallel = cfg.trainer.parallel if isinstance(cfg, RLConfig) else cfg.parallel
    assert parallel.fsdp and parallel.dp == 2


def test_a_trainer_started_without_its_ranks_says_how_to_start_them(monkeypatch: pytest.MonkeyPatch) -> None:
    from lorarl.config.trainer import ParallelConfig
    from lorarl.trainer.distributed import init_data_parallel

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(RuntimeError, match="parallel.dp = 2, but this process is one of 1 rank.*torchrun"):
        init_data_parallel(ParallelConfig(dp=2, fsdp=True))
    assert init_data_parallel(ParallelConfig()).world_size == 1


def sweep(*variants: dict, **top: object) -> RLConfig:
    return RLConfig.model_validate({"model": {"name": "m", "lora": {"rank": 8, "alpha": 64.0, "use_rslora": True}},
                                    "trainer": {"optim": {"lr": 1e-4, "weight_decay": 0.1}},
                                    "variants": list(variants), **top})  # fmt: skip


def test_a_variant_inherits_every_key_it_does_not_set() -> None:
    r1 = {"name": "r1", "model": {"lora": {"rank": 1}}, "trainer": {"optim": {"lr": 3e-4}}}
    cfg = sweep(r1, {"name": "math", "orchestrator": {"env": [{"id": "math"}]}, "trainer": {"loss": {"kl_coef": 0.1}}})
    (r1_name, r1), (math_name, math) = variant_configs(cfg)
    assert (r1_name, math_name) == ("r1", "math")
    assert (r1.lora.rank, r1.lora.alpha, r1.lora.use_rslora) == (1, 64.0, True)  # rank set, the rest inherited
    assert (r1.trainer.optim.lr, r1.trainer.optim.weight_decay) == (3e-4, 0.1)
    assert [e.id for e in r1.orchestrator.env] == ["reverse_text"] and r1.trainer.loss.kl_coef == 0
    assert [e.id for e in math.orchestrator.env] == ["math"] and math.trainer.loss.kl_coef == 0.1
    assert math.lora.rank == 8 and not r1.variants and not math.variants
    # A loss of another type keeps the keys every type shares, and none of the top-level type's own.
    switched = {"name": "is", "trainer": {"loss": {"type": "importance_sampling"}}}
    [(_, is_)] = variant_configs(sweep(switched, trainer={"loss": {"ratio_low": 0.1, "kl_coef": 0.2}}))
    assert (is_.trainer.loss.type, is_.trainer.loss.kl_coef) == ("importance_sampling", 0.2)
    assert served_lora_rank(cfg, experts=False) == 8 and adapter_slots(cfg) == 2 * (cfg.orchestrator.max_policy_lag + 2)


def test_without_variants_the_run_has_its_one_adapter() -> None:
    cfg = sweep()
    assert variant_configs(cfg) == [] and served_lora_rank(cfg, experts=False) == 8
    assert adapter_slots(cfg) == cfg.orchestrator.max_policy_lag + 2


@pytest.mark.parametrize(
    ("variants", "message"),
    [
        ([{"name": "a"}, {"name": "b", "model": {"lora": {"rank": 0}}}], r"variants\[1\]\.model\.lora\.rank: Input"),
        ([{"name": "a", "trainer": {"loss": {"nrom": "token"}}}], r"variants\[0\]\.trainer\.loss\.nrom: unknown key"),
        (
            [{"name": "a", "trainer": {"loss": {"type": "importance_sampling", "ratio_low": 0.1}}}],
            r"variants\[0\]\.trainer\.loss\.ratio_low: unknown key of type 'importance_sampling'",
        ),
        ([{"name": "a", "trainer": {"loss": {"norm": "constant"}}}], r"variants\[0\]\.trainer\.loss: norm ="),
        ([{"name": "a"}, {"name": "a"}], r"names must be unique, \['a'\]"),
        ([{"name": "-a"}], r"variants\.0\.name: String should match"),
        ([{"name": "a", "model": {"name": "other"}}], r"variants\.0\.model\.name: unknown key"),
    ],
)
def test_a_bad_variant_names_its_key(tmp_path: Path, variants: list[dict], message: str) -> None:
    path = tmp_path / "rl.json"
    path.write_text(json.dumps({"model": {"name": "m"}, "variants": variants}))
    with pytest.raises(ConfigError, match=message):
        load_config(RLConfig, ["@", str(path)])


def test_the_old_loss_keys_still_pick_a_type_with_one_warning_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from lorarl.config import algorithms

    monkeypatch.setattr(algorithms, "_warned", set())  # other tests of this process may have warned already
    path = tmp_path / "rl.toml"
    path.write_text('[model]\nname = "m"\n[trainer.loss]\nratio_mode = "cispo"\nratio_high = 4.0\n')
    loss = load_config(RLConfig, ["@", str(path)]).trainer.loss
    assert (loss.type, loss.ratio_high) == ("cispo", 4.0)
    loss = load_config(RLConfig, ["--model.name", "m", "--trainer.loss.ratio_mode", "mask"]).trainer.loss
    custom = load_config(RLConfig, ["--model.name", "m", "--trainer.loss.loss_fn", "a.b:c"]).trainer.loss
    assert loss.type == "mask" and (custom.type, custom.fn) == ("custom", "a.b:c")
    assert capsys.readouterr().err.splitlines() == [
        "warning: trainer.loss.ratio_mode is deprecated and will go in the next release: write "
        'trainer.loss.type = "cispo"',
        "warning: trainer.loss.loss_fn is deprecated and will go in the next release: write "
        'trainer.loss.type = "custom" and trainer.loss.fn',
    ]
    with pytest.raises(ConfigError, match="ratio_mode = 'mask' chooses type 'mask', but type = 'cispo'"):
        load_config(
            RLConfig, ["--model.name", "m", "--trainer.loss.ratio_mode", "mask", "--trainer.loss.type", "cispo"]
        )
    # The old keys never reach a written config.
    assert "ratio_mode" not in loss.model_dump() and "loss_fn" not in custom.model_dump()
