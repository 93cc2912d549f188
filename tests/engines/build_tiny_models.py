"""Build the tiny models the real-vLLM tests serve, deterministically, in seconds: run with the
engine venv's Python (it has torch, transformers, tokenizers), never imported by the tests.

    python build_tiny_models.py OUT_DIR

OUT_DIR/target: a `LlamaForCausalLM` (hidden 256, 2 layers, 4 heads / 2 KV heads, vocab 2048,
bf16) whose attention and MLP outputs are zero, so each position's logits depend on its own
token only: `lm_head[v] = embed[cycle⁻¹(v)]` makes the greedy next token `cycle(t)`, a
permutation of 4-cycles that keeps ids below 1024 below 1024 and the others above. Its BPE
tokenizer is trained on a few sentences and padded with added tokens to the 2048 ids.
Drafts, each the faulty part said:

- draft_degraded: the target with the embedding rows of the 2nd and 4th member of every cycle
  random: from the 1st or 3rd member the first drafted token is right and the second wrong, and
  the bonus token brings the next round back to a 1st or 3rd member (per position 1.0, 0, 0).
- draft_live: the target with the embedding rows of ids >= 1024 random: it agrees with the
  target on prompts of ids below 1024 (there it is the target itself: every drafted token is
  accepted) and on none above (one server, 4.00 then 1.00).
- eagle3_nofc: an EAGLE-3 head (`LlamaForCausalLMEagle3`, `midlayer.*`) of random weights whose
  checkpoint lacks `fc.weight`: vLLM's loader keeps the layer at its initial value and says
  nothing (`Eagle3LlamaForCausalLM.load_weights`, vllm/model_executor/models/llama_eagle3.py@0.32.0).

Prints one JSON line: {name: directory}.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

H, LAYERS, HEADS, KV_HEADS, INTER, VOCAB, HALF = 256, 2, 4, 2, 512, 2048, 1024
TEXT = [
    "Speculative decoding drafts a few tokens with a small model and verifies them with the large one.",
    "When the draft agrees with the target, several tokens are accepted in one step.",
    "A draft that was never trained, or that loaded the wrong weights, is rejected at every position.",
    "The monitor reads the server's log and its metrics, and pages the operator when acceptance collapses.",
    "Hello, how are you today? The weather is fine and the model is small.",
] * 20
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def cycle() -> list[int]:
    """next[t]: 4-cycles over a seeded shuffle of each half of the vocabulary."""
    g = torch.Generator().manual_seed(7)
    nxt = [0] * VOCAB
    for lo in (0, HALF):
        ids = (torch.randperm(HALF, generator=g) + lo).tolist()
        for i in range(0, HALF, 4):
            a = ids[i:i + 4]
            for j in range(4):
                nxt[a[j]] = a[(j + 1) % 4]
    return nxt


def tokenizer(out: Path) -> None:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    special = ["<unk>", "<s>", "</s>", "<|user|>", "<|assistant|>", "<|system|>"]
    tok.train_from_iterator(TEXT, trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=special,
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    n = tok.get_vocab_size()
    tok.add_tokens([f"<x{i}>" for i in range(VOCAB - n)])
    assert tok.get_vocab_size() == VOCAB, tok.get_vocab_size()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)


def target(out: Path, nxt: list[int]) -> None:
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=H, intermediate_size=INTER, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                      num_key_value_heads=KV_HEADS, vocab_size=VOCAB, max_position_embeddings=2048,
                      tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, torch_dtype="bfloat16")
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        emb = torch.randn(VOCAB, H)
        model.model.embed_tokens.weight.copy_(emb)
        inv = [0] * VOCAB
        for t, v in enumerate(nxt):
            inv[v] = t
        model.lm_head.weight.copy_(emb[inv])
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    tokenizer(out)


def draft_with_rows(src: Path, out: Path, rows: list[int], seed: int) -> None:
    """A copy of the target whose embedding rows `rows` are random."""
    shutil.copytree(src, out)
    model = LlamaForCausalLM.from_pretrained(out, torch_dtype=torch.bfloat16)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        w = model.model.embed_tokens.weight
        w[rows] = torch.randn(len(rows), H, generator=g).to(w.dtype)
    model.save_pretrained(out, safe_serialization=True)


def eagle3_nofc(out: Path) -> None:
    out.mkdir()
    g = torch.Generator().manual_seed(3)
    hd = H // HEADS

    def r(*shape):
        return (torch.randn(*shape, generator=g) * 0.05).to(torch.bfloat16)

    ones = torch.ones(H, dtype=torch.bfloat16)
    weights = {
        "midlayer.self_attn.q_proj.weight": r(HEADS * hd, 2 * H),
        "midlayer.self_attn.k_proj.weight": r(KV_HEADS * hd, 2 * H),
        "midlayer.self_attn.v_proj.weight": r(KV_HEADS * hd, 2 * H),
        "midlayer.self_attn.o_proj.weight": r(H, HEADS * hd),
        "midlayer.mlp.gate_proj.weight": r(INTER, H),
        "midlayer.mlp.up_proj.weight": r(INTER, H),
        "midlayer.mlp.down_proj.weight": r(H, INTER),
        "midlayer.input_layernorm.weight": ones.clone(),
        "midlayer.hidden_norm.weight": ones.clone(),
        "midlayer.post_attention_layernorm.weight": ones.clone(),
        "norm.weight": ones.clone(),
        "lm_head.weight": r(VOCAB, H),
        # no "fc.weight" [H, 3H]: the fault
    }
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": H,
           "intermediate_size": INTER, "num_hidden_layers": 1, "num_attention_heads": HEADS,
           "num_key_value_heads": KV_HEADS, "vocab_size": VOCAB, "draft_vocab_size": VOCAB,
           "max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "hidden_act": "silu", "torch_dtype": "bfloat16",
           "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2,
           # a 2-layer target: the default (2, L // 2, L - 3) captures only two states
           "eagle_aux_hidden_state_layer_ids": [0, 1, 2]}
    (out / "config.json").write_text(json.dumps(cfg, indent=2))


def main(root: Path) -> dict[str, str]:
    root.mkdir(parents=True, exist_ok=True)
    nxt = cycle()
    t = root / "target"
    target(t, nxt)
    second_fourth = []
    seen = set()
    for a in range(VOCAB):
        if a in seen:
            continue
        c = [a, nxt[a], nxt[nxt[a]], nxt[nxt[nxt[a]]]]
        seen.update(c)
        second_fourth += [c[1], c[3]]
    draft_with_rows(t, root / "draft_degraded", sorted(second_fourth), seed=11)
    draft_with_rows(t, root / "draft_live", list(range(HALF, VOCAB)), seed=12)
    eagle3_nofc(root / "eagle3_nofc")
    return {n: str(root / n) for n in ("target", "draft_degraded", "draft_live", "eagle3_nofc")}


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]))))
