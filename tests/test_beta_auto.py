"""`mrtpo_beta: auto` (docs/METHOD.md, "beta from the step's own evidence"): the rule's math by
hand, the configuration, beta on a planted task (rises where the re-allocation points uphill,
stays at 0 where its weights are shuffled), the probe's agreement against gradients computed
apart, the settings it must work with, two processes, and the fixed-beta path untouched."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from beta_auto_toys import PLANTED, FirstChar, planted_replay
from trainer_toys import CPU_RUN, launch_two_processes, toy_dataset, toy_verifiers

import mrtpo.relevance
import mrtpo.trainer_beta_auto
from mrtpo import advantages
from mrtpo.commands.train import parse_args
from mrtpo.testing import tiny_model_and_tokenizer
from mrtpo.trainer import MRTPOConfig, MRTPOTrainer

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
PREFIX = mrtpo.trainer_beta_auto.METRIC_PREFIX

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def train(tmp_path, reward_funcs=None, trainer_class=MRTPOTrainer, num_prompts=8, **settings):
    model, tokenizer = tiny_model_and_tokenizer(seed=0)
    args = MRTPOConfig(output_dir=str(tmp_path / "run"), **{**CPU_RUN, **settings})
    trainer = trainer_class(
        model=model,
        reward_funcs=reward_funcs or toy_verifiers(),
        args=args,
        train_dataset=toy_dataset(num_prompts),
        processing_class=tokenizer,
    )
    trainer.train()
    return trainer


def step_logs(trainer) -> list[dict]:
    return [log for log in trainer.state.log_history if "mrtpo/beta" in log]


# ---------------------------------------------------------------------- the rule's math


def test_agreement_bound_by_hand():
    mean, se, lower = advantages.agreement_bound([0.1, 0.3])
    assert mean == pytest.approx(0.2)
    # sd = sqrt(0.02), se = sd / sqrt(2) = 0.1; t(1) = 6.314
    assert se == pytest.approx(0.1)
    assert lower == pytest.approx(0.2 - 6.314 * 0.1)
    mean, se, lower = advantages.agreement_bound([0.5])
    assert mean == 0.5 and math.isnan(se) and math.isnan(lower)
    assert all(math.isnan(x) for x in advantages.agreement_bound([]))
    assert advantages.t_quantile_95(4) == 2.132 and advantages.t_quantile_95(31) == 1.645
    with pytest.raises(ValueError, match="degrees_of_freedom"):
        advantages.t_quantile_95(0)


def test_gradient_agreement_is_the_pairs_cosine_and_nan_without_a_side():
    assert advantages.gradient_agreement(3.0, 4.0, 9.0) == pytest.approx(0.5)
    assert advantages.gradient_agreement(-6.0, 4.0, 9.0) == pytest.approx(-1.0)
    assert math.isnan(advantages.gradient_agreement(0.0, 0.0, 9.0))
    assert math.isnan(advantages.gradient_agreement(0.0, 4.0, 0.0))


def test_next_auto_beta_rises_only_on_a_positive_bound_and_stays_in_range():
    agree, split = [0.30, 0.32, 0.31], [0.3, -0.2, 0.25]
    assert advantages.next_auto_beta(0.0, agree, 1.0, 0.1) == 0.1
    assert advantages.next_auto_beta(0.95, agree, 1.0, 0.1) == 1.0  # capped at beta_max
    assert advantages.next_auto_beta(0.5, agree, 0.5, 0.1) == 0.5
    assert advantages.next_auto_beta(0.3, split, 1.0, 0.1) == 0.2  # bound below 0: falls
    assert advantages.next_auto_beta(0.05, split, 1.0, 0.1) == 0.0  # not below 0
    assert advantages.next_auto_beta(0.2, [0.9], 1.0, 0.1) == 0.1  # one probe: no bound
    beta = 0.0
    for _ in range(3):
        beta = advantages.next_auto_beta(beta, agree, 1.0, 0.1)
    for _ in range(3):
        beta = advantages.next_auto_beta(beta, split, 1.0, 0.1)
    assert beta == 0.0  # exactly back, no rounding residue
    with pytest.raises(ValueError, match="beta_step"):
        advantages.next_auto_beta(0.0, agree, 1.0, 0.0)


# ---------------------------------------------------------------------- configuration


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(mrtpo_beta="sometimes"), "mrtpo_beta must be a number in \\[0, 1\\] or 'auto'"),
        (dict(mrtpo_beta="auto", advantage_estimator="gdpo"), "advantage_estimator='gdpo'"),
        (dict(mrtpo_beta="auto", mrtpo_beta_max=1.5), "mrtpo_beta_max"),
        (dict(mrtpo_beta="auto", mrtpo_beta_step=0.0), "mrtpo_beta_step"),
        (dict(mrtpo_beta="auto", mrtpo_beta_probe_every=0), "mrtpo_beta_probe_every"),
        (dict(mrtpo_beta="auto", mrtpo_beta_window=1), "mrtpo_beta_window"),
    ],
)
def test_config_refuses_bad_auto_settings_naming_the_option(tmp_path, settings, message):
    with pytest.raises(ValueError, match=message):
        MRTPOConfig(output_dir=str(tmp_path), **CPU_RUN, **settings)


def test_the_command_line_reads_auto_and_numbers(tmp_path):
    config = parse_args(["--output_dir", str(tmp_path), "--mrtpo_beta", "auto"])[2]
    assert config.beta_is_auto and config.mrtpo_beta == "auto"
    config = parse_args(["--output_dir", str(tmp_path), "--mrtpo_beta", "0.25"])[2]
    assert config.mrtpo_beta == 0.25 and not config.beta_is_auto
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("mrtpo_beta: auto\nmrtpo_beta_max: 0.5\n")
    config = parse_args(["--config", str(recipe), "--output_dir", str(tmp_path)])[2]
    assert config.beta_is_auto and config.mrtpo_beta_max == 0.5
    assert MRTPOConfig(output_dir=str(tmp_path), mrtpo_beta="0.75", **CPU_RUN).mrtpo_beta == 0.75


def test_the_warm_up_caps_the_automatic_beta(tmp_path):
    model, tokenizer = tiny_model_and_tokenizer(seed=0)
    args = MRTPOConfig(
        output_dir=str(tmp_path), mrtpo_beta="auto", mrtpo_beta_max=0.8, **CPU_RUN
    )  # mrtpo_warmup_steps: 10, the default
    trainer = MRTPOTrainer(
        model=model,
        reward_funcs=toy_verifiers(),
        args=args,
        train_dataset=toy_dataset(),
        processing_class=tokenizer,
    )
    trainer._auto_beta_value = 0.7
    assert trainer._auto_beta_at(0) == 0.0
    assert trainer._auto_beta_at(5) == pytest.approx(0.8 * 0.5)  # smoothstep(0.5) = 0.5
    assert trainer._auto_beta_at(10) == 0.7  # past the ramp: the probes' beta


# ---------------------------------------------------------------------- beta on a planted task


def test_beta_rises_where_the_reallocation_points_uphill(tmp_path, monkeypatch):
    monkeypatch.setattr(mrtpo.relevance, "replay_distances", planted_replay)
    trainer = train(tmp_path, [FirstChar()], num_prompts=16, max_steps=8, **PLANTED)
    logs = step_logs(trainer)
    betas = [log["mrtpo/beta"] for log in logs]
    assert betas[0] == 0.0  # GDPO's step first
    assert betas == sorted(betas) and betas[-1] >= 0.5, betas
    # Each step trains at the beta the previous step's probe left (no warm-up here).
    for before, after in zip(logs, logs[1:], strict=False):
        assert after["mrtpo/beta"] == before[PREFIX + "next_beta"]
    last = logs[-1]
    assert last[PREFIX + "agreement_lower"] > 0
    assert 0 < last[PREFIX + "agreement"] <= 1 and last[PREFIX + "agreement_se"] > 0


def test_beta_stays_at_zero_where_the_weights_are_shuffled(tmp_path, monkeypatch):
    monkeypatch.setattr(mrtpo.relevance, "replay_distances", planted_replay)
    trainer = train(
        tmp_path,
        [FirstChar()],
        num_prompts=16,
        max_steps=8,
        shuffle_token_weights=True,
        **PLANTED,
    )
    logs = step_logs(trainer)
    assert max(log["mrtpo/beta"] for log in logs) <= 0.25  # at most one move, and back
    assert logs[-1]["mrtpo/beta"] == 0.0
    assert logs[-1][PREFIX + "agreement_lower"] < 0
    assert logs[-1][PREFIX + "probes"] >= 4  # evidence was there, and it said no


# ---------------------------------------------------------------------- the probe itself


class RecordingProbes(MRTPOTrainer):
    """Keeps each probed micro-batch with the policy's parameters at the probe."""

    def __init__(self, *args, **kwargs):
        self.probes: list[tuple] = []
        super().__init__(*args, **kwargs)

    def _probe_gradients(self, inputs, uniform, reallocation):
        state = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        self.probes.append((dict(inputs), uniform.clone(), reallocation.clone(), state))
        super()._probe_gradients(inputs, uniform, reallocation)


