"""`mrtpo_beta: auto` (docs/METHOD.md, "beta from the step's own evidence"): the rule's math by
hand, the configuration, beta on a planted task (rises where the re-allocation turns the step
uphill, stays at 0 where its weights are shuffled), the probe's agreement against gradients
computed apart, its shortcut, the settings it must work with, two processes, resumption, and
the fixed-beta path untouched."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from beta_auto_toys import PLANTED, FirstChar, planted_replay
from trainer_toys import CPU_RUN, launch_two_processes, toy_dataset, toy_verifiers

import mrtpo.relevance
import mrtpo.trainer
import mrtpo.trainer_beta_auto
from mrtpo import auto_beta
from mrtpo.commands.train import parse_args
from mrtpo.testing import tiny_model, tiny_model_and_tokenizer, tiny_tokenizer
from mrtpo.trainer import MRTPOConfig, MRTPOTrainer
from mrtpo.trainer_beta_auto import PASSES, SUMS, StoredRows, stored_whole

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
PREFIX = mrtpo.trainer_beta_auto.METRIC_PREFIX

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def trainer_for(
    tmp_path, reward_funcs=None, trainer_class=MRTPOTrainer, num_prompts=8, tied=True, **settings
):
    tokenizer = tiny_tokenizer()
    model = tiny_model(len(tokenizer), seed=0, tied=tied)
    args = MRTPOConfig(output_dir=str(tmp_path / "run"), **{**CPU_RUN, **settings})
    return trainer_class(
        model=model,
        reward_funcs=reward_funcs or toy_verifiers(),
        args=args,
        train_dataset=toy_dataset(num_prompts),
        processing_class=tokenizer,
    )


def train(tmp_path, reward_funcs=None, trainer_class=MRTPOTrainer, num_prompts=8, **settings):
    trainer = trainer_for(tmp_path, reward_funcs, trainer_class, num_prompts, **settings)
    trainer.train()
    return trainer


def step_logs(trainer) -> list[dict]:
    return [log for log in trainer.state.log_history if "mrtpo/beta" in log]


# ---------------------------------------------------------------------- the rule's math


def test_agreement_bound_by_hand():
    mean, se, lower = auto_beta.agreement_bound([0.1, 0.3])
    assert mean == pytest.approx(0.2)
    # sd = sqrt(0.02), se = sd / sqrt(2) = 0.1; t(1) = 6.314
    assert se == pytest.approx(0.1)
    assert lower == pytest.approx(0.2 - 6.314 * 0.1)
    mean, se, lower = auto_beta.agreement_bound([0.5])
    assert mean == 0.5 and math.isnan(se) and math.isnan(lower)
    assert all(math.isnan(x) for x in auto_beta.agreement_bound([]))
    assert auto_beta.t_quantile_95(4) == 2.132 and auto_beta.t_quantile_95(31) == 1.645
    with pytest.raises(ValueError, match="degrees_of_freedom"):
        auto_beta.t_quantile_95(0)


def test_gradient_cosine_is_the_pairs_cosine_and_nan_without_a_side():
    assert auto_beta.gradient_cosine(3.0, 4.0, 9.0) == pytest.approx(0.5)
    assert auto_beta.gradient_cosine(-6.0, 4.0, 9.0) == pytest.approx(-1.0)
    assert math.isnan(auto_beta.gradient_cosine(0.0, 0.0, 9.0))
    assert math.isnan(auto_beta.gradient_cosine(0.0, 4.0, 0.0))


def _sums(uniform, reallocation, reference) -> dict[str, float]:
    """`gradient_agreement`'s sums of three vectors g_U, g_R, G."""
    u, r, g = (torch.as_tensor(v, dtype=torch.float64) for v in (uniform, reallocation, reference))
    return dict(
        reallocation_dot=float(r @ g),
        uniform_dot=float(u @ g),
        reallocation_sq=float(r @ r),
        uniform_sq=float(u @ u),
        cross=float(u @ r),
        reference_sq=float(g @ g),
    )


def _step_cosine(uniform, reallocation, reference, beta: float) -> float:
    u, r, g = (torch.as_tensor(v, dtype=torch.float64) for v in (uniform, reallocation, reference))
    return float(torch.nn.functional.cosine_similarity(u + beta * r, g, dim=0))


