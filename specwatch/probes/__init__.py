"""Diagnosis probes: each says, from files alone, one way an EAGLE-3 draft goes wrong on SGLang.

One probe per module; each exposes `PROBE_ID` and `run(ctx) -> list[Finding]` and knows nothing
of alerts or Slack. `checkpoint.py` reads the draft and target (headers, configs, bounded tensor
samples), `engines/sglang/source.py` reads what the installed SGLang does (with `ast`, never
importing it), `engines/sglang/known_versions.py` is the fallback when no source is available.
`specwatch.diagnosis` runs them all, or, when the draft is the target itself (MTP/NEXTN), `mtp_head.py` alone.
"""

from specwatch.probes.base import ERROR, INFO, SEVERITIES, WARNING, Finding, ProbeContext, ServerSettings

# Fixed probe ids, in the order the report lists them (docs/diagnosis.md).
PROBE_IDS = (
    "config_format",
    "unloaded_weights",
    "shape_mismatch",
    "aux_capture",
    "layer_ids",
    "fc_bypass",
    "d2t_encoding",
    "weight_values",
)

__all__ = ["ERROR", "WARNING", "INFO", "SEVERITIES", "Finding", "ProbeContext", "ServerSettings", "PROBE_IDS"]
