"""weight_values: tensors whose values cannot be trained weights — NaN/Inf, all zero, constant.

Each floating-point tensor is read on a bounded sample (`SAMPLE` values: up to 4 blocks of whole
rows spread over dim 0, so a 7168×21504 fc costs ~65k values, not 154M) and summarised
(mean, std, min, max, zero fraction). NaN/Inf or an all-zero weight matrix → error; a constant
matrix → error; a norm weight that is all 1.0 (RMSNorm's initial value) → warning: it was
probably never trained or never saved. d2t/t2d are integer maps (see d2t_encoding).
"""

from __future__ import annotations

from specwatch.probes.base import ERROR, INFO, WARNING, Finding, ProbeContext, short_list
from specwatch.probes.checkpoint import FLOAT_DTYPES

PROBE_ID = "weight_values"
SAMPLE = 65536


def run(ctx: ProbeContext) -> list[Finding]:
    import numpy as np

    d = ctx.draft
    stats: dict[str, str] = {}
    bad: dict[str, list[str]] = {"nan_inf": [], "all_zero": [], "constant": [], "untrained_norm": [], "zero_bias": []}
    for name, info in sorted(d.tensors.items()):
        if info.dtype not in FLOAT_DTYPES or "d2t" in name or "t2d" in name or info.numel == 0:
            continue
        try:
            x = np.asarray(d.values(name, SAMPLE), dtype=np.float32).reshape(-1)
        except (ValueError, OSError) as e:
            stats[name] = f"not read ({e})"
            continue
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
    }
    for kind, items in bad.items():
        if items:
            sev, title, fix = titles[kind]
            out.append(Finding(PROBE_ID, kind, sev, f"{len(items)} {title}", {"tensors": short_list(items)}, fix))
    out.append(Finding(PROBE_ID, "statistics", INFO, f"value statistics of {len(stats)} tensors "
                       f"(bounded sample of <= {SAMPLE} values each)", stats, ""))
    return out
