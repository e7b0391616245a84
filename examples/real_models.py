"""Real architectures at small sizes: a factory file for tensoropt (the real-architecture suite).

Every function here is a factory ``NAME(batch=2)`` returning ``(model, example_inputs)`` or
``(model, example_inputs, output)``:

- ``model``: the real architecture — Hugging Face models built from their configs (random weights,
  nothing is downloaded) and torchvision models — shrunk to 2 layers, hidden 64–128, 2–4 heads,
  vocabulary ≤ 1000, sequences of 32 tokens, images of 32–64 px.  Models stay in training mode
  with their default dropout and stochastic depth on (stochastic depth is turned on where its
  default is off); the exceptions are commented where they are made.
- Attention: ``attn_implementation="eager"`` where the model's attention dropout is on by
  default and the model is in ``CI_SUBSET`` (BERT, GPT-2 and their wrappers; ALBERT, ELECTRA,
  T5, BEiT too), so that dropout is an ordinary dropout op; ``"sdpa"`` elsewhere — RoBERTa,
  DistilBERT and wav2vec2 keep attention dropout (0.1) inside the fused
  ``scaled_dot_product_attention`` kernel on purpose.
- ``example_inputs``: a tensor, a tuple of positional tensors, or a dict of keyword inputs
  (``{"input_ids": ..., "attention_mask": ...}``; ``decoder_input_ids`` for encoder-decoders).
  Every random input is drawn from ``torch.Generator().manual_seed(0)``: the inputs are the same
  on every call.
- ``output`` (optional): which tensor of the model's output the loss is computed from — a key of
  its dict / ``ModelOutput`` (``"logits"``, ``"last_hidden_state"``) or an index into its tuple.
  Without it the capture picks ``loss``, ``logits``, ``last_hidden_state``, then the first
  floating-point tensor.

Each factory imports its library inside itself, on purpose: transformers is optional
(``pip install -e .[zoo]``), torchvision comes from a private folder (below), and loading this
file for one factory should not import both.  The file owns the factories only: it must not
download weights nor change a model beyond the sizes and switches described above.

``SUITE`` maps every name to its factory (stable order); ``CI_SUBSET`` names the fast ones that
still cover every family (encoder-decoder, RoPE + grouped-query attention, window attention,
batch norm + in-place ReLU, stochastic depth, ``*args`` wrappers, a final LayerNorm, ...).

Use::

    tensoropt graph examples/real_models.py:llama
    python benchmarks/real_models.py --ci            # capture → profile → frontier → run → check

torchvision: the registry's torchvision wheel is a CUDA build whose package ``__init__`` fails to
import on a CPU-only torch (``operator torchvision::nms does not exist``), but its model
definitions are plain torch.  The torchvision factories import ``torchvision.models`` from a
private folder (never installed into the environment) — install it once with::

    pip install --no-deps --target ~/.cache/tensoropt/torchvision torchvision==0.28.0 pillow

(``TENSOROPT_TORCHVISION_DIR`` names another folder).  torchvision is imported only inside the
torchvision factories; the other factories need only torch and transformers.
"""

from __future__ import annotations

import importlib.machinery
import os
import sys
import types

import torch
from torch import nn

SEQ = 32
VOCAB = 1000
TORCHVISION_PIP = "pip install --no-deps --target ~/.cache/tensoropt/torchvision torchvision==0.28.0 pillow"


# --------------------------------------------------------------------------------- inputs

def _gen() -> torch.Generator:
    return torch.Generator().manual_seed(0)


def _ids(batch: int, seq: int = SEQ, vocab: int = VOCAB, low: int = 4) -> torch.Tensor:
    """Token ids in [low, vocab): clear of the special ids (pad / bos / eos are below 4 in the
    configs here)."""
    return torch.randint(low, vocab, (batch, seq), generator=_gen())