def test_the_agreement_is_the_sign_of_the_steps_cosine_slope_not_the_cosine():
    """g_U = (1, 0, 1), g_R = (0.1, 0, 1), G = (1, 0, 0): g_R points a little uphill
    (cos(g_R, G) = 0.0995 > 0), yet adding it turns the step away from G: at beta 0,
    cos(g_R, G) - cos(g, G) cos(g, g_R) = 0.0995 - 0.7071 * 0.7036 < 0. The old rule (the cosine)
    would rise on such probes; this one falls."""
    uniform, reallocation, reference = (1.0, 0.0, 1.0), (0.1, 0.0, 1.0), (1.0, 0.0, 0.0)
    sums = _sums(uniform, reallocation, reference)
    # By hand: A = 0.1, B0 = 1, RR = 1.01, UU = 2, UR = 1.1, GG = 1 (in `SUMS`' order).
    assert sums == pytest.approx(dict(zip(SUMS, (0.1, 1.0, 1.01, 2.0, 1.1, 1.0), strict=True)))
    cosine = auto_beta.gradient_cosine(0.1, 1.01, 1.0)
    assert cosine == pytest.approx(0.1 / math.sqrt(1.01)) and cosine > 0
    at_zero = auto_beta.gradient_agreement(**sums, beta=0.0)
    assert at_zero == pytest.approx((0.1 * 2 - 1 * 1.1) / (2 * math.sqrt(1.01)))  # -0.4478
    # beta 0.5: B = 1.05, N2 = 2 + 1.1 + 0.2525 = 3.3525, X = 1.1 + 0.505 = 1.605
    at_half = auto_beta.gradient_agreement(**sums, beta=0.5)
    assert at_half == pytest.approx((0.1 * 3.3525 - 1.05 * 1.605) / (3.3525 * math.sqrt(1.01)))
    for beta, agreement in ((0.0, at_zero), (0.5, at_half)):
        # The sign (and size, times |g_R| / |g|) of the cosine's derivative in beta, measured.
        h = 1e-6
        slope = (
            _step_cosine(uniform, reallocation, reference, beta + h)
            - _step_cosine(uniform, reallocation, reference, beta - h)
        ) / (2 * h)
        norm = math.sqrt(sums["uniform_sq"] + 2 * beta * sums["cross"] + beta**2 * 1.01)
        assert agreement < 0 and slope == pytest.approx(agreement * math.sqrt(1.01) / norm)
    # Probes like it: the cosines' bound is above 0, the agreements' below: beta falls.
    probes = [((1.0, 0.0, 1.0), (0.1 + d, 0.0, 1.0), (1.0, d, 0.0)) for d in (0.0, 0.02, 0.05)]
    agreements = [auto_beta.gradient_agreement(**_sums(*p), beta=0.0) for p in probes]
    cosines = [
        auto_beta.gradient_cosine(s["reallocation_dot"], s["reallocation_sq"], s["reference_sq"])
        for s in (_sums(*p) for p in probes)
    ]
    assert auto_beta.next_auto_beta(0.3, cosines, 1.0, 0.1) == 0.4  # the old rule: up
    assert auto_beta.next_auto_beta(0.3, agreements, 1.0, 0.1) == 0.2  # this one: down


def test_the_agreement_is_the_orthogonal_parts_cosine_and_nan_without_evidence():
    """On random vectors: (A N2 - B X) / (N2 sqrt(RR GG)) = <g_R', G'> / (|g_R| |G|), the parts
    orthogonal to g = g_U + beta g_R, so within [-1, 1]; 0 where g_R is along g."""
    generator = torch.Generator().manual_seed(0)
    for beta in (0.0, 0.3, 1.0):
        u, r, g = torch.randn(3, 5, generator=generator, dtype=torch.float64)
        step = u + beta * r
        r_off = r - (r @ step) / (step @ step) * step
        g_off = g - (g @ step) / (step @ step) * step
        expected = float(r_off @ g_off / (r.norm() * g.norm()))
        assert auto_beta.gradient_agreement(**_sums(u, r, g), beta=beta) == pytest.approx(
            expected, rel=1e-10
        )
        assert -1 <= expected <= 1
    # g_R along g_U (only the step's length changes): 0, whatever cos(g_R, G).
    assert auto_beta.gradient_agreement(
        **_sums((1.0, 1.0), (2.0, 2.0), (1.0, 0.0)), beta=0.5
    ) == pytest.approx(0.0, abs=1e-12)
    nothing = _sums((1.0, 0.0), (0.0, 0.0), (1.0, 0.0))  # RR = 0: nothing re-allocated
    no_reference = _sums((1.0, 0.0), (0.0, 1.0), (0.0, 0.0))  # GG = 0
    no_step = _sums((0.0, 0.0), (0.0, 1.0), (1.0, 0.0))  # N2 = 0 at beta 0: no step
    assert math.isnan(auto_beta.gradient_agreement(**nothing, beta=0.5))
    assert math.isnan(auto_beta.gradient_agreement(**no_reference, beta=0.5))
    assert math.isnan(auto_beta.gradient_agreement(**no_step, beta=0.0))
    assert not math.isnan(auto_beta.gradient_agreement(**no_step, beta=0.5))
    with pytest.raises(ValueError, match="beta"):
        auto_beta.gradient_agreement(**no_step, beta=1.5)


