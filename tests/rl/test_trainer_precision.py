"""The trainer's scoring of only the loss-masked rows, and its bfloat16 autocast mode."""
import pytest
import torch

from pearl.rl.trainer import GRPOTrainer, TrainerConfig

from tests.rl.test_trainer import VOCAB, model_logprob, tiny_qwen3, traj


@pytest.mark.parametrize("allowed", [None, [5, 10, 11, 12, 20, 21, 22]])
def test_masked_scoring_equals_full_scoring(allowed):
    tr = GRPOTrainer(tiny_qwen3(), TrainerConfig(), allowed_token_ids=allowed)
    torch.manual_seed(1)
    ids = torch.randint(0, VOCAB, (3, 12))
    ids[:, 7:] = torch.tensor([10, 11, 12, 20, 21])
    mask = torch.zeros(3, 12)
    mask[:, 7:] = 1
    mask[2, 10:] = 0  # a shorter row (padding after it)
    with torch.no_grad():
        full = tr.logprobs(ids) * mask
        part = tr.logprobs(ids, mask=mask)
    assert torch.allclose(full, part, atol=1e-6)
    assert (part[mask == 0] == 0).all() and (part[mask == 1] < 0).all()


def test_bfloat16_trainer_learns_and_keeps_float32_master_weights():
    tr = GRPOTrainer(tiny_qwen3(), TrainerConfig(lr=3e-3, micro_batch_size=2, dtype="bfloat16"))
    ref = GRPOTrainer(tiny_qwen3(), TrainerConfig())  # same seed, float32
    batch = [traj(ref, 0, [10, 11, 12], 1.0), traj(ref, 1, [20, 21, 22], 0.0)]
    ids = torch.tensor([batch[0].token_ids])
    mask = torch.tensor([batch[0].loss_mask])
    with torch.no_grad():
        gap = (tr.logprobs(ids, mask=mask) - ref.logprobs(ids, mask=mask)).abs().max()
    assert 0 < gap < 0.05  # bf16 matmuls: close to, but not bit-equal with, float32
    before = model_logprob(ref, batch[0])
    for _ in range(5):
        m = tr.step(batch)
        assert not m["skipped"]
    assert all(p.dtype == torch.float32 for p in tr.model.parameters())
    assert all(s.dtype == torch.float32 for st in tr.optimizer.state.values() for s in st.values()
               if torch.is_tensor(s) and s.numel() > 1)
    assert model_logprob(tr, batch[0]) > before + 0.5


def test_unknown_dtype_is_a_config_error():
    from pearl.errors import ConfigError

    with pytest.raises(ConfigError, match="dtype"):
        TrainerConfig.parse({"dtype": "float16"})


def test_shared_prompt_gives_the_same_loss_and_update_as_full_rows():
    import copy

    base = tiny_qwen3(3)
    shared = GRPOTrainer(copy.deepcopy(base), TrainerConfig(lr=1e-3, micro_batch_size=3))
    full = GRPOTrainer(copy.deepcopy(base), TrainerConfig(lr=1e-3, micro_batch_size=3, share_prompt=False))
    batch = [traj(full, 0, [10, 11, 12], 1.0, group=0), traj(full, 1, [20], 0.0, group=0),
             traj(full, 2, [30, 31], 0.5, group=0, env=[7, 8]), traj(full, 3, [40, 41], 1.0, group=1),
             traj(full, 4, [42, 43, 44, 45], 0.0, group=1)]
    grads = []
    for tr in (shared, full):  # the gradient the update applies (Adam's step would amplify rounding)
        tr.optimizer.step = lambda: None
        tr.optimizer.zero_grad = lambda set_to_none=True: None  # keep the step's gradients to compare
        m = tr.step(batch)
        grads.append((m["loss"], [p.grad for p in tr.params]))
    assert len(shared._micro_batches(batch, [0, 1, 2, 3, 4])) == 2  # one per group
    assert grads[0][0] == pytest.approx(grads[1][0], abs=1e-6)
    for a, b in zip(grads[0][1], grads[1][1]):
        assert torch.allclose(a, b, atol=1e-6)
    ids = torch.tensor([batch[3].token_ids, batch[3].token_ids[:4] + [42, 43]])
    mask = torch.tensor([[0.0] * 4 + [1.0, 1.0]] * 2)
    with torch.no_grad():
        assert torch.allclose(shared.logprobs(ids, mask=mask, shared_prefix=4), shared.logprobs(ids, mask=mask),
                              atol=1e-6)