def _mask(batch: int, seq: int = SEQ) -> torch.Tensor:
    """An attention mask with padding: row i has its last 4·i positions masked (row 0 none)."""
    mask = torch.ones(batch, seq, dtype=torch.long)
    for i in range(1, batch):
        mask[i, seq - min(4 * i, seq - 1):] = 0
    return mask


def _text(batch: int, *, mask: bool = True, token_types: bool = False) -> dict[str, torch.Tensor]:
    out = {"input_ids": _ids(batch)}
    if mask:
        out["attention_mask"] = _mask(batch)
    if token_types:
        tt = torch.zeros(batch, SEQ, dtype=torch.long)
        tt[:, SEQ // 2:] = 1
        out["token_type_ids"] = tt
    return out


def _image(batch: int, size: int, channels: int = 3) -> torch.Tensor:
    return torch.randn(batch, channels, size, size, generator=_gen())


# --------------------------------------------------------------------------------- torchvision

def torchvision_models() -> types.ModuleType:
    """``torchvision.models`` imported from the private folder (``$TENSOROPT_TORCHVISION_DIR``,
    default ``~/.cache/tensoropt/torchvision``) through a stub ``torchvision`` package, so that
    the package ``__init__`` (which needs torchvision's compiled ops) never runs.  Raises
    ``ImportError`` with the pip command when the folder is absent."""
    folder = os.path.expanduser(os.environ.get("TENSOROPT_TORCHVISION_DIR", "~/.cache/tensoropt/torchvision"))
    pkg = os.path.join(folder, "torchvision")
    if not os.path.isfile(os.path.join(pkg, "models", "__init__.py")):
        raise ImportError(f"torchvision's model definitions are not in {folder}: install them there (not into "
                          f"the environment) with\n    {TORCHVISION_PIP}\nor point TENSOROPT_TORCHVISION_DIR "
                          "at a folder holding them")
    loaded = sys.modules.get("torchvision")
    if loaded is None or list(getattr(loaded, "__path__", [])) != [pkg]:
        stub = types.ModuleType("torchvision")
        stub.__path__ = [pkg]
        stub.__file__ = os.path.join(pkg, "__init__.py")
        # a spec, as every imported module has one: importlib.util.find_spec("torchvision") (how
        # transformers asks whether torchvision is there) raises on a module without it
        stub.__spec__ = importlib.machinery.ModuleSpec("torchvision", None, is_package=True)
        stub.__spec__.submodule_search_locations = [pkg]
        stub.__version__ = "0.28.0 (model definitions only)"
        sys.modules["torchvision"] = stub
        for name in [n for n in sys.modules if n.startswith("torchvision.")]:
            del sys.modules[name]
    # torchvision.utils imports PIL, installed beside it: the folder is on the path for that import
    # only.  Left there, it reached every process started afterwards (multiprocessing hands a child
    # its parent's sys.path) without the stub, where transformers then found the real torchvision
    # package and failed importing its compiled ops (LlamaConfig: "operator torchvision::nms does
    # not exist").
    added = folder not in sys.path
    if added:
        sys.path.append(folder)
    try:
        import torchvision.models
    finally:
        if added:
            sys.path.remove(folder)
    return torchvision.models


def torchvision_available() -> bool:
    """Whether the private torchvision folder is there (see :func:`torchvision_models`)."""
    folder = os.path.expanduser(os.environ.get("TENSOROPT_TORCHVISION_DIR", "~/.cache/tensoropt/torchvision"))
    return os.path.isfile(os.path.join(folder, "torchvision", "models", "__init__.py"))


# --------------------------------------------------------------------------------- wrappers

class ArgsWrapper(nn.Module):
    """How people wrap a Hugging Face model: ``forward(*args)`` passes everything on and returns
    the ``ModelOutput`` as it is."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, *args):
        return self.model(*args)


class KwargsWrapper(nn.Module):
    """The other common wrapper: ``forward(input_ids, **kwargs)``; returns the ``ModelOutput``."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids, **kwargs):
        return self.model(input_ids=input_ids, **kwargs)


# --------------------------------------------------------------------------------- encoders (text)

def bert(batch: int = 2):
    """BERT with its masked-LM head; padded attention mask and token types.  Eager attention: its
    attention dropout (0.1) is an ordinary dropout op (under "sdpa" it is drawn inside the fused
    kernel; RoBERTa, DistilBERT and wav2vec2 keep that path)."""
    from transformers import BertConfig, BertForMaskedLM

    cfg = BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=256, max_position_embeddings=64, attn_implementation="eager")
    return BertForMaskedLM(cfg), _text(batch, token_types=True), "logits"