def one_probed_step(tmp_path) -> RecordingProbes:
    """One optimizer step of two micro-batches, both probed (their inputs kept)."""
    return train(
        tmp_path,
        trainer_class=RecordingProbes,
        per_device_train_batch_size=8,
        num_generations=4,
        gradient_accumulation_steps=2,
        max_completion_length=8,
        max_steps=1,
        mrtpo_beta="auto",
        mrtpo_beta_probe_every=1,
    )


def _policy_gradient(trainer, model, inputs, token_advantages) -> torch.Tensor:
    """-grad of sum(A_t logp_t) / trained tokens, flattened, from a plain per-row forward of
    the model (logits at the sampling temperature, as TRL's loss takes them)."""
    input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    width = inputs["completion_ids"].size(1)
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
    logits = logits[:, -width - 1 : -1].float() / trainer.temperature
    logps = logits.log_softmax(-1).gather(-1, inputs["completion_ids"].unsqueeze(-1)).squeeze(-1)
    mask = inputs["completion_mask"].float()
    loss = -(token_advantages * logps * mask).sum() / mask.sum()
    params = [p for p in model.parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    return torch.cat(
        [
            (torch.zeros_like(p) if g is None else g).flatten()
            for p, g in zip(params, grads, strict=True)
        ]
    )


def test_the_agreement_equals_gradients_computed_apart(tmp_path):
    """One step of two micro-batches: the first has no reference; the second's g_R is compared
    with the first's g_U. The logged agreement is their cosine, computed here from whole
    gradient vectors (a plain per-row forward, not the shared-prompt one the probe uses)."""
    trainer = one_probed_step(tmp_path)
    assert len(trainer.probes) == 2
    (first, u_first, _, state), (second, _, r_second, state_second) = trainer.probes
    assert all(torch.equal(state[k], state_second[k]) for k in state)  # one step's parameters
    model, _ = tiny_model_and_tokenizer(seed=0)
    model.load_state_dict(state)
    reference = _policy_gradient(trainer, model, first, u_first)
    reallocation = _policy_gradient(trainer, model, second, r_second)
    expected = torch.dot(reallocation, reference) / (reallocation.norm() * reference.norm())
    logged = step_logs(trainer)[0][PREFIX + "probe_agreement"]
    assert logged == pytest.approx(expected.item(), rel=1e-4, abs=1e-6)
    # R_t is the re-allocation: zero mean over each response's trained tokens.
    mask = second["completion_mask"].float()
    assert torch.allclose((r_second * mask).sum(1), torch.zeros(len(mask)), atol=1e-5)


@pytest.mark.parametrize("position", [0, 1], ids=["first-micro-batch", "later-micro-batch"])
def test_a_micro_batch_without_advantages_is_probed_without_a_forward(
    tmp_path, monkeypatch, position
):
    """Every advantage 0 (all of a micro-batch's groups tied): the probe's sums and reference
    change exactly as the forward and two backward passes change them, and none of those runs."""
    trainer = one_probed_step(tmp_path)
    inputs, uniform, _, _ = trainer.probes[1]
    zeros = torch.zeros_like(uniform)
    trainer._position_in_step = (trainer.state.global_step, position)
    saved = {i: ref.clone() for i, ref in trainer._auto_reference.items()}
    assert saved and all(ref.abs().sum() > 0 for ref in saved.values())

    def probe(shortcut: bool):
        trainer._auto_reference = {i: ref.clone() for i, ref in saved.items()}
        trainer._auto_sums = torch.tensor([0.5, 2.0, 3.0], dtype=torch.float64)
        if not shortcut:  # the forward and both backward passes, on zero advantages
            monkeypatch.setattr(mrtpo.trainer_beta_auto, "nothing_to_probe", lambda u, r: False)
        forwards = []
        original = trainer._get_per_token_logps_and_entropies
        monkeypatch.setattr(
            trainer,
            "_get_per_token_logps_and_entropies",
            lambda *a, **k: forwards.append(1) or original(*a, **k),
        )
        trainer._probe_gradients(inputs, zeros, zeros)
        monkeypatch.undo()
        kept = {i: ref for i, ref in trainer._auto_reference.items() if ref.abs().sum() > 0}
        return trainer._auto_sums.clone(), kept, len(forwards)

    fast_sums, fast_reference, fast_forwards = probe(shortcut=True)
    slow_sums, slow_reference, slow_forwards = probe(shortcut=False)
    assert (fast_forwards, slow_forwards) == (0, 1)
    reference_sq = sum(torch.dot(r.flatten(), r.flatten()).double() for r in saved.values())
    assert fast_sums[:2].tolist() == slow_sums[:2].tolist() == [0.5, 2.0]  # g_R = 0
    assert fast_sums[2].item() == pytest.approx(3.0 + reference_sq.item(), rel=1e-12)
    assert slow_sums[2].item() == pytest.approx(fast_sums[2].item(), rel=1e-9)
    # At a step's first micro-batch its g_U (all zeros) replaces the reference; later, the
    # reference is kept as it was (zeros added).
    expected = {} if position == 0 else saved
    for reference in (fast_reference, slow_reference):
        assert reference.keys() == expected.keys()
        assert all(torch.equal(reference[i], expected[i]) for i in expected)


@pytest.mark.parametrize(
    "settings",
    [
        dict(share_prompt=False, steps_per_generation=4),  # a batch serving two steps
        dict(reward_weighting="saw", num_iterations=2),
        dict(replay_information="placebo", per_device_train_batch_size=8),
        dict(shuffle_token_weights=True),
    ],
    ids=["no-sharing-steps-per-generation", "saw-iterations", "placebo", "shuffled"],
)
def test_auto_runs_with_each_setting_and_logs_every_step(tmp_path, settings):
    base = dict(
        per_device_train_batch_size=4,
        num_generations=4,
        gradient_accumulation_steps=2,
        max_completion_length=6,
        max_steps=3,
        mrtpo_beta="auto",
        mrtpo_beta_probe_every=2,
    )
    trainer = train(tmp_path, **{**base, **settings})
    logs = step_logs(trainer)
    assert len(logs) == 3
    for log in logs:  # every step: beta, the estimate, its uncertainty, the evidence's size
        assert {PREFIX + "agreement", PREFIX + "agreement_se", PREFIX + "probes"} <= set(log)
    # Steps 0 and 2 probed (every 2): the first agreement has its pairs inside step 0.
    assert logs[1][PREFIX + "probes"] == 1.0 and logs[2][PREFIX + "probes"] == 2.0
    assert -1 <= logs[2][PREFIX + "probe_agreement"] <= 1
    assert PREFIX + "probe_agreement" not in logs[1]  # step 1 was not probed


# ---------------------------------------------------------------------- fixed beta


def test_fixed_beta_never_enters_the_auto_code(tmp_path, monkeypatch):
    """A fixed beta trains as before the option existed: the auto methods, made to raise here,
    are never called (the parameters were also checked bit for bit against the commit before
    the option, docs/METHOD.md)."""

    def refuse(*args, **kwargs):
        raise AssertionError("the fixed-beta path entered mrtpo_beta='auto''s code")

    for name in ("_init_auto_beta", "_auto_beta_at", "_keep_probe_batch", "_after_micro_batch"):
        monkeypatch.setattr(mrtpo.trainer_beta_auto.AutoBetaMixin, name, refuse)
    trainer = train(
        tmp_path,
        per_device_train_batch_size=4,
        num_generations=4,
        gradient_accumulation_steps=2,
        steps_per_generation=4,
        max_completion_length=6,
        max_steps=2,
        mrtpo_beta=0.5,
        mrtpo_warmup_steps=0,
    )
    logs = step_logs(trainer)
    assert [log["mrtpo/beta"] for log in logs] == [0.5, 0.5]
    assert not any(key.startswith(PREFIX) for log in logs for key in log)


# ---------------------------------------------------------------------- two processes


@pytest.mark.slow
def test_two_processes_have_the_same_beta(tmp_path):
    result = launch_two_processes("beta_auto_toys.py", str(tmp_path), timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1)]
    keys = ["mrtpo/beta", *(PREFIX + name for name in ("agreement", "next_beta", "probes"))]
    per_rank = [
        [[log.get(key) for key in keys] for log in rank["log_history"] if "mrtpo/beta" in log]
        for rank in ranks
    ]
    assert per_rank[0] == per_rank[1]
    betas = [row[0] for row in per_rank[0]]
    assert len(betas) == 6 and betas[-1] > 0, betas  # beta moved, the same on both


