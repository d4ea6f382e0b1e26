"""Model shapes shared by the peer benchmarks; the same as brook's `synthetic_config`."""
SHAPES = {
    "llama-2-7b": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                       num_key_value_heads=32, vocab_size=32000, max_position_embeddings=4096, rope_theta=10000.0),
    "tinyllama-1.1b": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
                           num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048, rope_theta=10000.0),
    "llama-3-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                       num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192, rope_theta=500000.0),
}


def random_model(name):
    """Random bf16 weights created directly on the GPU (no checkpoint, ~0.4 s for 7B)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(rms_norm_eps=1e-5, tie_word_embeddings=False, **SHAPES[name])
    with torch.device("cuda"):
        model = LlamaForCausalLM._from_config(cfg, attn_implementation="sdpa", dtype=torch.bfloat16)
    return model.eval()