def roberta(batch: int = 2):
    """RoBERTa (position ids from the padding: ``cumsum`` of the non-pad mask) with the MLM head."""
    from transformers import RobertaConfig, RobertaForMaskedLM

    cfg = RobertaConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=256, max_position_embeddings=SEQ + 4, pad_token_id=1,
                        attn_implementation="sdpa")
    return RobertaForMaskedLM(cfg), _text(batch), "logits"


def albert(batch: int = 2):
    """ALBERT: factorized embeddings (32 → 64) and one layer's weights shared by both layers."""
    from transformers import AlbertConfig, AlbertForMaskedLM

    cfg = AlbertConfig(vocab_size=VOCAB, embedding_size=32, hidden_size=64, num_hidden_layers=2,
                       num_attention_heads=4, intermediate_size=256, max_position_embeddings=64,
                       attn_implementation="eager")
    return AlbertForMaskedLM(cfg), _text(batch), "logits"


def electra(batch: int = 2):
    """ELECTRA's discriminator (replaced-token detection: one logit per token)."""
    from transformers import ElectraConfig, ElectraForPreTraining

    cfg = ElectraConfig(vocab_size=VOCAB, embedding_size=32, hidden_size=64, num_hidden_layers=2,
                        num_attention_heads=4, intermediate_size=256, max_position_embeddings=64,
                        attn_implementation="eager")
    return ElectraForPreTraining(cfg), _text(batch), "logits"


def distilbert(batch: int = 2):
    """DistilBERT with a sequence-classification head (pre-classifier + ReLU + dropout)."""
    from transformers import DistilBertConfig, DistilBertForSequenceClassification

    cfg = DistilBertConfig(vocab_size=VOCAB, dim=64, n_layers=2, n_heads=4, hidden_dim=256,
                           max_position_embeddings=64, num_labels=4, attn_implementation="sdpa")
    return DistilBertForSequenceClassification(cfg), _text(batch), "logits"


def clip_text(batch: int = 2):
    """CLIP's text tower: causal mask, final LayerNorm, the pooled EOS token (argmax gather)."""
    from transformers import CLIPTextConfig, CLIPTextModel

    cfg = CLIPTextConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, max_position_embeddings=SEQ, pad_token_id=1, bos_token_id=2,
                         eos_token_id=3, attn_implementation="sdpa")
    ids = _ids(batch)
    ids[:, -1] = cfg.eos_token_id
    return CLIPTextModel(cfg), {"input_ids": ids}, "pooler_output"


# --------------------------------------------------------------------------------- decoders

def gpt2(batch: int = 2):
    """GPT-2 LM (Conv1D projections, tied embedding / LM head); eager attention (its attention
    dropout 0.1 an ordinary dropout op)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=64, n_layer=2, n_head=4, bos_token_id=2,
                     eos_token_id=3, use_cache=False, attn_implementation="eager")
    return GPT2LMHeadModel(cfg), {"input_ids": _ids(batch)}, "logits"


def opt(batch: int = 2):
    """OPT causal LM (learned positions offset by 2, ReLU MLP)."""
    from transformers import OPTConfig, OPTForCausalLM

    cfg = OPTConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, ffn_dim=256, num_attention_heads=4,
                    max_position_embeddings=64, word_embed_proj_dim=64, use_cache=False,
                    attn_implementation="sdpa")
    return OPTForCausalLM(cfg), {"input_ids": _ids(batch)}, "logits"


def gpt_neox(batch: int = 2):
    """GPT-NeoX: partial rotary embeddings (25 % of each head), parallel attention + MLP."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    cfg = GPTNeoXConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=256, max_position_embeddings=64, rotary_pct=0.25, use_cache=False,
                        attn_implementation="sdpa")
    return GPTNeoXForCausalLM(cfg), {"input_ids": _ids(batch)}, "logits"


