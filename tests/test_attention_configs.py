"""The flash-attention template's default pick by shape (``attention_configs``): the short-key lead and, past it,
the 192-row lead at head dim 64."""

from __future__ import annotations

from tilefuse.lowering import lower
from tilefuse.lowering.builders import KernelSpec
from tilefuse.lowering.templates.attention_configs import SHORT_KEYS, SHORT_OPTIONS

SM90 = {"kind": "cuda", "arch": "sm_90a"}


def _spec(**kw) -> KernelSpec:
    params = {"B": 2, "Hq": 4, "Sq": 256, "Skv": 256, "D": 64, "dtype": "float16", **kw}
    return KernelSpec("flash_attention", tuple(sorted(params.items())), (-1,), (), ())


def test_short_key_runs_lead_with_the_late_store_and_two_q_buffers():
    """Up to ``SHORT_KEYS`` keys the default pick is the first ws seed with ``SHORT_OPTIONS`` (H100, 2026-12-06:
    D 64 at 512 keys 0.88-0.91x cuDNN -> 1.06-1.12x), the plain seeds after it for tuning; past it the plain seed
    leads. A padding mask keeps its key bound on top."""
    plain = lower.default_config(_spec(Sq=8192, Skv=8192), SM90)
    assert plain["ws"] and not any(plain.get(o) for o in SHORT_OPTIONS)
    for Skv in (197, 512, 1024, SHORT_KEYS):
        space = lower.config_space(_spec(Sq=Skv, Skv=Skv, is_causal=Skv == 1024), SM90)
        assert space[0] == {**space[1], **SHORT_OPTIONS} and not space[1].get("late_store"), Skv
    past = lower.default_config(_spec(Sq=SHORT_KEYS + 1, Skv=SHORT_KEYS + 1), SM90)
    assert past["ws"] and not any(past.get(o) for o in SHORT_OPTIONS)
    assert lower.default_config(_spec(D=128), SM90)["double_q"]
    assert not lower.default_config(_spec(D=128, Sq=4096, Skv=4096), SM90).get("double_q")
    masked = lower.default_config(_spec(mask_shape=(2, 1, 1, 256)), SM90)
    assert masked == {**plain, **SHORT_OPTIONS, "bound_keys": True}


def test_long_runs_at_d64_lead_with_192_rows_where_their_rounds_cost_less():
    """Past ``SHORT_KEYS`` at D 64 without a causal mask the 192-row seed leads where its rounds over the SMs cost
    less at ``LONG_ROW_COST`` (the sweep's 2 x 32 heads x 8192 keys: 21 rounds of 192 rows against 32 of 128); SDXL's
    2 x 10 heads x 4096 keys keep 128 rows (4 rounds of 192 against 5 of 128), as do causal runs, D 128 and masks."""
    def lead(**kw):
        return lower.default_config(_spec(**kw), SM90)["block_M"]
    long = {"B": 2, "Hq": 32, "Hkv": 8, "Sq": 8192, "Skv": 8192}
    assert lead(**long) == 192 and lead(B=1, Hq=16, Sq=16384, Skv=16384) == 192
    assert lead(B=2, Hq=10, Sq=4096, Skv=4096) == 128 and lead(B=8, Hq=16, Sq=2048, Skv=2048) == 128
    assert lead(**long, is_causal=True) == lead(**long, D=128) == lead(**long, mask_shape=(2, 1, 1, 8192)) == 128
