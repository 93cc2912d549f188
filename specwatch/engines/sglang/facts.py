"""What specwatch knows about an SGLang install, whatever it was learned from: the facts
interface the probes use (`SGLangFacts`), its records (`DraftRules`, `CaptureSupport`) and the
target layer-id rules. `sglang_source.SourceFacts` reads them from the installed source,
`known_versions.TableFacts` from specwatch's table (its fallback)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

METHOD = "set_eagle3_layers_to_capture"

# Target layer-id rules (what `set_eagle3_layers_to_capture(ids)` turns ids into).
PLUS_ONE = "plus_one"  # capture input of layer id+1 = output of layer id (llama.py)
PLUS_ONE_IF_FIRST_IS_1 = "plus_one_if_first_is_1"  # deepseek_v2.py@0.5.23
AS_IS_IF_MAX_IS_N = "as_is_if_max_is_n"  # gpt_oss.py@0.5.23
AS_IS = "as_is"
UNKNOWN = "unknown"


@dataclass(frozen=True)
class DraftRules:
    """How the installed SGLang builds and loads one EAGLE-3 draft class.

    decoder: `midlayer` (one layer, `model.midlayer.*`) or `layers` (`model.layers.{i}.*`).
    single_layer_only: the constructor raises unless `num_hidden_layers == 1`.
    renames: substring renames applied to every checkpoint name, in order.
    stacked: (param, shard, shard_id) rows of `stacked_params_mapping`.
    skips: substrings whose tensors are not parameters (`d2t` builds hot token ids, `t2d` ignored).
    d2t_offsets: hot ids = d2t + arange(Vd) (offsets) rather than d2t itself.
    prefix: prepended to a name that is not already a parameter name (`model.`).
    fc_aux: `fixed:3` (fc in = 3·Ht) or `config` (`num_aux_hidden_states` → len(eagle_config ids) → 3).
    input_norm / fc_norm: the module exists (built when its flag is set).
    config_keys: config keys the draft module file reads (getattr/get/hasattr).
    input_layer_only_2h: only layer 0 takes cat(embeds, hidden) (2H); later layers take H.
    modelled: this specwatch knows the module's parameter layout (Llama EAGLE-3 drafts).
    """

    cls: str
    file: str
    decoder: str = "layers"
    single_layer_only: bool = False
    renames: tuple[tuple[str, str], ...] = ()
    stacked: tuple[tuple[str, str, object], ...] = ()
    skips: tuple[str, ...] = ("d2t", "t2d")
    d2t_offsets: bool = True
    prefix: str = "model."
    fc_aux: str = "config"
    input_norm: bool = False
    fc_norm: bool = False
    config_keys: frozenset[str] = frozenset()
    input_layer_only_2h: bool = True
    modelled: bool = True


@dataclass(frozen=True)
class CaptureSupport:
    """Whether the target class turns on EAGLE-3 aux hidden-state capture, and how.

    kind: `direct` (sets the layers itself), `delegate` (calls the inner model's method
    unconditionally: AttributeError at startup if the inner lacks it), `delegate_or_raise`
    (checks and raises), `delegate_if_present` (calls it only `if hasattr(...)`: a silent no-op
    when the inner lacks it), `missing` (no method: startup error), `unregistered` (SGLang has
    no such architecture), `unknown`. owner: the class defining the method (maybe a base).
    inner: the wrapped class and its support, for delegating wrappers. id_rule: see module consts.
    """

    arch: str
    kind: str
    owner: str | None = None
    file: str | None = None
    inner: "CaptureSupport | None" = None
    inner_attr: str | None = None
    id_rule: str = UNKNOWN

    @property
    def effective(self) -> "CaptureSupport":
        """The class whose rule decides the captured layers (the innermost delegate)."""
        s = self
        while s.kind in ("delegate", "delegate_or_raise", "delegate_if_present") and s.inner is not None:
            s = s.inner
        return s


def capture_indices(rule: str, layer_ids: list[int] | None, n_layers: int) -> list[int]:
    """Capture positions (input of layer j = HF `hidden_states[j]`) the target will use.

    `layer_ids` None → default `[2, N//2, N-3]` (llama.py@0.4.9…0.5.23). Rules as in the module
    constants; an unknown rule is treated as +1 (the common case).
    """
    if layer_ids is None:
        return [2, n_layers // 2, n_layers - 3]
    ids = list(layer_ids)
    if rule == AS_IS or (rule == PLUS_ONE_IF_FIRST_IS_1 and not (ids and ids[0] == 1)):
        return ids
    if rule == AS_IS_IF_MAX_IS_N and ids and max(ids) == n_layers:
        return ids
    return [v + 1 for v in ids]


def capturable(rule: str, index: int, n_layers: int) -> bool:
    """Whether capture position `index` is ever reached: the layer loop runs j in [0, N)
    (llama.py@0.5.23 `if i in self.layers_to_capture`); GPT-OSS also captures the final state N."""
    return 0 <= index < n_layers or (rule == AS_IS_IF_MAX_IS_N and index == n_layers)


def version_tuple(version: str | None) -> tuple[int, ...]:
    """`0.5.10.post1` → (0, 5, 10); unknown → ()."""
    if not version:
        return ()
    m = re.match(r"(\d+)\.(\d+)\.(\d+)", version)
    return tuple(int(x) for x in m.groups()) if m else ()


class SGLangFacts:
    """The interface probes use. `source` is `source` (read from files) or `table`.

    `notes`: lines for the report (where the facts came from, patterns not found).
    """

    version: str | None = None
    root: Path | None = None
    source: str = "table"

    def __init__(self) -> None:
        self.notes: list[str] = []

    def describe(self) -> str:
        raise NotImplementedError

    def eagle3_draft_classes(self) -> list[str]:
        raise NotImplementedError

    def draft_rules(self, arch: str) -> DraftRules | None:
        raise NotImplementedError

    def is_registered(self, arch: str) -> bool | None:
        raise NotImplementedError

    def capture(self, arch: str) -> CaptureSupport:
        raise NotImplementedError

    def aux_ids_top_level_read(self) -> bool:
        """Whether capture also reads a top-level `eagle_aux_hidden_state_layer_ids`."""
        raise NotImplementedError

    def reads_speculators_config(self) -> bool:
        raise NotImplementedError

    def draft_arch_rewrites(self) -> dict[str, str]:
        raise NotImplementedError

    def has_draft_window_flag(self) -> bool:
        raise NotImplementedError
