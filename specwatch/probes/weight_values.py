"""weight_values: tensors whose values cannot be trained weights — NaN/Inf, all zero, constant.

Each floating-point tensor is read on a bounded sample (`SAMPLE` values: up to 4 blocks of whole
rows spread over dim 0, so a 7168×21504 fc costs ~65k values, not 154M) and summarised
(mean, std, min, max, zero fraction). NaN/Inf or an all-zero weight matrix → error; a constant
matrix → error; a norm weight that is all 1.0 (RMSNorm's initial value) → warning: it was
probably never trained or never saved. Integer and bool buffers are checked the same way: one
that still holds a constructor's value (all zeros, all True, `arange`) → warning; d2t/t2d, whose
right values depend on the vocab sizes, are d2t_encoding's. Nothing is judged when the weights
were not all read (`not_checked`).
"""

from __future__ import annotations

from specwatch.probes.base import ERROR, INFO, WARNING, Finding, ProbeContext, short_list, weights_not_checked
from specwatch.probes.checkpoint import FLOAT_DTYPES

PROBE_ID = "weight_values"
SAMPLE = 65536


def initial_value(x) -> str | None:
    """The initial value an integer/bool buffer (1-D numpy array, read whole) still holds:
    `all zeros`, `all False`, `all True`, `all N`, `arange` (x[i] == i) or `True exactly at ids
    0..K-1` (an identity mask); None when it holds anything else or has < 2 entries."""
    import numpy as np

    if x.size < 2:
        return None
    if x.dtype == bool:
        k = int(x.sum())
        if k in (0, x.size):
            return f"all {bool(k)}"
        return f"True exactly at ids 0..{k - 1}" if x[:k].all() else None
    if x.min() == x.max():
        return "all zeros" if x[0] == 0 else f"all {x[0]}"
    return "arange" if np.array_equal(x, np.arange(x.size)) else None


def run(ctx: ProbeContext) -> list[Finding]:
    import numpy as np

    d = ctx.draft
    skipped = weights_not_checked(PROBE_ID, ctx, "weight values")
    if skipped is not None:
        return [skipped]
    stats: dict[str, str] = {}
    bad: dict[str, list[str]] = {"nan_inf": [], "all_zero": [], "constant": [], "untrained_norm": [], "zero_bias": [],
                                 "initial_buffer": []}
    for name, info in sorted(d.tensors.items()):
        if "d2t" in name or "t2d" in name or info.numel == 0:
            continue
        try:
            x = np.asarray(d.values(name, SAMPLE)).reshape(-1)
        except (ValueError, OSError) as e:
            stats[name] = f"not read ({e})"
            continue
        if info.dtype not in FLOAT_DTYPES:  # an integer/bool buffer
            stats[name] = f"{info.dtype} n={x.size} min={x.min()} max={x.max()}"
            init = initial_value(x) if x.size == info.numel else None
            if init is not None:
                bad["initial_buffer"].append(f"{name}: {init}")
            continue
        x = x.astype(np.float32)
        finite = np.isfinite(x)
        n_bad = int(x.size - finite.sum())
        y = x[finite]
        stats[name] = (f"n={x.size} mean={y.mean():.4g} std={y.std():.4g} min={y.min():.4g} max={y.max():.4g} "
                       f"zeros={np.mean(y == 0):.0%}" if y.size else f"n={x.size} all non-finite")
        is_norm = info.name.endswith(".weight") and len(info.shape) == 1 and "norm" in name
        if n_bad:
            bad["nan_inf"].append(f"{name}: {n_bad} of {x.size} sampled values are NaN/Inf")
        elif not np.any(y):
            bad["zero_bias" if name.endswith(".bias") else "all_zero"].append(name)
        elif y.size > 1 and float(y.min()) == float(y.max()):
            bad["untrained_norm" if is_norm and float(y[0]) == 1.0 else "constant"].append(f"{name} = {float(y[0]):g}")
    out: list[Finding] = []
    titles = {
        "nan_inf": (ERROR, "NaN/Inf values in the weights", "Re-export from a healthy training checkpoint."),
        "all_zero": (ERROR, "weight tensors that are all zero", "Re-export: these tensors were never written."),
        "constant": (ERROR, "weight tensors holding one constant value", "Re-export: these are not trained weights."),
        "untrained_norm": (WARNING, "norm weights all 1.0 (RMSNorm's initial value)",
                           "Check that the trainer saved the trained norms."),
        "zero_bias": (WARNING, "biases that are all zero", "Harmless if the model was trained without bias."),
        "initial_buffer": (WARNING, "integer/bool buffers holding a constructor's initial value",
                           "Check that the trainer filled these buffers before saving."),
    }
    for kind, items in bad.items():
        if items:
            sev, title, fix = titles[kind]
            out.append(Finding(PROBE_ID, kind, sev, f"{len(items)} {title}", {"tensors": short_list(items)}, fix))
    out.append(Finding(PROBE_ID, "statistics", INFO, f"value statistics of {len(stats)} tensors "
                       f"(bounded sample of <= {SAMPLE} values each)", stats, ""))
    return out