def test_the_summed_rewards_advantage_by_hand():
    """P_i = s_i - mean of the other scorable rows' s_j in i's group, s = sum_k c_k r_k."""
    nan = float("nan")
    rewards = torch.tensor(
        [
            [1.0, 0.0],  # s = 1
            [0.0, 1.0],  # s = 2
            [1.0, nan],  # s = 1 (the NaN reward left out)
            [nan, nan],  # unscorable: P = 0, and out of the others' means
            [1.0, 1.0],  # a group with one scorable row: P = 0
            [nan, nan],
            [nan, nan],
            [nan, nan],
        ]
    )
    summed = mrtpo.trainer_beta_auto.summed_reward_advantages(rewards, torch.tensor([1.0, 2.0]), 4)
    assert summed.tolist() == pytest.approx([1 - 1.5, 2 - 1, 1 - 1.5, 0, 0, 0, 0, 0])


def test_next_auto_beta_rises_only_on_a_positive_bound_and_stays_in_range():
    agree, split = [0.30, 0.32, 0.31], [0.3, -0.2, 0.25]
    assert auto_beta.next_auto_beta(0.0, agree, 1.0, 0.1) == 0.1
    assert auto_beta.next_auto_beta(0.95, agree, 1.0, 0.1) == 1.0  # capped at beta_max
    assert auto_beta.next_auto_beta(0.5, agree, 0.5, 0.1) == 0.5
    assert auto_beta.next_auto_beta(0.3, split, 1.0, 0.1) == 0.2  # bound below 0: falls
    assert auto_beta.next_auto_beta(0.05, split, 1.0, 0.1) == 0.0  # not below 0
    assert auto_beta.next_auto_beta(0.2, [0.9], 1.0, 0.1) == 0.1  # one probe: no bound
    beta = 0.0
    for _ in range(3):
        beta = auto_beta.next_auto_beta(beta, agree, 1.0, 0.1)
    for _ in range(3):
        beta = auto_beta.next_auto_beta(beta, split, 1.0, 0.1)
    assert beta == 0.0  # exactly back, no rounding residue
    with pytest.raises(ValueError, match="beta_step"):
        auto_beta.next_auto_beta(0.0, agree, 1.0, 0.0)


# ---------------------------------------------------------------------- configuration


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(mrtpo_beta="sometimes"), "mrtpo_beta must be a number in \\[0, 1\\] or 'auto'"),
        (dict(mrtpo_beta="auto", mrtpo_beta_max=1.5), "mrtpo_beta_max"),
        (dict(mrtpo_beta="auto", mrtpo_beta_step=0.0), "mrtpo_beta_step"),
        (dict(mrtpo_beta="auto", mrtpo_beta_probe_every=0), "mrtpo_beta_probe_every"),
        (dict(mrtpo_beta="auto", mrtpo_beta_window=1), "mrtpo_beta_window"),
    ],
)
def test_config_refuses_bad_auto_settings_naming_the_option(tmp_path, settings, message):
    with pytest.raises(ValueError, match=message):
        MRTPOConfig(output_dir=str(tmp_path), **CPU_RUN, **settings)


@pytest.mark.parametrize("estimator", ["gdpo", "grpo"])
def test_auto_under_a_baseline_estimator_is_its_beta_0(tmp_path, estimator):
    # `mrtpo train --config <recipe with auto> --advantage_estimator gdpo`: the baseline runs
    config = MRTPOConfig(
        output_dir=str(tmp_path), **CPU_RUN, mrtpo_beta="auto", advantage_estimator=estimator
    )
    assert config.mrtpo_beta == 0.0 and not config.beta_is_auto


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


