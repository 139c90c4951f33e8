import pytest
import torch
from torch import nn

from pearl.errors import ConfigError
from pearl.rl.trainer import GRPOTrainer, TrainerConfig, build_batch
from pearl.rl.trajectory import Trajectory

transformers = pytest.importorskip("transformers")

VOCAB = 64
PROMPT = [1, 2, 3, 4]


def tiny_qwen3(seed: int = 0) -> nn.Module:
    cfg = transformers.Qwen3Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   head_dim=16, max_position_embeddings=128, tie_word_embeddings=True)
    torch.manual_seed(seed)
    return transformers.Qwen3ForCausalLM(cfg)


def traj(trainer: GRPOTrainer, i: int, response: list[int], reward: float, group: int = 0,
         env: list[int] | None = None, version: int = 0) -> Trajectory:
    """A finished trajectory whose behaviour log-probs come from the trainer's current model."""
    t = Trajectory(id=f"t{i}", group_id=group, sample_index=i)
    t.append_prompt(PROMPT)
    ids = torch.tensor([PROMPT + response])
    with torch.no_grad():
        lp = trainer.logprobs(ids)[0, len(PROMPT):].tolist()
    t.append_model(response, lp, version)
    if env:
        t.append_env(env)
    t.add_reward(reward)
    t.finish()
    return t


def model_logprob(trainer: GRPOTrainer, t: Trajectory) -> float:
    with torch.no_grad():
        lp = trainer.logprobs(torch.tensor([t.token_ids]))[0]
    return float((lp * torch.tensor(t.loss_mask)).sum())


@pytest.fixture
def trainer() -> GRPOTrainer:
    return GRPOTrainer(tiny_qwen3(), TrainerConfig(lr=3e-3, micro_batch_size=2))


def test_update_raises_logprob_of_positively_advantaged_tokens(trainer):
    good = [traj(trainer, 0, [10, 11, 12], 1.0), traj(trainer, 1, [10, 11, 13], 1.0, env=[5, 6])]
    bad = [traj(trainer, 2, [20, 21, 22], 0.0), traj(trainer, 3, [30, 31], 0.0)]
    batch = good + bad
    before = [model_logprob(trainer, t) for t in batch]
    for step in range(5):
        m = trainer.step(batch)
        assert m["version"] == step + 1 and not m["skipped"]
        assert m["trajectories"] == 4 and m["tokens"] == 11
    after = [model_logprob(trainer, t) for t in batch]
    assert after[0] > before[0] + 0.5 and after[1] > before[1] + 0.5
    assert after[2] < before[2] and after[3] < before[3]
    assert trainer.version == 5
    assert m["clip_fraction"] > 0  # the fixed batch went off-policy: the clip took over
    assert m["staleness_max"] == 4  # measured against the version being updated (4 -> 5)


