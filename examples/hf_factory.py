"""A model factory file: `tensoropt graph examples/hf_factory.py:bert` captures it.

A factory returns ``(model, example_inputs)``; a ``batch`` keyword lets ``--batch`` set the size.
Both models are built from Hugging Face configs (random weights, nothing downloaded); each
factory imports transformers itself, so the file loads without that optional dependency and
the error names the factory that needs it.  It must not download anything.
"""

import torch


class LogitsOnly(torch.nn.Module):
    """Hugging Face models return ModelOutput objects and caches; return the tensor alone."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        out = self.model(input_ids, use_cache=False) if hasattr(self.model.config, "use_cache") \
            else self.model(input_ids)
        return out.logits if hasattr(out, "logits") else out.last_hidden_state


def bert(batch: int = 4, seq_len: int = 64, layers: int = 2, hidden: int = 128):
    from transformers import BertConfig, BertForMaskedLM

    cfg = BertConfig(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=hidden // 64,
                     intermediate_size=4 * hidden, vocab_size=30522, max_position_embeddings=512)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq_len), generator=torch.Generator().manual_seed(0))
    return LogitsOnly(BertForMaskedLM(cfg)), (ids,)


def gpt2(batch: int = 4, seq_len: int = 64, layers: int = 2, hidden: int = 128):
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=layers, n_embd=hidden, n_head=hidden // 64, vocab_size=50257, n_positions=1024)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq_len), generator=torch.Generator().manual_seed(0))
    return LogitsOnly(GPT2LMHeadModel(cfg)), (ids,)