def _rows_gradient(rows: list[int], seed: int, shape=(10, 3)) -> torch.Tensor:
    """A planted 2-D gradient that is nonzero on `rows` only."""
    gradient = torch.zeros(shape)
    generator = torch.Generator().manual_seed(seed)
    gradient[rows] = torch.randn(len(rows), shape[1], generator=generator)
    return gradient


def test_a_gradient_with_few_rows_is_kept_by_them_and_sums_as_the_whole():
    """The probe's storage (`stored`): a 2-D gradient nonzero on at most half of its rows is
    kept by those rows; dots, squares and sums give what the whole tensors give (the values of
    a sum bit for bit), and a sum kept by rows goes whole once its rows pass half."""
    from mrtpo.trainer_beta_auto import stored, stored_add, stored_dot, stored_square

    few, other = _rows_gradient([1, 4], seed=0), _rows_gradient([4, 7, 8], seed=1)
    dense, bias = torch.randn(10, 3), torch.randn(10)
    kept = stored(few)
    assert isinstance(kept, StoredRows) and kept.index.tolist() == [1, 4]
    assert torch.equal(kept.values, few[[1, 4]])
    assert stored(dense) is dense and stored(bias) is bias  # kept as they are
    assert stored(torch.zeros(10, 3)).index.numel() == 0  # a zero gradient: no rows at all
    assert stored(_rows_gradient(range(6), seed=2)).__class__ is torch.Tensor  # 6 of 10 rows
    assert torch.equal(stored_whole(kept, few), few) and stored_whole(dense, dense) is dense
    for grad in (dense, other, few):
        expected = torch.dot(grad.flatten(), few.flatten()).item()
        assert stored_dot(grad, kept).item() == pytest.approx(expected, rel=1e-6, abs=1e-7)
    assert stored_square(kept).item() == pytest.approx(few.square().sum().item(), rel=1e-6)
    total = stored_add(kept, other)  # rows 1, 4, 7, 8: still at most half
    assert isinstance(total, StoredRows) and total.index.tolist() == [1, 4, 7, 8]
    assert torch.equal(stored_whole(total, few), few + other)
    wider = stored_add(total, _rows_gradient([0, 2], seed=3))  # 6 rows of 10: whole
    assert torch.equal(wider, few + other + _rows_gradient([0, 2], seed=3))
    whole = stored_add(stored(few), dense)
    assert torch.equal(whole, few + dense)
    summed = dense.clone()
    assert stored_add(summed, few) is summed and torch.equal(summed, dense + few)  # in place


# ---------------------------------------------------------------------- beta on a planted task


def test_beta_rises_where_the_reallocation_points_uphill(tmp_path, monkeypatch):
    """The planted re-allocation moves each response's credit off the tokens that do not decide
    the reward (noise in g_U) onto the one that does: the more of it, the closer the step's
    direction to the summed reward's policy gradient, so the agreements are positive."""
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
    """The same weights on random tokens: the credit moved lands on the deciding token no more
    often than chance, and away from it otherwise; the step's direction does not improve."""
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

    def _probe_gradients(self, inputs, uniform, reallocation, summed, logps=None):
        state = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        kept = (dict(inputs), uniform.clone(), reallocation.clone(), summed.clone(), state)
        self.probes.append(kept)
        super()._probe_gradients(inputs, uniform, reallocation, summed, logps)


STEP_BETA = 0.5  # the beta `one_probed_step` trains (and judges) its step at
# Steps of two micro-batches of two groups each, every micro-batch probed.
TWO_PROBED_MICRO_BATCHES = dict(
    per_device_train_batch_size=8,
    num_generations=4,
    gradient_accumulation_steps=2,
    max_completion_length=8,
    mrtpo_beta="auto",
    mrtpo_beta_probe_every=1,
)


def one_probed_step(tmp_path, tied: bool = True) -> RecordingProbes:
    """One optimizer step of two micro-batches, both probed (their inputs kept), at beta
    `STEP_BETA` (the automatic beta set so before training, no warm-up); `tied=False`: the
    model's output matrix apart from its input embedding."""
    trainer = trainer_for(
        tmp_path,
        trainer_class=RecordingProbes,
        tied=tied,
        max_steps=1,
        mrtpo_warmup_steps=0,
        **TWO_PROBED_MICRO_BATCHES,
    )
    trainer._auto_beta_value = STEP_BETA
    trainer.train()
    return trainer


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
    ).double()