def test_the_mixin_declares_what_it_needs_from_the_trainer(tmp_path):
    """As the other mixins (tests/test_trainer.py): what `AutoBetaMixin` uses on `self` is its
    own or declared, every declaration is used, and a trainer under `auto` has each."""
    from test_trainer import attributes_read_on_self

    mixin = mrtpo.trainer_beta_auto.AutoBetaMixin
    own = {name for name in vars(mixin) if not name.startswith("__")}
    declared = set(vars(mixin).get("__annotations__", {})) - own
    used = attributes_read_on_self(mixin)
    assert used - own - declared == set()
    assert declared - used == set()
    model, tokenizer = tiny_model_and_tokenizer(seed=0)
    args = MRTPOConfig(output_dir=str(tmp_path), mrtpo_beta="auto", **CPU_RUN)
    trainer = MRTPOTrainer(
        model=model,
        reward_funcs=toy_verifiers(),
        args=args,
        train_dataset=toy_dataset(),
        processing_class=tokenizer,
    )
    missing = {"current_gradient_accumulation_steps"}  # set by `Trainer.train`'s loop
    assert sorted(name for name in declared - missing if not hasattr(trainer, name)) == []


def test_a_resumed_run_goes_on_from_the_saved_beta(tmp_path, monkeypatch):
    """The automatic beta and its window are saved beside each checkpoint: a run resumed at step
    4 trains step 5 at the beta the uninterrupted run trained it at (not 0)."""
    monkeypatch.setattr(mrtpo.relevance, "replay_distances", planted_replay)
    whole = train(
        tmp_path / "whole",
        [FirstChar()],
        num_prompts=16,
        max_steps=5,
        save_strategy="steps",
        save_steps=2,
        **PLANTED,
    )
    whole_logs = step_logs(whole)
    checkpoint = tmp_path / "whole" / "run" / "checkpoint-4"
    saved = json.loads((checkpoint / mrtpo.trainer_beta_auto.STATE_FILE).read_text())
    assert saved["beta"] == whole_logs[3][PREFIX + "next_beta"] > 0
    probes = [log[PREFIX + "probe_agreement"] for log in whole_logs[:4]]
    assert probes[0] is None  # the first probe has no reference yet: no agreement, no move
    assert saved["agreements"] == pytest.approx(probes[1:])
    model, tokenizer = tiny_model_and_tokenizer(seed=0)
    args = MRTPOConfig(
        output_dir=str(tmp_path / "whole" / "run"),
        **{**CPU_RUN, "max_steps": 5, "save_strategy": "steps", "save_steps": 2, **PLANTED},
    )
    resumed = MRTPOTrainer(
        model=model,
        reward_funcs=[FirstChar()],
        args=args,
        train_dataset=toy_dataset(16),
        processing_class=tokenizer,
    )
    resumed.train(resume_from_checkpoint=str(checkpoint))
    fifth = [
        log for log in resumed.state.log_history if log.get("step") == 5 and "mrtpo/beta" in log
    ]
    assert fifth[-1]["mrtpo/beta"] == whole_logs[4]["mrtpo/beta"] == saved["beta"]
