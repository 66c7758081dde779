"""`mrtpo sft`: the cold start trains on the completion only, from the very prompt RL generates from."""

from __future__ import annotations

import pytest
import torch
import yaml
from datasets import Dataset

from mrtpo import cli, cold_start, models, tasks
from mrtpo.commands import sft
from mrtpo.generation import render_prompt_ids
from mrtpo.models import load_model
from mrtpo.tasks.base import Task
from mrtpo.testing import tiny_model, tiny_model_and_tokenizer, tiny_tokenizer
from mrtpo.verifiers import Verdict, Verifier


class TagVerifier(Verifier):
    name = "tag"

    def verify(self, completion, example):
        return Verdict(float("<answer>" in completion), "format: <answer>...</answer>")


class CountryTask(Task):
    """Capitals; only rows with a known capital have a reference."""

    name = "capitals"
    system_prompt = "Answer with the capital inside <answer> tags."
    capitals = {
        "France": "Paris",
        "Peru": "Lima",
        "Japan": "Tokyo",
        "Chad": None,
        "Kenya": "Nairobi",
    }

    def load(self, split="train", path=None, **kwargs):
        return Dataset.from_list(
            [
                {
                    "prompt": [
                        {"role": "system", "content": self.system_prompt},
                        {"role": "user", "content": f"What is the capital of {country}?"},
                    ],
                    "country": country,
                }
                for country in self.capitals
            ]
        )

    def verifiers(self, **kwargs):
        return [TagVerifier()]

    def reference_completion(self, example):
        capital = self.capitals[example["country"]]
        return None if capital is None else f"<answer>{capital}</answer>"


class NoReferences(CountryTask):
    name = "noref"

    def reference_completion(self, example):
        return None


@pytest.fixture
def capitals(monkeypatch):
    registered = {"capitals": CountryTask(), "noref": NoReferences()}
    real_get = tasks.get
    monkeypatch.setattr(tasks, "get", lambda name: registered.get(name) or real_get(name))
    return registered["capitals"]


def sft_trainer(task_name, model_dir, output_dir, *extra):
    script_args, config = sft.parse_args(
        [
            "--task",
            task_name,
            "--model_name_or_path",
            str(model_dir),
            "--output_dir",
            str(output_dir),
            "--per_device_train_batch_size",
            "2",
            *extra,
        ]
    )
    return sft.build_trainer(script_args, config)


def test_dataset_is_prompt_completion_from_references(capitals):
    dataset = cold_start.cold_start_dataset(capitals, seed=0)
    assert len(dataset) == 4  # Chad has no reference
    by_country = {row["prompt"][1]["content"].split()[-1].rstrip("?"): row for row in dataset}
    assert by_country["Peru"]["completion"] == [
        {"role": "assistant", "content": "<answer>Lima</answer>"}
    ]
    assert by_country["Peru"]["prompt"] == capitals.load("train")[1]["prompt"]
    assert len(cold_start.cold_start_dataset(capitals, max_examples=2)) == 2


@pytest.mark.parametrize("task_name", ["capitals", "tool_calling", "sql"])
def test_prompt_bytes_equal_train_and_labels_mask_the_prompt(
    task_name, capitals, tiny_model_dir, tmp_path
):
    """SFT trains on exactly the prompt tokens `mrtpo train` generates from (same chat template,
    system prompt and tools rendering), and only on the completion."""
    from mrtpo.trainer import MRTPOConfig, MRTPOTrainer

    task = tasks.get(task_name)
    trainer = sft_trainer(task_name, tiny_model_dir, tmp_path / "sft", "--max_train_examples", "6")
    tokenizer = trainer.processing_class
    rows = [trainer.train_dataset[i] for i in range(len(trainer.train_dataset))]
    batch = trainer.data_collator(rows)

    # The prompts `mrtpo train` generates from: TRL's GRPOTrainer tokenization, run for real.
    # A model of its own: the trainer's accelerate wrapping rebinds `forward`, which would leak
    # into the session-wide `tiny` fixture.
    model = trainer.model
    grpo = MRTPOTrainer(
        model=model,
        reward_funcs=task.verifiers(),
        args=MRTPOConfig(
            output_dir=str(tmp_path / "grpo"),
            num_generations=2,
            per_device_train_batch_size=2,
            bf16=False,
            activation_checkpointing=False,
            report_to="none",
        ),
        train_dataset=task.load("train"),
        processing_class=tokenizer,
    )
    dataset = cold_start.cold_start_dataset(task, max_examples=6, seed=trainer.args.seed)
    train_prompt_ids, _, _ = grpo._tokenize_prompts(list(dataset["prompt"]))
    assert [list(ids) for ids in train_prompt_ids] == render_prompt_ids(
        tokenizer, list(dataset["prompt"])
    )

    for i, prompt_ids in enumerate(train_prompt_ids):
        keep = batch["attention_mask"][i].bool()
        ids, labels = batch["input_ids"][i][keep], batch["labels"][i][keep]
        n = len(prompt_ids)
        # Byte-identical prompt: same tokens, hence same text.
        assert ids[:n].tolist() == list(prompt_ids)
        assert tokenizer.decode(ids[:n]) == tokenizer.decode(list(prompt_ids))
        # Every prompt token is masked, every completion token is learned.
        assert (labels[:n] == -100).all()
        assert torch.equal(labels[n:], ids[n:]) and len(ids) > n
        reference = dataset[i]["completion"][0]["content"]
        assert tokenizer.decode(ids[n:]).startswith(reference)
    # Padding is never learned either.
    assert (batch["labels"][~batch["attention_mask"].bool()] == -100).all()