def _summed_advantages_apart(trainer, inputs) -> list[float]:
    """Each micro-batch row's P_i from the step's scored rewards, by the definition: the row
    found among the scored ones by its response ids (every match must give the same P), s the
    plain sum of its rewards (weights 1), less the mean of its group's other rows'."""
    scored, group = trainer._scored, trainer.num_generations
    rewards = scored.rewards.tolist()
    s = [sum(r for r in row if not math.isnan(r)) for row in rewards]

    def advantage(j: int) -> float:
        others = [s[i] for i in range(j - j % group, j - j % group + group) if i != j]
        return s[j] - sum(others) / len(others)

    values = []
    for ids, mask in zip(inputs["completion_ids"], inputs["completion_mask"], strict=True):
        row = ids[mask.bool()].tolist()
        matches = {advantage(j) for j, other in enumerate(scored.completion_ids) if other == row}
        assert len(matches) == 1, matches
        values.append(matches.pop())
    return values


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "input-embedding-apart"])
def test_the_agreement_equals_gradients_computed_apart(tmp_path, tied):
    """One step of two micro-batches at beta 0.5: the first has no reference (only its g_P is
    taken, and it becomes the reference); the second's g_U and g_R are compared with it. The
    logged agreement is cos(g_R, G) - cos(g, G) cos(g, g_R), g = g_U + 0.5 g_R, and the logged
    cosine cos(g_R, G), computed here from whole gradient vectors (a plain per-row forward, not
    the shared-prompt one the probe uses) and P from the scored rewards by its definition."""
    trainer = one_probed_step(tmp_path, tied)
    assert len(trainer.probes) == 2
    (first, _, _, p_first, state), (second, u_second, r_second, p_second, state_second) = (
        trainer.probes
    )
    assert all(torch.equal(state[k], state_second[k]) for k in state)  # one step's parameters
    for inputs, _, _, summed, _ in trainer.probes:
        assert summed.tolist() == pytest.approx(_summed_advantages_apart(trainer, inputs))
    assert p_first.abs().sum() > 0 and r_second.abs().sum() > 0 and u_second.abs().sum() > 0
    model = tiny_model(len(tiny_tokenizer()), seed=0, tied=tied)
    model.load_state_dict(state)
    ones = torch.ones_like(first["completion_mask"], dtype=torch.float32)
    reference = _policy_gradient(trainer, model, first, p_first.unsqueeze(1) * ones)
    uniform = _policy_gradient(trainer, model, second, u_second)
    reallocation = _policy_gradient(trainer, model, second, r_second)
    step = uniform + STEP_BETA * reallocation

    def cos(a, b):
        return torch.dot(a, b) / (a.norm() * b.norm())

    cosine = cos(reallocation, reference)
    expected = cosine - cos(step, reference) * cos(step, reallocation)
    log = step_logs(trainer)[0]
    assert log["mrtpo/beta"] == STEP_BETA
    assert log[PREFIX + "probe_agreement"] == pytest.approx(expected.item(), rel=1e-4, abs=1e-6)
    assert log[PREFIX + "probe_cosine"] == pytest.approx(cosine.item(), rel=1e-4, abs=1e-6)
    # After the step the reference holds both micro-batches' g_P; the input embedding's part
    # by its rows where the output matrix is apart (only the batch's tokens have a gradient).
    after = reference + _policy_gradient(trainer, model, second, p_second.unsqueeze(1) * ones)
    kept = whole_reference(trainer)
    params = [p for p in trainer.model.parameters() if p.requires_grad]
    flat = torch.cat([kept[i].flatten() for i in range(len(params))]).double()
    assert torch.allclose(flat, after, rtol=1e-4, atol=1e-7)
    embedding = trainer._auto_reference[0]  # model.embed_tokens.weight
    assert isinstance(embedding, StoredRows) is not tied
    if not tied:
        seen = {
            t
            for b in (first, second)
            for k in ("prompt_ids", "completion_ids")
            for t in b[k].flatten().tolist()
        }
        assert set(embedding.index.tolist()) <= seen
        assert 0 < embedding.index.numel() <= len(tiny_tokenizer()) // 2
    # The step trained at U + 0.5 R; R_t is the re-allocation: zero mean over each response's
    # trained tokens.
    assert torch.allclose(second["advantages"], u_second + STEP_BETA * r_second)
    mask = second["completion_mask"].float()
    assert torch.allclose((r_second * mask).sum(1), torch.zeros(len(mask)), atol=1e-5)