def test_first_step_metrics_are_on_policy(trainer):
    batch = [traj(trainer, i, [10 + i, 11], float(i % 2)) for i in range(4)]
    m = trainer.step(batch)
    assert m["ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    assert m["clip_fraction"] == 0 and m["kl"] == 0
    assert m["reward_mean"] == 0.5 and m["grad_norm"] > 0
    assert m["staleness_mean"] == 0
    for key in ("loss", "clip_fraction", "ratio_mean", "grad_norm", "kl", "reward_mean", "tokens"):
        assert key in m


def test_micro_batch_size_does_not_change_loss_or_gradient():
    metrics = []
    for mb in (1, 3, 8):
        tr = GRPOTrainer(tiny_qwen3(), TrainerConfig(lr=1e-3, micro_batch_size=mb, max_grad_norm=None))
        batch = [traj(tr, i, [10 + i] * (1 + i % 3), float(i % 3), group=i % 2) for i in range(6)]
        metrics.append(tr.step(batch))
    for m in metrics[1:]:
        assert m["loss"] == pytest.approx(metrics[0]["loss"], rel=1e-4, abs=1e-6)
        assert m["grad_norm"] == pytest.approx(metrics[0]["grad_norm"], rel=1e-4)


def test_failed_trajectories_are_dropped_running_ones_rejected(trainer):
    batch = [traj(trainer, i, [10, 11], float(i % 2)) for i in range(3)]
    broken = Trajectory(id="f", group_id=0)
    broken.append_prompt(PROMPT)
    broken.fail("env gridworld: step timed out after 1 s")
    m = trainer.step(batch + [broken])
    assert m["failed"] == 1 and m["trajectories"] == 3
    running = Trajectory(id="r", group_id=0)
    running.append_prompt(PROMPT)
    with pytest.raises(ValueError, match="still running"):
        trainer.step(batch + [running])
    with pytest.raises(ValueError, match="all failed"):
        trainer.step([broken])


def test_zero_advantage_batch_leaves_weights_and_bumps_version(trainer):
    snap = trainer.state_dict_snapshot()
    m = trainer.step([traj(trainer, i, [10, 11], 1.0) for i in range(3)])
    assert m["tokens_scored"] == 0 and m["grad_norm"] == 0 and m["version"] == 1
    after = trainer.state_dict_snapshot()
    assert all(torch.equal(snap[k], after[k]) for k in snap)


def test_snapshot_is_a_detached_cpu_copy(trainer):
    snap = trainer.state_dict_snapshot()
    state = trainer.model.state_dict()
    assert set(snap) == set(state)
    for k, v in snap.items():
        assert v.device.type == "cpu" and not v.requires_grad
        assert v.data_ptr() != state[k].data_ptr()
    key = next(iter(snap))
    frozen = snap[key].clone()
    trainer.step([traj(trainer, i, [10 + i, 11], float(i)) for i in range(3)])
    assert torch.equal(snap[key], frozen)  # training does not reach into the copy
    fresh = tiny_qwen3(seed=1)
    fresh.load_state_dict(trainer.state_dict_snapshot())  # and engines can load it


def test_kl_to_reference_grows_as_policy_moves():
    tr = GRPOTrainer(tiny_qwen3(), TrainerConfig(lr=3e-3, kl_coef=0.1))
    batch = [traj(tr, i, [10 + i, 11, 12], float(i % 2)) for i in range(4)]
    assert tr.step(batch)["kl"] == pytest.approx(0.0, abs=1e-6)
    for _ in range(3):
        m = tr.step(batch)
    assert m["kl"] > 0
    assert all(not p.requires_grad for p in tr.ref_model.parameters())


def test_plain_module_returning_logits_and_allowed_vocab():
    class Bigram(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(VOCAB, VOCAB)

        def forward(self, ids):
            return self.emb(ids)

    torch.manual_seed(0)
    tr = GRPOTrainer(Bigram(), TrainerConfig(lr=0.1), allowed_token_ids=[10, 11, 12])
    batch = [traj(tr, i, [10 + i], float(i == 0)) for i in range(3)]
    assert sum(batch[0].logprobs) > -1.2  # restricted to 3 actions: about log(1/3)
    for _ in range(3):
        tr.step(batch)
    with torch.no_grad():
        p = torch.softmax(tr.model.emb.weight[PROMPT[-1], [10, 11, 12]], -1)
    assert p[0] > 0.5


def test_build_batch_right_pads():
    t = Trajectory(id="a", group_id=0)
    t.append_prompt([1, 2])
    t.append_model([3], [-0.5], 4)
    t.finish()
    u = Trajectory(id="b", group_id=0)
    u.append_prompt([5])
    u.append_model([6, 7, 8], [-0.1, -0.2, -0.3], 2)
    u.finish()
    b = build_batch([t, u], torch.tensor([1.0, -1.0]), pad_token_id=9)
    assert b.input_ids.tolist() == [[1, 2, 3, 9], [5, 6, 7, 8]]
    assert b.loss_mask.tolist() == [[0, 0, 1, 0], [0, 1, 1, 1]]
    assert b.versions.tolist() == [[-1, -1, 4, -1], [-1, 2, 2, 2]]
    assert b.lengths.tolist() == [3, 4]


@pytest.mark.parametrize("data, match", [
    ({"lr": -1}, "field 'lr' = -1"),
    ({"clip_eps_high": 0.2, "max_is_weight": 1.1}, "max_is_weight"),
    ({"betas": [0.9, 1.5]}, "betas"),
    ({"learning_rate": 1}, "unknown field 'learning_rate'"),
])
def test_trainer_config_errors_are_one_line(data, match):
    with pytest.raises(ConfigError, match=match) as err:
        TrainerConfig.parse(data)
    assert "\n" not in str(err.value)