def test_sft_two_steps_writes_a_loadable_model(capitals, tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "cold"
    code = cli.main(
        [
            "sft",
            "--task",
            "capitals",
            "--model_name_or_path",
            str(tiny_model_dir),
            "--output_dir",
            str(out),
            "--max_steps",
            "2",
            "--per_device_train_batch_size",
            "2",
            "--learning_rate",
            "1e-3",
        ]
    )
    assert code == 0
    assert "sft: 2 steps on 4 capitals demonstrations" in capsys.readouterr().out
    model, tokenizer = load_model(out)
    reference, reference_tokenizer = tiny_model_and_tokenizer(seed=0)
    assert tokenizer.chat_template == reference_tokenizer.chat_template
    changed = [
        name
        for name, p in model.named_parameters()
        if not torch.equal(p, reference.get_parameter(name))
    ]
    assert changed, "two steps at lr 1e-3 must change the weights"


def test_task_without_references_exits_2(capitals, tiny_model_dir, tmp_path, capsys):
    code = cli.main(
        [
            "sft",
            "--task",
            "noref",
            "--model_name_or_path",
            str(tiny_model_dir),
            "--output_dir",
            str(tmp_path),
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and "no reference responses" in err[0] and "noref" in err[0]


def test_recipe_sft_keys_set_the_budget(capitals, tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        yaml.safe_dump(
            {
                "task": "capitals",
                "max_steps": 40,
                "mrtpo_beta": 0.5,
                "sft_max_steps": 3,
                "sft_learning_rate": 2e-5,
                "sft_max_train_examples": 16,
            }
        )
    )
    script_args, config = sft.parse_args(["--config", str(recipe), "--output_dir", str(tmp_path)])
    assert script_args.task == "capitals" and script_args.max_train_examples == 16
    assert (
        config.max_steps == 3 and config.learning_rate == 2e-5
    )  # the recipe's RL max_steps is not SFT's
    assert config.completion_only_loss is True
    _, config = sft.parse_args(["--config", str(recipe), "--max_steps", "5"])
    assert config.max_steps == 5 and config.output_dir == "outputs/sft-capitals"


def test_sft_on_bundled_tool_calling_then_eval_takes_the_folder(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "cold"
    code = cli.main(
        ["sft", "--task", "tool_calling", "--model_name_or_path", str(tiny_model_dir), "--output_dir", str(out),
         "--max_steps", "2", "--per_device_train_batch_size", "2", "--max_train_examples", "4"]
    )  # fmt: skip
    assert code == 0
    assert "sft: 2 steps on 4 tool_calling demonstrations" in capsys.readouterr().out
    code = cli.main(
        ["eval", "--task", "tool_calling", "--model_name_or_path", str(out), "--max_examples", "2",
         "--max_new_tokens", "3", "--output_dir", str(tmp_path / "eval")]
    )  # fmt: skip
    assert code == 0


def test_instructions_has_no_cold_start(tiny_model_dir, tmp_path, capsys):
    code = cli.main(["sft", "--task", "instructions", "--model_name_or_path", str(tiny_model_dir),
                     "--output_dir", str(tmp_path)])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "no reference responses" in err[0]


def test_references_using_untrained_rows_are_warned_about(capitals):
    model, tokenizer = tiny_model_and_tokenizer(seed=0)
    dataset = cold_start.cold_start_dataset(capitals, max_examples=2)
    assert cold_start.untrained_reference_tokens(model, tokenizer, dataset) == []
    first = tokenizer(dataset[0]["completion"][0]["content"], add_special_tokens=False)
    token_id = first["input_ids"][0]
    with torch.no_grad():
        model.get_output_embeddings().weight[token_id] = 0.0
    with pytest.warns(UserWarning, match=rf"never trained: .*\({token_id}\)"):
        assert cold_start.untrained_reference_tokens(model, tokenizer, dataset) == [token_id]


def untied_model_and_first_reference_token(task, examples):
    """The tiny model with its own output matrix, the task's first `examples` demonstrations and
    the first token of the first one's reference."""
    tokenizer = tiny_tokenizer()
    model = tiny_model(len(tokenizer), tied=False)
    dataset = cold_start.cold_start_dataset(task, max_examples=examples)
    reference = dataset[0]["completion"][0]["content"]
    token_id = tokenizer(reference, add_special_tokens=False)["input_ids"][0]
    return model, tokenizer, dataset, token_id


def pieceless_row(trained_rows: torch.Tensor, token_id: int) -> torch.Tensor:
    """Where a token without pieces of its own starts: the trained rows' mean plus a tenth
    (`cold_start.PIECELESS_OFFSET_SCALE`) of their per-coordinate spread times a normal draw
    seeded by its id."""
    draw = torch.randn(trained_rows.shape[1], generator=torch.Generator().manual_seed(token_id))
    offset = cold_start.PIECELESS_OFFSET_SCALE * trained_rows.std(dim=0) * draw
    return trained_rows.mean(dim=0) + offset


@pytest.mark.parametrize("method", ["fit", "mean"])
def test_untrained_rows_are_initialized_so_the_references_can_be_written(capitals, method):
    from mrtpo.models import untrained_token_ids

    model, tokenizer, dataset, token_id = untied_model_and_first_reference_token(capitals, 4)
    inputs, outputs = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    with torch.no_grad():  # as released: a zero output row and an input row shared with a twin
        outputs.mul_(30.0)  # a peaked next-token distribution, as a trained model has
        outputs[token_id] = 0.0
        inputs[token_id] = inputs[token_id + 1]
    assert untrained_token_ids(model, [token_id]) == [token_id]
    untouched = inputs.detach().clone(), outputs.detach().clone()

    figures = cold_start.initialize_untrained_rows(model, tokenizer, dataset, [token_id], method)

    before, after = figures[token_id]
    others = torch.arange(len(tokenizer)) != token_id
    assert torch.equal(inputs[others], untouched[0][others])  # no other row moves
    assert torch.equal(outputs[others], untouched[1][others])
    # "<" is a single character of the vocabulary, no pieces of its own: the mean of the trained
    # rows, without the zero padding row 0 and the twin token_id + 1, both never trained, plus
    # its seeded offset.
    trained = others.clone()
    trained[[0, token_id + 1]] = False
    torch.testing.assert_close(inputs[token_id], pieceless_row(untouched[0][trained], token_id))
    assert untrained_token_ids(model, [token_id]) == []
    # Log p where the references write the token, measured independently of the function.
    prompt = render_prompt_ids(tokenizer, [dataset[0]["prompt"]])[0]
    with torch.no_grad():
        logits = model(torch.tensor([prompt + [token_id]])).logits[0]
    log_p = torch.log_softmax(logits, dim=-1)
    best_other = float(log_p[len(prompt) - 1, others].max())
    if method == "mean":  # the output matrix's row 0 and token_id + 1 are ordinary rows
        torch.testing.assert_close(outputs[token_id], pieceless_row(untouched[1][others], token_id))
        assert abs(after - before) < 1.0  # about the average logit: still not writable
    else:
        # As likely as the model's best other choice where the references write it...
        assert after > before + 5.0, (before, after)
        assert abs(float(log_p[len(prompt) - 1, token_id]) - best_other) < 1.0
        # ...and not elsewhere: at the prompt's other positions it stays rare.
        elsewhere = log_p[: len(prompt) - 1, token_id].exp()
        assert float(elsewhere.mean()) < 0.02 and float(elsewhere.max()) < 0.2


def test_sft_fits_untrained_rows_by_default_and_keep_only_warns(capitals, monkeypatch, tmp_path):
    model, tokenizer, _, token_id = untied_model_and_first_reference_token(capitals, 2)
    with torch.no_grad():
        model.get_output_embeddings().weight[token_id] = 0.0
    monkeypatch.setattr(tasks, "get", lambda name: capitals)
    monkeypatch.setattr("mrtpo.models.load_model", lambda name: (model, tokenizer))
    config = cold_start.sft_config(output_dir=str(tmp_path), max_steps=1, use_cpu=True)
    with pytest.warns(UserWarning, match="never trained"):
        cold_start.build_sft_trainer("capitals", "tiny", config, untrained_tokens="keep")
    assert not model.get_output_embeddings().weight[token_id].any()
    cold_start.build_sft_trainer("capitals", "tiny", config)
    assert model.get_output_embeddings().weight[token_id].any()
    with pytest.raises(ValueError, match="untrained_tokens must be one of"):
        cold_start.build_sft_trainer("capitals", "tiny", config, untrained_tokens="zero")


def test_fit_refuses_a_head_that_is_not_a_plain_product(capitals):
    model, tokenizer, dataset, _ = untied_model_and_first_reference_token(capitals, 2)
    head = torch.nn.Linear(model.config.hidden_size, len(tokenizer), bias=True)
    with torch.no_grad():
        head.weight.copy_(model.lm_head.weight)
        head.bias.fill_(1.0)  # logits = h.W + b: the ridge row would be fitted to the wrong goal
    model.lm_head = head
    with pytest.raises(ValueError, match="use 'mean'"):
        cold_start.initialize_untrained_rows(model, tokenizer, dataset, [5], "fit")
    figures = cold_start.initialize_untrained_rows(model, tokenizer, dataset, [5], "mean")
    assert set(figures) == {5}


class ToolTagTask(CountryTask):
    """Capitals inside `<tool_call>` tags, two tokens the model never trained."""

    name = "tool_tags"

    def reference_completion(self, example):
        capital = self.capitals[example["country"]]
        return None if capital is None else f"<tool_call>{capital}</tool_call>"


def model_with_released_tags(dtype=torch.float32):
    """The tiny untied model with `<tool_call>` and `</tool_call>` added as released models ship
    them: one input row shared by both, a zero output row each; a peaked head, as a trained
    model has. Returns the model, the tokenizer, the tags' ids and the references."""
    tokenizer = tiny_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": ["<tool_call>", "</tool_call>"]})
    model = tiny_model(len(tokenizer), tied=False)
    tags = tokenizer.convert_tokens_to_ids(["<tool_call>", "</tool_call>"])
    inputs, outputs = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    with torch.no_grad():
        outputs.mul_(30.0)
        inputs[tags] = torch.randn(inputs.shape[1], generator=torch.Generator().manual_seed(1))
        outputs[tags] = 0.0
    dataset = cold_start.cold_start_dataset(ToolTagTask(), max_examples=4)
    return model.to(dtype), tokenizer, tags, dataset


def pieces_of(tokenizer, token):
    """The ids of `token`'s text tokenized with the special tokens split (`<`, `tool`, ...)."""
    return tokenizer(token, add_special_tokens=False, split_special_tokens=True)["input_ids"]


def written_log_p(model, tokenizer, dataset, tags):
    """[2, 2]: at the position where the first reference writes tag i (row), the log p of tag j
    (column), and the best other token's log p there for each row ([2])."""
    prompt = render_prompt_ids(tokenizer, [dataset[0]["prompt"]])[0]
    completion = tokenizer(dataset[0]["completion"][0]["content"], add_special_tokens=False)
    ids = prompt + completion["input_ids"]
    with torch.no_grad():
        log_p = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)
    where = [ids.index(tag) - 1 for tag in tags]
    others = torch.ones(log_p.shape[1], dtype=torch.bool)
    others[tags] = False
    return log_p[where][:, tags], log_p[where][:, others].max(dim=-1).values


@pytest.mark.parametrize("method", ["fit", "mean"])
def test_tags_initialized_together_stay_two_tokens(method):
    """`<tool_call>` and `</tool_call>` each start from the mean of their own pieces' rows (`<`,
    `tool`, `_`, `call`, `>` against `</`, ...): the model reads them apart and, with "mean",
    writes them apart; with "fit" each is the model's choice where the references write it."""
    model, tokenizer, tags, dataset = model_with_released_tags()
    inputs, outputs = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    untouched = inputs.detach().clone(), outputs.detach().clone()

    cold_start.initialize_untrained_rows(model, tokenizer, dataset, tags, method)

    gap = float((inputs[tags[0]] - inputs[tags[1]]).detach().norm())
    assert gap > 0.2 * float(inputs[tags[0]].detach().norm()), gap
    opening, closing = pieces_of(tokenizer, "<tool_call>"), pieces_of(tokenizer, "</tool_call>")
    assert opening != closing and len(opening) > 1
    torch.testing.assert_close(inputs[tags[0]], untouched[0][opening].mean(dim=0))
    torch.testing.assert_close(inputs[tags[1]], untouched[0][closing].mean(dim=0))
    if method == "mean":
        gap = float((outputs[tags[0]] - outputs[tags[1]]).detach().norm())
        assert gap > 0.2 * float(outputs[tags[0]].detach().norm()), gap
        torch.testing.assert_close(outputs[tags[0]], untouched[1][opening].mean(dim=0))
        torch.testing.assert_close(outputs[tags[1]], untouched[1][closing].mean(dim=0))
    else:
        log_p, best_other = written_log_p(model, tokenizer, dataset, tags)
        # Each tag about as likely as the best other token where the reference writes it, and
        # well above the other tag there.
        assert (log_p.diagonal() - best_other).abs().max() < 1.0, (log_p, best_other)
        assert log_p[0, 0] > log_p[0, 1] + 3.0 and log_p[1, 1] > log_p[1, 0] + 3.0, log_p


def test_the_means_leave_out_rows_never_trained():
    """Rows never trained (zero, or twins of one unused vector, as Qwen2.5 ships a dozen) are
    neither pieces nor part of the mean of the trained rows."""
    model, tokenizer, tags, dataset = model_with_released_tags()
    inputs = model.get_input_embeddings().weight
    opening = pieces_of(tokenizer, "<tool_call>")
    plain = tokenizer("{", add_special_tokens=False)["input_ids"][0]  # no pieces of its own
    assert {plain, plain + 1}.isdisjoint(opening)
    unused = list(range(400, 440))
    with torch.no_grad():
        inputs[opening[1]] = 0.0  # `tool` never trained
        inputs[unused] = 5.0  # forty twins
        inputs[plain] = inputs[plain + 1]
    untouched = inputs.detach().clone()

    cold_start.initialize_untrained_rows(model, tokenizer, dataset, [*tags, plain], "mean")

    torch.testing.assert_close(inputs[tags[0]], untouched[[opening[0], *opening[2:]]].mean(dim=0))
    trained = torch.ones(len(tokenizer), dtype=torch.bool)
    trained[[0, opening[1], *unused, *tags, plain, plain + 1]] = False
    # The mean and spread of the trained rows only, plus the token's own seeded draw.
    torch.testing.assert_close(inputs[plain], pieceless_row(untouched[trained], plain))


def test_fit_accepts_a_bf16_model_and_still_refuses_a_bias():
    """bf16 rounds a logit to 8 bits: the check that the head is a plain product allows for it,
    and still sees a bias of 1."""
    model, tokenizer, tags, dataset = model_with_released_tags(torch.bfloat16)
    head = model.lm_head
    biased = torch.nn.Linear(model.config.hidden_size, len(tokenizer), bias=True)
    with torch.no_grad():
        biased.weight.copy_(head.weight)
        biased.bias.fill_(1.0)
    model.lm_head = biased.to(torch.bfloat16)
    with pytest.raises(ValueError, match="use 'mean'"):
        cold_start.initialize_untrained_rows(model, tokenizer, dataset, tags, "fit")
    model.lm_head = head
    figures = cold_start.initialize_untrained_rows(model, tokenizer, dataset, tags, "fit")
    for before, after in figures.values():
        assert after > before + 5.0, figures
    assert model.get_output_embeddings().weight.dtype == torch.bfloat16


@pytest.mark.parametrize("method", ["fit", "mean"])
def test_tokens_without_pieces_start_apart_and_alike_on_every_call(method):
    """Two single characters, untrained twins, have no pieces of their own: each starts at the
    trained rows' mean plus an offset seeded by its id, so they are no longer twins, and a
    second initialization of the same model gives the very same rows."""
    rows = []
    for _ in range(2):
        model, tokenizer, tags, dataset = model_with_released_tags()
        braces = tokenizer.convert_tokens_to_ids(["{", "}"])
        assert [cold_start.token_pieces(tokenizer, brace) for brace in braces] == [[], []]
        inputs, outputs = model.get_input_embeddings().weight, model.get_output_embeddings().weight
        with torch.no_grad():  # released as twins: one shared row in each matrix
            inputs[braces[1]] = inputs[braces[0]]
            outputs[braces[1]] = outputs[braces[0]]
        assert models.untrained_token_ids(model, braces) == braces

        cold_start.initialize_untrained_rows(model, tokenizer, dataset, [*tags, *braces], method)

        assert models.untrained_token_ids(model, [*tags, *braces]) == []  # no twins left
        spread = inputs.detach().std(dim=0)
        gap = (inputs[braces[0]] - inputs[braces[1]]).detach().abs()
        assert float((gap / spread).mean()) > 0.05, gap  # apart by a share of the rows' spread
        rows.append((inputs[braces].detach().clone(), outputs[braces].detach().clone()))
    assert torch.equal(rows[0][0], rows[1][0]) and torch.equal(rows[0][1], rows[1][1])