@pytest.mark.parametrize(
    "settings",
    [dict(), dict(share_prompt=False, gradient_checkpointing=False)],
    ids=["shared-prompt-checkpointing", "plain-forward"],
)
def test_the_probe_on_the_losss_forward_equals_a_probe_of_its_own(tmp_path, monkeypatch, settings):
    """In one process a probed micro-batch's passes run on the loss's own forward, before the
    training backward: one forward fewer, and the same agreements, reference and update as a
    probe on a forward of its own after the backward (the path of several processes)."""
    forwards = []
    original = MRTPOTrainer._get_per_token_logps_and_entropies

    def counted(self, *args, **kwargs):
        forwards.append(torch.is_grad_enabled())
        return original(self, *args, **kwargs)

    monkeypatch.setattr(MRTPOTrainer, "_get_per_token_logps_and_entropies", counted)
    runs = {}
    for probe_forward in ("shared", "own"):
        if probe_forward == "own":  # the loss as TRL computes it: the probe after the backward
            monkeypatch.setattr(
                mrtpo.trainer_beta_auto.AutoBetaMixin,
                "compute_loss",
                lambda self, *a, **k: super(
                    mrtpo.trainer_beta_auto.AutoBetaMixin, self
                ).compute_loss(*a, **k),
            )
        forwards.clear()
        trainer = train(
            tmp_path / probe_forward, max_steps=2, **TWO_PROBED_MICRO_BATCHES, **settings
        )
        logs = step_logs(trainer)
        runs[probe_forward] = dict(
            forwards_with_gradients=sum(forwards),
            logs=[
                [log.get(PREFIX + name) for name in ("probe_agreement", "probe_cosine")]
                for log in logs
            ],
            losses=[log["loss"] for log in trainer.state.log_history if "loss" in log],
            reference=whole_reference(trainer),
            weights=trainer.model.state_dict(),
        )
    shared, own = runs["shared"], runs["own"]
    # 2 steps x 2 micro-batches, each probed: 4 training forwards, and 4 probe forwards when
    # the probe runs its own (the first micro-batch's one pass included).
    assert (shared["forwards_with_gradients"], own["forwards_with_gradients"]) == (4, 8)
    assert shared["logs"] == own["logs"]
    assert shared["logs"][1][0] is not None  # the second step's probe compared gradients
    assert shared["losses"] == own["losses"]
    assert shared["reference"].keys() == own["reference"].keys()
    assert all(torch.equal(shared["reference"][i], own["reference"][i]) for i in own["reference"])
    assert all(torch.equal(shared["weights"][k], own["weights"][k]) for k in own["weights"])


def whole_reference(trainer) -> dict[int, torch.Tensor]:
    """The probe's reference G, each parameter's part a whole tensor (a copy)."""
    params = [p for p in trainer.model.parameters() if p.requires_grad]
    return {i: stored_whole(ref, params[i]).clone() for i, ref in trainer._auto_reference.items()}


@pytest.fixture(scope="module")
def probed_step(tmp_path_factory) -> RecordingProbes:
    """`one_probed_step`, built once for the module's shortcut tests, with its reference after
    the step kept apart (`reference_after`: each test probes from it)."""
    trainer = one_probed_step(tmp_path_factory.mktemp("probed"))
    trainer.reference_after = whole_reference(trainer)
    return trainer


