import torch

from grader import inputs


def test_inputs_are_deterministic_per_key_and_seed():
    a = inputs.randn("lab", "part", (64, 32), seed=1)
    b = inputs.randn("lab", "part", (64, 32), seed=1)
    assert torch.equal(a, b)
    assert not torch.equal(a, inputs.randn("lab", "part", (64, 32), seed=2))
    assert not torch.equal(a, inputs.randn("lab", "other", (64, 32), seed=1))
    assert not torch.equal(a, inputs.randn("lab", "part", (64, 32), seed=1, index=1))


def test_inputs_are_never_all_zero_and_have_requested_dtype():
    t = inputs.randn("lab", "part", (1024,), seed=3, dtype=torch.float16)
    assert t.dtype == torch.float16 and t.abs().sum() > 0


def test_poisoned_output_is_nan():
    assert torch.isnan(inputs.poisoned_like(torch.zeros(8))).all()


def test_secret_seed_is_read_once_then_removed(monkeypatch, tmp_path):
    monkeypatch.setattr(inputs, "_secret_read", False)
    monkeypatch.setenv("GRADER_SEED_KEY_FILE", str(tmp_path / "key"))
    monkeypatch.setenv("GRADER_SECRET_SEED", "4242")
    seed = inputs.run_seed()
    assert seed == inputs.derive_secret("4242") and seed != 4242 and seed.bit_length() > 128
    import os
    assert "GRADER_SECRET_SEED" not in os.environ
    assert inputs.run_seed() == seed


def test_public_seed_without_secret(monkeypatch):
    monkeypatch.setattr(inputs, "_secret_read", False)
    monkeypatch.delenv("GRADER_SECRET_SEED", raising=False)
    assert inputs.run_seed() == inputs.PUBLIC_SEED


def test_case_rng_differs_between_parts():
    r1, r2 = inputs.rng("lab", "a", 1), inputs.rng("lab", "b", 1)
    assert [r1.random() for _ in range(3)] != [r2.random() for _ in range(3)]
