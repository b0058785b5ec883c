"""`[orchestrator]`: how the orchestrator process (`lorarl-orchestrator`) samples rollouts through vLLM,
scores them in its environments, turns rewards into advantages (config/algorithms.py) and assembles
each step's batch; its evals."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator, model_validator

from lorarl.config.algorithms import AdvantageConfig, GRPOAdvantage, upgrade_advantage
from lorarl.config.common import MIN_WAIT, Section, Seed

# Chat template variables that templates test as switches (`{% if enable_thinking %}`): any string is true
# there, "no" and "off" included.
_TEMPLATE_SWITCHES = ("enable_thinking", "add_generation_prompt", "continue_final_message", "thinking")


class SamplingConfig(Section):
    temperature: float = Field(1.0, gt=0)
    """Sampling temperature of rollouts; the trainer divides its logits by the same value (carried in each
    rollout), so that its logprobs match vLLM's."""
    top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus sampling: sample from the most likely tokens whose probabilities add up to top_p; 1: all
    tokens. vLLM renormalizes over the kept tokens and returns the logprobs of that distribution (its
    `--logprobs-mode processed_logprobs`, which lorarl starts it with); the trainer keeps the same tokens
    of its own distribution and renormalizes alike, so that the importance ratio is of the distribution
    sampled from (docs/off_policy.md)."""
    top_k: int | None = Field(None, ge=1)
    """Sample from the top_k most likely tokens only (ties at the k-th kept), before top_p; the trainer
    keeps the same tokens, as for top_p. None: all tokens."""
    max_tokens: int = Field(128, ge=1)
    """Most tokens generated per model turn (fewer where the episode would outgrow seq_len); a turn that
    hits it counts as truncated."""


class OverlongConfig(Section):
    mask_truncated: bool = False
    """Give every truncated episode (its last model turn hit max_tokens) advantage 0, so it trains neither
    way (DAPO's overlong filtering); the group's other advantages are computed as usual, its reward
    included. Counted in `overlong/masked`. False: truncated episodes train like the others."""
    buffer: int = Field(0, ge=0)
    """Soft overlong penalty (DAPO's overlong reward shaping): an episode whose longest model turn runs
    into the last `buffer` tokens before sampling.max_tokens loses penalty * (tokens into the buffer) /
    buffer of reward, the full penalty when truncated. The estimator sees the shaped reward; `reward`
    metrics stay the environment's, and the penalty is logged as `env/<env>/overlong_penalty`. 0: no
    penalty."""
    penalty: float = Field(1.0, ge=0)
    """The reward an episode loses at max_tokens (with buffer > 0)."""


class DifficultyFilterConfig(Section):
    window: int = Field(2, ge=1)
    """Attempts remembered per example (an attempt: one group of it; its pass rate: the group's mean
    reward, the fraction solved when rewards are 0 or 1). An example is skipped once each of its last
    `window` attempts was at or above max_pass, or each at or below min_pass."""
    max_pass: float | None = 1.0
    """Too easy: an example whose last `window` attempts all had a pass rate >= this is no longer drawn.
    None: never skipped as too easy."""
    min_pass: float | None = 0.0
    """Too hard: an example whose last `window` attempts all had a pass rate <= this is no longer drawn.
    None: never skipped as too hard."""
    capacity: int = Field(100_000, ge=1)
    """Examples remembered at most; the one attempted longest ago is forgotten first (and may be drawn again)."""

    @model_validator(mode="after")
    def _pass_range(self) -> DifficultyFilterConfig:
        if self.min_pass is not None and self.max_pass is not None and self.min_pass >= self.max_pass:
            raise ValueError(f"min_pass ({self.min_pass}) must be below max_pass ({self.max_pass})")
        return self


class EnvConfig(Section):
    id: str = "reverse_text"
    """A built-in environment ("reverse_text", "alphabet_sort", "unscramble", "math", "search", "calculator"),
    a reasoning-gym task ("reasoning_gym:<task>", or "reasoning_gym" with args.tasks), a verifiers taskset
    ("verifiers:<taskset package or module>", args: its config, and max_turns) or "package.module:factory": an
    Environment subclass, a function annotated to return one, or one marked @lorarl.plugin("environment")."""
    weight: float = Field(1.0, gt=0)
    """Relative probability that a group plays this environment, against the other environments' weights."""
    args: dict[str, Any] = {}
    """Keyword arguments of the environment's constructor or factory, checked against its signature and
    annotations and converted to the annotated types; {}: its defaults."""
    episode_timeout: float | None = Field(None, gt=0)
    """Wall-clock seconds an episode may run from its start; once past, it ends after its last finished model
    turn (a slow tool or environment reply is cut off) and is scored as it stands; counted in `timed_out_frac`.
    None: the environment's own limit (none for the built-ins)."""


class EvalConfig(Section):
    interval: int = Field(10, ge=1)
    """Evaluate policy versions 0, interval, 2 * interval, ... and the last, each in the background
    while training goes on (a run ends once its last eval is done)."""
    num_examples: int = Field(16, ge=1)
    """Held-out examples per environment, the same at every eval."""
    rollouts_per_example: int = Field(4, ge=1)
    """k of avg@k (the mean reward) and pass@k (the mean over examples of the best of k rewards)."""
    seed: Seed = 10_000
    """Draws the held-out examples (0 to 2**32 - 1); keep it apart from orchestrator.seed, or the eval
    examples are the first training examples."""


class OrchestratorConfig(Section):
    batch_size: int = Field(64, ge=1)
    """Rollouts per trainer step: batch_size / rollouts_per_example groups."""
    rollouts_per_example: int = Field(8, ge=1)
    """Rollouts of one example, the group whose mean reward is each one's baseline; divides batch_size."""
    max_async_level: int = Field(1, ge=0)
    """How far sampling runs ahead of training: a group drawn for step N is sampled with a policy version
    >= N - 1 - max_async_level. 0: fully on-policy, each batch waits for the trainer; 1: the next batch
    is sampled while the trainer trains."""
    max_off_policy_steps: int | None = Field(None, ge=0)
    """Continuous batching: a batch takes the first groups to finish, oldest policy first, so a slow group
    rolls over into a later batch, and one that would lag more than this many versions is dropped
    (counted in dropped/groups) and replaced; at least max_async_level. None: each batch holds exactly
    the groups drawn for its step and waits for the slowest. vLLM's `--max-loras` follows the larger of
    the two."""
    sampling: SamplingConfig = SamplingConfig()
    """How vLLM samples rollouts (evals too)."""
    advantage: AdvantageConfig = GRPOAdvantage()
    """How rewards become advantages against the other rollouts of the same example: the estimator by
    type ("grpo", "dr_grpo", "rloo", "custom") with its own keys (config/algorithms.py)."""
    skip_zero_advantage: bool = True
    """Leave groups whose advantages are all 0 (every rollout rewarded the same) out of the batch the trainer
    gets: they carry no policy gradient, yet would cost a forward and backward pass. Counted in
    `groups/zero_advantage` and `rollouts/skipped`. The loss is then normalized over the rollouts trained
    on (with loss.norm = "constant" the gradient is the same; with kl_coef > 0 the skipped rollouts'
    KL term is left out too). A step whose groups all have zero advantage gets an empty batch, and the
    trainer changes no weight at that step. False: every group trains."""
    fill_informative: bool = False
    """Dynamic sampling (DAPO): when a step's groups have finished and some had zero advantage, draw that many
    more groups for the step (from a second example stream, so the first stays as without it), and again,
    until batch_size rollouts with non-zero advantage are in, or fill_max_draw_factor is reached; then the
    batch goes out with what it has (`fill/bound_hit`). Extra groups play the newest policy, are counted in
    `groups/extra_drawn`, and are drawn for the step being assembled only, so which examples a step trains
    on does not depend on timing. Needs skip_zero_advantage. False: a step draws its
    batch_size / rollouts_per_example groups only."""
    fill_max_draw_factor: float = Field(3.0, ge=1)
    """With fill_informative: a step draws at most this many times its batch_size / rollouts_per_example
    groups in all, extra groups included (DAPO's max_num_gen_batches), so that a task the policy always
    solves or always fails cannot hold the run up."""
    difficulty_filter: DifficultyFilterConfig | None = None
    """Online difficulty filtering: remember each example's recent pass rates (examples are told apart by
    their environment and JSON) and stop drawing those solved, or failed, in every recent attempt; counted
    per step in `difficulty/skipped_easy` and `difficulty/skipped_hard`. A group drawn for step N sees the
    attempts of batches up to N - 1 - max_async_level, all of which are written before it is drawn, so the
    examples do not depend on timing. After 1000 skips in a row the next example is taken anyway
    (`difficulty/forced`). Absent: every example drawn is played."""
    overlong: OverlongConfig = OverlongConfig()
    """Episodes that run into max_tokens: masked from the loss, or their reward lowered near the limit."""
    env: list[EnvConfig] = [EnvConfig()]
    """The training environments, one [[orchestrator.env]] table each with keys id, weight and args (on the
    command line a JSON list of such objects); absent: one "reverse_text"."""
    seed: Seed = 0
    """Draws each group's environment and example (0 to 2**32 - 1); the same seed gives the same example
    stream."""
    chat_template_kwargs: dict[str, Any] = {}
    """Extra variables for the model's chat template when it renders episodes, e.g. { enable_thinking = false }
    for Qwen3 (which then opens each answer with an empty <think> block that later turns do not repeat, so
    multi-turn episodes split into a sample per turn: `split_frac`)."""
    policy_timeout: float = Field(1800.0, ge=MIN_WAIT)
    """Seconds the orchestrator waits for the trainer's next adapter before giving up (the trainer may
    have died)."""
    reward_timeout: float = Field(600.0, gt=0)
    """Seconds one reward function may take to score one episode; past it the episode scores 0 for that
    function, counted in `reward_errors` like a reward that raises, and the run goes on (the call is
    abandoned: it runs on in a thread of its own until the orchestrator exits, which does not wait for
    it). The default leaves room for a judge's three attempts of 120 s each."""
    num_samples_to_log: int = Field(4, ge=0)
    """Decoded rollouts per step, with their rewards, written to samples/step_N.jsonl; 0: none."""
    eval: EvalConfig | None = None
    """Evals on held-out examples of every environment, logged as `eval/<env>/avg@k` and `pass@k` with the
    policy version as step; absent: no evals."""
    delete_old_broadcasts: bool = True
    """Delete broadcasts/step_N once no worker serves version N any more (the final one stays; checkpoints
    keep their own copy); false: keep every version."""

    @field_validator("chat_template_kwargs", mode="after")
    @classmethod
    def _no_quoted_booleans(cls, value: dict[str, Any]) -> dict[str, Any]:
        # A template tests `if enable_thinking`: the string "false" is true there, so thinking stays on.
        for key, item in value.items():
            quoted = isinstance(item, str) and item.strip().lower() in ("true", "false")
            if isinstance(item, str) and item and key in _TEMPLATE_SWITCHES and not quoted:  # "no", "off": true too
                raise ValueError(
                    f"{key} = {item!r} is a string, which a chat template takes as true: {key} is a switch, write "
                    f"{key} = true or {key} = false (a TOML boolean, no quotes)"
                )
            if quoted:
                raise ValueError(
                    f"{key} = {item!r} is a string, which a chat template takes as true: write {key} = "
                    f"{item.strip().lower()} (a TOML boolean, no quotes)"
                )
        return value

    @model_validator(mode="after")
    def _groups_fill_batch(self) -> OrchestratorConfig:
        if self.batch_size % self.rollouts_per_example:
            raise ValueError(
                f"batch_size ({self.batch_size}) must be a multiple of rollouts_per_example "
                f"({self.rollouts_per_example})"
            )
        return self

    @model_validator(mode="after")
    def _groups_of_several(self) -> OrchestratorConfig:
        # A custom estimator (advantage.type "custom") may not need a group: rl warns about it instead (preflight).
        if self.rollouts_per_example == 1 and self.advantage.type != "custom":
            raise ValueError(
                f'rollouts_per_example = 1 with advantage.type = "{self.advantage.type}": each '
                "rollout is its own group's baseline, so every advantage is 0 and nothing trains; use 2 or more"
            )
        return self

    @model_validator(mode="after")
    def _fill_needs_skipping(self) -> OrchestratorConfig:
        if self.fill_informative and not self.skip_zero_advantage:
            raise ValueError(
                "fill_informative fills the batch in place of the zero-advantage groups that "
                "skip_zero_advantage leaves out: set skip_zero_advantage = true too"
            )
        return self

    @model_validator(mode="after")
    def _overlong_buffer_fits(self) -> OrchestratorConfig:
        if self.overlong.buffer > self.sampling.max_tokens:
            raise ValueError(
                f"overlong.buffer ({self.overlong.buffer}) is longer than sampling.max_tokens "
                f"({self.sampling.max_tokens})"
            )
        return self

    @model_validator(mode="after")
    def _off_policy_bound_holds_async_groups(self) -> OrchestratorConfig:
        if self.max_off_policy_steps is not None and self.max_off_policy_steps < self.max_async_level:
            raise ValueError(
                f"max_off_policy_steps ({self.max_off_policy_steps}) < max_async_level ({self.max_async_level}) "
                "would drop the groups sampled ahead on purpose as soon as they finish: lower max_async_level "
                "instead, or raise max_off_policy_steps"
            )
        return self

    @property
    def max_policy_lag(self) -> int:
        """How many versions older than the trainer's a rollout in a batch can be."""
        return self.max_async_level if self.max_off_policy_steps is None else self.max_off_policy_steps

    @field_validator("advantage", mode="before")
    @classmethod
    def _advantage_type(cls, data: Any) -> Any:
        return upgrade_advantage(data)