def falcon(batch: int = 2):
    """Falcon: multi-query attention (one key/value head), parallel attention, rotary."""
    from transformers import FalconConfig, FalconForCausalLM

    cfg = FalconConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                       multi_query=True, parallel_attn=True, alibi=False, new_decoder_architecture=False,
                       use_cache=False, attn_implementation="sdpa")
    return FalconForCausalLM(cfg), {"input_ids": _ids(batch)}, "logits"


def phi(batch: int = 2):
    """Phi: partial rotary (half of each head), parallel attention + MLP, biased LM head."""
    from transformers import PhiConfig, PhiForCausalLM

    cfg = PhiConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=256, num_hidden_layers=2,
                    num_attention_heads=4, max_position_embeddings=64, partial_rotary_factor=0.5,
                    use_cache=False, attn_implementation="sdpa")
    return PhiForCausalLM(cfg), {"input_ids": _ids(batch)}, "logits"


def llama(batch: int = 2):
    """Llama: RoPE, RMSNorm, SwiGLU and grouped-query attention (4 query heads, 2 key/value heads)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      use_cache=False, attn_implementation="sdpa")
    return LlamaForCausalLM(cfg), {"input_ids": _ids(batch)}, "logits"


def mistral(batch: int = 2):
    """Mistral: Llama with a sliding attention window (16 of the 32 tokens) and GQA."""
    from transformers import MistralConfig, MistralForCausalLM

    cfg = MistralConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                        sliding_window=16, use_cache=False, attn_implementation="sdpa")
    return MistralForCausalLM(cfg), {"input_ids": _ids(batch)}, "logits"


def qwen2(batch: int = 2):
    """Qwen2: RoPE, GQA (4 query / 2 key-value heads), biased q/k/v projections."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      use_cache=False, attn_implementation="sdpa")
    return Qwen2ForCausalLM(cfg), {"input_ids": _ids(batch)}, "logits"


def gemma(batch: int = 2):
    """Gemma: multi-query attention, GeGLU, (1 + w) RMSNorm, embeddings scaled by √hidden."""
    from transformers import GemmaConfig, GemmaForCausalLM

    cfg = GemmaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=1, head_dim=16, max_position_embeddings=64,
                      use_cache=False, attn_implementation="sdpa")
    return GemmaForCausalLM(cfg), {"input_ids": _ids(batch)}, "logits"


# --------------------------------------------------------------------------------- encoder-decoders