@pytest.mark.parametrize(
    "zero",
    [("uniform", "reallocation", "summed"), ("reallocation",), ("uniform",), ("summed",)],
    ids=["every-advantage", "no-reallocation", "no-uniform", "no-summed"],
)
@pytest.mark.parametrize("position", [0, 1], ids=["first-micro-batch", "later-micro-batch"])
def test_a_pass_without_advantages_is_skipped_and_changes_nothing(
    probed_step, monkeypatch, position, zero
):
    """A micro-batch whose U_t, R_t or P_i are all 0 (tied groups; rewards that cancel in the
    sum): the probe's sums and reference change exactly as the forward and all three backward
    passes change them, and the skipped ones do not run (nothing at all without advantages)."""
    trainer = probed_step
    inputs, uniform, reallocation, summed, _ = trainer.probes[1]
    given = dict(uniform=uniform, reallocation=reallocation, summed=summed)
    given.update({name: torch.zeros_like(given[name]) for name in zero})
    trainer._position_in_step = (trainer.state.global_step, position)
    saved = trainer.reference_after
    assert saved and all(ref.abs().sum() > 0 for ref in saved.values())
    base = torch.arange(1.0, 7.0, dtype=torch.float64)

    def probe(shortcut: bool):
        trainer._auto_reference = {i: ref.clone() for i, ref in saved.items()}
        trainer._auto_sums = base.clone()
        if not shortcut:  # the forward and all three backward passes, whatever the advantages
            monkeypatch.setattr(mrtpo.trainer_beta_auto, "probe_passes", lambda *a: PASSES)
        calls = {"forward": 0, "backward": 0}
        original = trainer._get_per_token_logps_and_entropies
        original_backward = torch.Tensor.backward

        def forward(*args, **kwargs):
            calls["forward"] += 1
            return original(*args, **kwargs)

        def backward(self, *args, **kwargs):
            calls["backward"] += 1
            return original_backward(self, *args, **kwargs)

        monkeypatch.setattr(trainer, "_get_per_token_logps_and_entropies", forward)
        monkeypatch.setattr(torch.Tensor, "backward", backward)
        trainer._probe_gradients(inputs, **given)
        monkeypatch.undo()
        kept = {i: ref for i, ref in whole_reference(trainer).items() if ref.abs().sum() > 0}
        return trainer._auto_sums.clone(), kept, calls

    fast_sums, fast_reference, fast_calls = probe(shortcut=True)
    slow_sums, slow_reference, slow_calls = probe(shortcut=False)
    assert slow_calls == {"forward": 1, "backward": 3}
    ran = mrtpo.trainer_beta_auto.probe_passes(True, *given.values())
    assert fast_calls == {"forward": int(bool(ran)), "backward": len(ran)}
    if len(zero) == 3:
        assert ran == ()
    reference_sq = sum(torch.dot(r.flatten(), r.flatten()).double() for r in saved.values())
    added = dict(zip(SUMS, (fast_sums - base).tolist(), strict=True))
    assert added["reference_sq"] == pytest.approx(reference_sq.item(), rel=1e-12)
    for name in zero:  # a zero gradient's dots and norms are 0, its cross term too
        for key in {"uniform": ("uniform_dot", "uniform_sq"), "summed": ()}.get(
            name, ("reallocation_dot", "reallocation_sq")
        ):
            assert added[key] == 0.0
        if name != "summed":
            assert added["cross"] == 0.0
    assert slow_sums.tolist() == pytest.approx(fast_sums.tolist(), rel=1e-6, abs=1e-9)
    # At a step's first micro-batch its g_P replaces the reference (all zeros without P);
    # later, g_P is added to the reference (zeros: unchanged).
    if "summed" in zero:
        expected = {} if position == 0 else saved
        for reference in (fast_reference, slow_reference):
            assert reference.keys() == expected.keys()
            assert all(torch.equal(reference[i], expected[i]) for i in expected)
    else:
        assert fast_reference.keys() == slow_reference.keys()
        assert all(torch.equal(fast_reference[i], slow_reference[i]) for i in fast_reference)


# Three steps of two micro-batches of one group each, probed every second step.
THREE_AUTO_STEPS = dict(
    per_device_train_batch_size=4,
    num_generations=4,
    gradient_accumulation_steps=2,
    max_completion_length=6,
    max_steps=3,
    mrtpo_beta="auto",
    mrtpo_beta_probe_every=2,
)


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
    trainer = train(tmp_path, **{**THREE_AUTO_STEPS, **settings})
    logs = step_logs(trainer)
    assert len(logs) == 3
    for log in logs:  # every step: beta, the estimate, its uncertainty, the evidence's size
        assert {PREFIX + "agreement", PREFIX + "agreement_se", PREFIX + "probes"} <= set(log)
    # Steps 0 and 2 probed (every 2): the first agreement has its pairs inside step 0.
    assert logs[1][PREFIX + "probes"] == 1.0 and logs[2][PREFIX + "probes"] == 2.0
    assert -1 <= logs[2][PREFIX + "probe_agreement"] <= 1
    assert -1 <= logs[2][PREFIX + "probe_cosine"] <= 1
    assert logs[2][PREFIX + "probe_seconds"] > 0
    assert PREFIX + "probe_agreement" not in logs[1]  # step 1 was not probed