def t5(batch: int = 2):
    """T5 encoder-decoder (relative position buckets, RMS LayerNorm, cross-attention) with its
    LM head; the decoder is fed ``decoder_input_ids`` (16 tokens)."""
    from transformers import T5Config, T5ForConditionalGeneration

    cfg = T5Config(vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2,
                   num_heads=4, relative_attention_num_buckets=16, use_cache=False, attn_implementation="eager")
    inputs = _text(batch)
    inputs["decoder_input_ids"] = torch.randint(4, VOCAB, (batch, SEQ // 2), generator=torch.Generator().manual_seed(1))
    return T5ForConditionalGeneration(cfg), inputs, "logits"


def bart(batch: int = 2):
    """BART encoder-decoder with its LM head; ``decoder_input_ids`` given (16 tokens)."""
    from transformers import BartConfig, BartForConditionalGeneration

    cfg = BartConfig(vocab_size=VOCAB, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                     decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
                     max_position_embeddings=64, use_cache=False, attn_implementation="sdpa")
    inputs = _text(batch)
    inputs["decoder_input_ids"] = torch.randint(4, VOCAB, (batch, SEQ // 2), generator=torch.Generator().manual_seed(1))
    return BartForConditionalGeneration(cfg), inputs, "logits"


# --------------------------------------------------------------------------------- audio

def whisper_encoder(batch: int = 2):
    """Whisper's encoder: two 1-D convs (the second strided) over 16 mel bins × 64 frames, sinusoidal
    positions, pre-norm layers; its output ends in a LayerNorm."""
    from transformers import WhisperConfig
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    cfg = WhisperConfig(vocab_size=VOCAB, num_mel_bins=16, encoder_layers=2, encoder_attention_heads=4,
                        decoder_layers=2, decoder_attention_heads=4, encoder_ffn_dim=256, decoder_ffn_dim=256,
                        d_model=64, max_source_positions=SEQ, max_target_positions=SEQ, pad_token_id=1, bos_token_id=2,
                        eos_token_id=3, decoder_start_token_id=2, begin_suppress_tokens=None, use_cache=False,
                        attn_implementation="sdpa")
    feats = torch.randn(batch, cfg.num_mel_bins, 2 * cfg.max_source_positions, generator=_gen())
    return WhisperEncoder(cfg), {"input_features": feats}, "last_hidden_state"


def wav2vec2(batch: int = 2):
    """wav2vec2 with a CTC head: a 3-conv feature encoder (group norm) over 1600 raw samples,
    a grouped positional convolution (weight norm), 2 post-norm transformer layers."""
    from transformers import Wav2Vec2Config, Wav2Vec2ForCTC

    cfg = Wav2Vec2Config(vocab_size=32, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=256, conv_dim=(32, 32, 32), conv_stride=(5, 4, 2), conv_kernel=(10, 8, 4),
                         num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4,
                         # LayerDrop skips a whole layer when torch.rand([]) < layerdrop: a Python branch
                         # on a random tensor, which torch.export cannot capture (data-dependent guard)
                         layerdrop=0.0,
                         # SpecAugment draws its time mask with numpy during the forward: the capture
                         # would freeze one mask as a constant, and it needs > mask_time_length frames
                         apply_spec_augment=False,
                         attn_implementation="sdpa")
    audio = torch.randn(batch, 1600, generator=_gen())
    return Wav2Vec2ForCTC(cfg), {"input_values": audio}, "logits"


# --------------------------------------------------------------------------------- vision (HF)

def vit(batch: int = 2):
    """ViT classifier: 8×8 patches of a 32 px image, CLS token, learned positions."""
    from transformers import ViTConfig, ViTForImageClassification

    cfg = ViTConfig(image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=256, num_labels=10, attn_implementation="sdpa")
    return ViTForImageClassification(cfg), {"pixel_values": _image(batch, 32)}, "logits"


def deit(batch: int = 2):
    """DeiT with its distillation token (classifier and distillation heads averaged)."""
    from transformers import DeiTConfig, DeiTForImageClassificationWithTeacher

    cfg = DeiTConfig(image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=256, num_labels=10, attn_implementation="sdpa")
    return DeiTForImageClassificationWithTeacher(cfg), {"pixel_values": _image(batch, 32)}, "logits"


def beit(batch: int = 2):
    """BEiT: relative position bias per layer, layer scale, mean pooling; stochastic depth
    (drop_path_rate 0.1, its default) is on."""
    from transformers import BeitConfig, BeitForImageClassification

    cfg = BeitConfig(vocab_size=VOCAB, image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=2,
                     num_attention_heads=4, intermediate_size=256, num_labels=10, use_relative_position_bias=True,
                     drop_path_rate=0.1, attn_implementation="eager")
    return BeitForImageClassification(cfg), {"pixel_values": _image(batch, 32)}, "logits"


def swin(batch: int = 2):
    """Swin (HF): shifted 4×4 windows (roll + window partition + attention mask), patch merging;
    stochastic depth 0.1 (its default)."""
    from transformers import SwinConfig, SwinForImageClassification

    cfg = SwinConfig(image_size=32, patch_size=2, embed_dim=32, depths=[2, 2], num_heads=[2, 4], window_size=4,
                     drop_path_rate=0.1, num_labels=10)
    return SwinForImageClassification(cfg), {"pixel_values": _image(batch, 32)}, "logits"


def convnext(batch: int = 2):
    """ConvNeXt (HF): 7×7 depthwise convs, channels-last LayerNorm, layer scale; stochastic
    depth on (drop_path_rate 0.1)."""
    from transformers import ConvNextConfig, ConvNextForImageClassification

    cfg = ConvNextConfig(num_channels=3, patch_size=4, hidden_sizes=[32, 64], depths=[2, 2], num_stages=2,
                         drop_path_rate=0.1, num_labels=10)
    return ConvNextForImageClassification(cfg), {"pixel_values": _image(batch, 32)}, "logits"


def resnet(batch: int = 2):
    """HF ResNet (basic blocks, batch norm, ReLU) on 32 px."""
    from transformers import ResNetConfig, ResNetForImageClassification

    cfg = ResNetConfig(num_channels=3, embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="basic",
                       num_labels=10)
    return ResNetForImageClassification(cfg), {"pixel_values": _image(batch, 32)}, "logits"


def mobilenet_v2(batch: int = 2):
    """HF MobileNetV2 (depth multiplier 0.35, TensorFlow "same" padding, ReLU6) on 32 px."""
    from transformers import MobileNetV2Config, MobileNetV2ForImageClassification

    cfg = MobileNetV2Config(num_channels=3, image_size=32, depth_multiplier=0.35, num_labels=10)
    return MobileNetV2ForImageClassification(cfg), {"pixel_values": _image(batch, 32)}, "logits"


# --------------------------------------------------------------------------------- vision (torchvision)

def tv_resnet18(batch: int = 2):
    """torchvision ResNet-18 (batch norm, in-place ReLU, 10 classes) on 64 px.  Not 32 px: its last
    stage would be 1×1, every batch norm there normalising 2 values a channel, whose gradients are
    rounding noise amplified ~1e9 (no check can tell a plan's from the model's)."""
    tvm = torchvision_models()
    return tvm.resnet18(num_classes=10), _image(batch, 64)


def tv_mobilenet_v2(batch: int = 2):
    """torchvision MobileNetV2 (width 0.35, ReLU6, dropout 0.2 before the classifier) on 64 px (not
    32: see :func:`tv_resnet18`)."""
    tvm = torchvision_models()
    return tvm.mobilenet_v2(num_classes=10, width_mult=0.35), _image(batch, 64)


def tv_efficientnet_b0(batch: int = 2):
    """torchvision EfficientNet-B0's 7 MBConv stages (squeeze-excitation, SiLU) at width 0.25 and one
    block a stage, stochastic depth 0.2 (its default), on 64 px."""
    torchvision_models()
    from torchvision.models.efficientnet import EfficientNet, _efficientnet_conf

    setting, last_channel = _efficientnet_conf("efficientnet_b0", width_mult=0.25, depth_mult=0.25)
    model = EfficientNet(setting, dropout=0.2, stochastic_depth_prob=0.2, num_classes=10, last_channel=last_channel)
    return model, _image(batch, 64)


def tv_convnext(batch: int = 2):
    """torchvision ConvNeXt-tiny's structure sized down (channels 16/32/64, 1-2 blocks a stage),
    stochastic depth 0.1, on 32 px."""
    torchvision_models()
    from torchvision.models.convnext import CNBlockConfig, ConvNeXt

    setting = [CNBlockConfig(16, 32, 1), CNBlockConfig(32, 64, 2), CNBlockConfig(64, None, 1)]
    return ConvNeXt(setting, stochastic_depth_prob=0.1, num_classes=10), _image(batch, 32)


def tv_swin_t(batch: int = 2):
    """torchvision Swin-T's structure sized down: 2×2 patches, 4×4 shifted windows, embed 32,
    depths (2, 2), heads (2, 4), stochastic depth 0.1, on 32 px."""
    torchvision_models()
    from torchvision.models.swin_transformer import SwinTransformer

    model = SwinTransformer(patch_size=[2, 2], embed_dim=32, depths=[2, 2], num_heads=[2, 4], window_size=[4, 4],
                            stochastic_depth_prob=0.1, num_classes=10)
    return model, _image(batch, 32)


# --------------------------------------------------------------------------------- wrapped HF models

def bert_args_wrapper(batch: int = 2):
    """BERT (base model) inside ``ArgsWrapper.forward(*args)``: positional (input_ids,
    attention_mask, token_type_ids); returns BERT's ``ModelOutput`` (last hidden state + pooler)."""
    from transformers import BertConfig, BertModel

    cfg = BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=256, max_position_embeddings=64, attn_implementation="eager")
    t = _text(batch, token_types=True)
    return ArgsWrapper(BertModel(cfg)), (t["input_ids"], t["attention_mask"], t["token_type_ids"]), \
        "last_hidden_state"


def gpt2_kwargs_wrapper(batch: int = 2):
    """GPT-2 LM inside ``KwargsWrapper.forward(input_ids, **kwargs)``, called with input_ids and a
    padded attention_mask."""
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=64, n_layer=2, n_head=4, bos_token_id=2,
                     eos_token_id=3, use_cache=False, attn_implementation="eager")
    return KwargsWrapper(GPT2LMHeadModel(cfg)), _text(batch), "logits"


# --------------------------------------------------------------------------------- the suite

SUITE = {
    # text encoders
    "bert": bert, "roberta": roberta, "albert": albert, "electra": electra, "distilbert": distilbert,
    "clip_text": clip_text,
    # decoders
    "gpt2": gpt2, "opt": opt, "gpt_neox": gpt_neox, "falcon": falcon, "phi": phi, "llama": llama,
    "mistral": mistral, "qwen2": qwen2, "gemma": gemma,
    # encoder-decoders
    "t5": t5, "bart": bart,
    # audio
    "whisper_encoder": whisper_encoder, "wav2vec2": wav2vec2,
    # vision (Hugging Face)
    "vit": vit, "deit": deit, "beit": beit, "swin": swin, "convnext": convnext, "resnet": resnet,
    "mobilenet_v2": mobilenet_v2,
    # vision (torchvision)
    "tv_resnet18": tv_resnet18, "tv_mobilenet_v2": tv_mobilenet_v2, "tv_efficientnet_b0": tv_efficientnet_b0,
    "tv_convnext": tv_convnext, "tv_swin_t": tv_swin_t,
    # wrapped
    "bert_args_wrapper": bert_args_wrapper, "gpt2_kwargs_wrapper": gpt2_kwargs_wrapper,
}

TORCHVISION = ("tv_resnet18", "tv_mobilenet_v2", "tv_efficientnet_b0", "tv_convnext", "tv_swin_t")

CI_SUBSET = (
    "bert",               # text encoder, padded mask, token types
    "gpt2",               # decoder, tied LM head
    "llama",              # RoPE + grouped-query attention
    "t5",                 # encoder-decoder with decoder_input_ids
    "whisper_encoder",    # output ends in a LayerNorm
    "vit",                # patch embedding + CLS token
    "swin",               # HF window attention
    "tv_resnet18",        # batch norm + in-place ReLU
    "tv_mobilenet_v2",    # depthwise convs, ReLU6, batch norm
    "tv_convnext",        # stochastic depth, layer scale
    "bert_args_wrapper",  # forward(*args) returning a ModelOutput
    "gpt2_kwargs_wrapper",  # forward(input_ids, **kwargs)
    "bart",               # a second encoder-decoder, SDPA attention
)