def test_the_credit_maps_show_the_evidence_beta_moves_on(tmp_path):
    """Each step's maps are drawn at its generation, before it trains: they show the beta it
    trains with and the evidence logged at the end of the step before (none at step 0)."""
    settings = dict(mrtpo_beta_probe_every=1, mrtpo_warmup_steps=0, credit_map_steps=1)
    trainer = train(tmp_path, **{**THREE_AUTO_STEPS, **settings})
    logs = step_logs(trainer)
    credit_dir = Path(trainer.args.output_dir) / "credit"
    steps = json.loads((credit_dir / "index.json").read_text())
    assert [entry["step"] for entry in steps] == [0, 1, 2]
    shown = [entry["diagnostics"] for entry in steps]
    assert [figures["beta"] for figures in shown] == [log["mrtpo/beta"] for log in logs]
    assert shown[0]["probes"] == 0.0 and shown[0]["agreement"] is None  # NaN: no evidence yet
    for before, figures in zip(logs[:-1], shown[1:], strict=True):
        for name in ("agreement", "agreement_se", "agreement_lower", "probes"):
            logged = before[PREFIX + name]
            if logged is None or math.isnan(logged):  # index.json keeps a NaN as null
                assert figures[name] is None, name
            else:
                assert figures[name] == pytest.approx(logged), name
    assert shown[2]["probes"] == 2.0 and shown[2]["agreement_se"] is not None
    page = (credit_dir / "step-00002.html").read_text()
    assert "<th>agreement_lower</th>" in page and f"<td>{shown[2]['probes']:.4g}</td>" in page


# ---------------------------------------------------------------------- fixed beta


def test_fixed_beta_never_enters_the_auto_code(tmp_path, monkeypatch):
    """A fixed beta trains as before the option existed: the auto methods, made to raise here,
    are never called (the parameters were also checked bit for bit against the commit before
    the option, docs/METHOD.md)."""

    def refuse(*args, **kwargs):
        raise AssertionError("the fixed-beta path entered mrtpo_beta='auto''s code")

    for name in ("_init_auto_beta", "_auto_beta_at", "_keep_probe_batch", "_after_micro_batch"):
        monkeypatch.setattr(mrtpo.trainer_beta_auto.AutoBetaMixin, name, refuse)
    monkeypatch.setattr(mrtpo.trainer, "summed_reward_advantages", refuse)
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
    6 trains step 7 at the beta the uninterrupted run trained it at (not 0)."""
    monkeypatch.setattr(mrtpo.relevance, "replay_distances", planted_replay)
    whole = train(
        tmp_path / "whole",
        [FirstChar()],
        num_prompts=16,
        max_steps=7,
        save_strategy="steps",
        save_steps=3,
        **PLANTED,
    )
    whole_logs = step_logs(whole)
    checkpoint = tmp_path / "whole" / "run" / "checkpoint-6"
    saved = json.loads((checkpoint / mrtpo.trainer_beta_auto.STATE_FILE).read_text())
    assert saved["beta"] == whole_logs[5][PREFIX + "next_beta"] > 0
    probes = [log[PREFIX + "probe_agreement"] for log in whole_logs[:6]]
    # Step 0's first micro-batch ties every group (P = 0): its reference is empty, |G|^2 = 0.
    assert probes[0] is None  # no agreement, no move
    assert saved["agreements"] == pytest.approx(probes[1:])
    model, tokenizer = tiny_model_and_tokenizer(seed=0)
    args = MRTPOConfig(
        output_dir=str(tmp_path / "whole" / "run"),
        **{**CPU_RUN, "max_steps": 7, "save_strategy": "steps", "save_steps": 3, **PLANTED},
    )
    resumed = MRTPOTrainer(
        model=model,
        reward_funcs=[FirstChar()],
        args=args,
        train_dataset=toy_dataset(16),
        processing_class=tokenizer,
    )
    resumed.train(resume_from_checkpoint=str(checkpoint))
    seventh = [
        log for log in resumed.state.log_history if log.get("step") == 7 and "mrtpo/beta" in log
    ]
    assert seventh[-1]["mrtpo/beta"] == whole_logs[6]["mrtpo/beta"] == saved["beta"]
