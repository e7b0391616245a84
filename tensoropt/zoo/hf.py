"""Hugging Face ``transformers`` models built from configs, with random weights.

``gpt2`` is GPT-2 (Radford et al. 2019; defaults are the 124M "small" model) as
``GPT2LMHeadModel``; ``bert`` is BERT (Devlin et al. 2019; defaults are BERT-base) as
``BertForMaskedLM``.  Both are wrapped so that ``forward(input_ids)`` returns the logits tensor.
``transformers`` is imported only when a model is built (pip extra ``zoo``); nothing is
downloaded.

:func:`from_config` builds any causal / masked language model or image classifier transformers
knows from the fields of a ``config.json`` (the ``hf:PATH`` model spec), on the meta device.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn

from ._base import ZooDependencyError, ZooModel, ZooParamError, check, images, on_meta, tokens
from .moe import dispatch_by_capacity


def _transformers():
    try:
        import transformers
    except ImportError as exc:
        raise ZooDependencyError(
            "this zoo model needs the `transformers` package: pip install -e .[zoo]"
        ) from exc
    return transformers


class Logits(nn.Module):
    """``forward(input_ids)`` -> ``model(input_ids).logits``, without a KV cache."""

    def __init__(self, model: nn.Module, use_cache: bool | None):
        super().__init__()
        self.model = model
        self.kwargs = {} if use_cache is None else {"use_cache": use_cache}

    def forward(self, input_ids):
        return self.model(input_ids, **self.kwargs).logits


class TokenLoss(nn.Module):
    """``forward(input_ids, labels)`` -> every token's cross-entropy, ``(batch, seq_len)`` in
    float32: the logits upcast to float32 and cross-entropy against the next tokens, as
    torchtitan's training step computes its loss; their mean — what tensoropt trains on
    (:func:`~tensoropt.measure.step.training_loss`) — is that loss.  Part of the graph because a
    language model's loss is a large part of its step: at 128,256 tokens of vocabulary the
    float32 logits and their log-softmax outweigh a decoder layer's activations many times.
    Per token, not averaged, so that the loss splits with the batch like every layer before it."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids, labels):
        logits = self.model(input_ids, use_cache=False).logits
        # F.cross_entropy as the two operators it runs (log_softmax, then nll_loss): torch.export keeps
        # cross_entropy_loss whole, and a graph of the whole op hides the float32 logits-sized gradient
        # its nll_loss backward writes beside the log-softmax it saves (2 GiB per 16 x 8,192 tokens... x 8)
        logp = nn.functional.log_softmax(logits.flatten(0, 1).float(), dim=-1)
        per_token = nn.functional.nll_loss(logp, labels.flatten(0, 1), reduction="none")
        return per_token.view(labels.shape)


#: transformers' SDPA attention registered under a name of its own, with no mask builder
#: (:func:`causal_attention`)
CAUSAL_ATTENTION = "sdpa_causal_unpadded"


def causal_attention() -> str:
    """The attention implementation a causal language model of the zoo is built with, registered
    with transformers: its own SDPA attention, called as a training step on an unpadded batch
    calls it — ``scaled_dot_product_attention(..., is_causal=True)``, the KV heads not repeated
    (``enable_gqa``).  transformers' ``"sdpa"`` does that on real tensors, but on fake ones it
    cannot read the position ids to see the batch is unpadded, so it builds a boolean
    ``seq × seq`` mask and repeats the KV heads: tensors a real step never holds (1 GiB of mask
    for Llama-3-8B at 16 × 8192), and a mask every layer reads.  Registered under this name, no
    mask function is called, for real and fake tensors alike."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    AttentionInterface.register(CAUSAL_ATTENTION, sdpa_attention_forward)
    return CAUSAL_ATTENTION


def _check_heads(hidden: int, heads: int) -> None:
    check(hidden % heads == 0, f"hidden ({hidden}) must be divisible by heads ({heads})")


def build_gpt2(*, batch: int = 8, seq_len: int = 512, layers: int = 12, hidden: int = 768,
               heads: int = 12, vocab: int = 50257):
    """GPT-2 language model mapping ``(batch, seq_len)`` ids to ``(batch, seq_len, vocab)``."""
    _check_heads(hidden, heads)
    tf = _transformers()
    config = tf.GPT2Config(n_layer=layers, n_embd=hidden, n_head=heads, vocab_size=vocab,
                           n_positions=max(1024, seq_len), bos_token_id=vocab - 1,
                           eos_token_id=vocab - 1)
    return Logits(tf.GPT2LMHeadModel(config), use_cache=False), tokens(batch, seq_len, vocab)


def build_bert(*, batch: int = 32, seq_len: int = 128, layers: int = 12, hidden: int = 768,
               heads: int = 12, vocab: int = 30522):
    """BERT masked-LM mapping ``(batch, seq_len)`` ids to ``(batch, seq_len, vocab)`` logits;
    the feed-forward size is ``4 * hidden``."""
    _check_heads(hidden, heads)
    tf = _transformers()
    config = tf.BertConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                           num_attention_heads=heads, intermediate_size=4 * hidden,
                           max_position_embeddings=max(512, seq_len), pad_token_id=0)
    return Logits(tf.BertForMaskedLM(config), use_cache=None), tokens(batch, seq_len, vocab)


#: What :func:`from_config` feeds a model: token ids for these auto classes' models, images for those.
_TEXT_TASKS = ("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "MODEL_FOR_MASKED_LM_MAPPING_NAMES")
_VISION_TASKS = ("MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES",)


def _auto_classes(task: str) -> dict[str, tuple[str, ...]]:
    """``{model_type: class names}`` of one of transformers' auto-class tables."""
    from transformers.models.auto import modeling_auto

    table = getattr(modeling_auto, task, {})
    return {model_type: (names,) if isinstance(names, str) else tuple(names) for model_type, names in table.items()}


def _input_kind(architecture: str) -> str | None:
    """``"text"``, ``"vision"`` or None (inputs :func:`from_config` does not know) for a class name."""
    for kind, tasks in (("text", _TEXT_TASKS), ("vision", _VISION_TASKS)):
        if any(architecture in names for task in tasks for names in _auto_classes(task).values()):
            return kind
    return None


def _one_line(exc: BaseException) -> str:
    """``exc`` as one line: its type and its message's lines joined."""
    text = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _architecture(config: Mapping[str, Any], model_type: str) -> str:
    """The class to build: config.json's ``architectures[0]``, else the causal LM or image
    classifier transformers maps ``model_type`` to."""
    listed = config.get("architectures")
    if listed:
        check(isinstance(listed, list) and isinstance(listed[0], str),
              f"architectures must be a list of class names, got {listed!r}")
        return listed[0]
    found = next((names[0] for task in (*_TEXT_TASKS[:1], *_VISION_TASKS)
                  for mt, names in _auto_classes(task).items() if mt == model_type), None)
    if found is None:
        raise ZooParamError(f"model_type {model_type!r} has no causal language model or image classifier in "
                            "transformers, and config.json names no architectures: add \"architectures\": "
                            "[\"…ForCausalLM\"], or write a file.py:factory that builds the model and its inputs")
    return found


def from_config(config: Mapping[str, Any], *, batch: int, seq_len: int | None = None, layers: int | None = None,
                meta: bool = True) -> tuple[nn.Module, tuple]:
    """The Hugging Face model a ``config.json``'s fields describe, with example inputs, both on
    the meta device unless ``meta=False``: ``(batch, seq_len)`` token ids for a causal or masked
    language model, ``(batch, channels, image_size, image_size)`` pixel values (the config's own
    size) for an image classifier.  ``layers`` replaces ``num_hidden_layers``.  A causal language
    model takes ``(input_ids, labels)`` and returns every token's cross-entropy (:class:`TokenLoss`:
    the loss is part of its step); any other is wrapped so that ``forward(inputs)`` returns the
    logits; none keeps a KV cache; the experts of a
    mixture-of-experts model (transformers' experts interface: Mixtral, Qwen-MoE, OLMoE, …) are
    dispatched by capacity (:mod:`tensoropt.zoo.moe`, capacity factor 1).
    Bad fields raise :class:`ZooParamError` naming the cause and the fix; nothing is downloaded.

    >>> model, (ids, labels) = from_config({"model_type": "gpt2", "n_layer": 12}, batch=2, seq_len=128, layers=1)
    >>> ids.shape, labels.shape, type(model).__name__, len(model.model.transformer.h)
    (torch.Size([2, 128]), torch.Size([2, 128]), 'TokenLoss', 1)
    """
    tf = _transformers()
    model_type = config.get("model_type")
    check(isinstance(model_type, str) and bool(model_type),
          "config.json has no model_type: a Hugging Face config names it (\"model_type\": \"llama\")")
    assert isinstance(model_type, str)
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    if model_type not in CONFIG_MAPPING_NAMES:
        raise ZooParamError(f"model_type {model_type!r} is not known to transformers {tf.__version__}: fix "
                            "config.json's model_type, or upgrade transformers")
    architecture = _architecture(config, model_type)
    cls = getattr(tf, architecture, None)
    if not isinstance(cls, type):
        raise ZooParamError(f"architecture {architecture!r} (config.json's architectures) is not a class of "
                            f"transformers {tf.__version__}: upgrade transformers, or fix architectures")
    kind = _input_kind(architecture)
    if kind is None:
        raise ZooParamError(f"architecture {architecture!r} takes inputs hf: specs do not make (token ids for a "
                            "causal or masked language model, pixel values for an image classifier): write a "
                            "file.py:factory that returns the model and its inputs")
    fields = {k: v for k, v in config.items() if k not in ("architectures", "auto_map")}
    try:
        cfg = tf.AutoConfig.for_model(**fields)
    except Exception as exc:  # noqa: BLE001 - transformers' validators raise several kinds
        raise ZooParamError(f"transformers {tf.__version__} rejects config.json: {_one_line(exc)}") from None
    if layers is not None:
        check(hasattr(cfg, "num_hidden_layers"), f"layers: a {model_type} config has no num_hidden_layers to set")
        cfg.num_hidden_layers = layers
        if isinstance(getattr(cfg, "layer_types", None), list):   # one entry per layer (sliding / full …)
            cfg.layer_types = cfg.layer_types[:layers]
    if hasattr(cfg, "use_cache"):
        cfg.use_cache = False
    if architecture in _causal_classes():
        cfg._attn_implementation = causal_attention()
    if kind == "text":
        check(seq_len is not None, f"{architecture} reads token ids: give seq_len=N, the sequence length it "
                                   "trains at (8192 for Llama 3)")
        assert seq_len is not None
        limit = getattr(cfg, "max_position_embeddings", None)
        check(not isinstance(limit, int) or seq_len <= limit,
              f"seq_len {seq_len} exceeds the config's max_position_embeddings ({limit}): lower seq_len, or raise "
              "max_position_embeddings in the file")
        check(isinstance(getattr(cfg, "vocab_size", None), int), "config.json has no vocab_size")
    else:
        check(seq_len is None, f"seq_len is for text models; {architecture} takes images of the config's "
                               "image_size: drop seq_len (edit image_size in the file to change it)")
        size = getattr(cfg, "image_size", None)
        size = size[0] if isinstance(size, (list, tuple)) else size     # (height, width): square inputs
        check(isinstance(size, int), f"config.json gives {architecture} no image_size")
    causal = architecture in _causal_classes()
    try:
        with on_meta(meta):
            model = cls(cfg)
            if kind == "text":
                assert seq_len is not None
                dispatch_by_capacity(model, seq_len)
                inputs = tokens(batch, seq_len, cfg.vocab_size, count=2 if causal else 1)
            else:
                assert isinstance(size, int)
                inputs = images(batch, size, getattr(cfg, "num_channels", 3))
    except (ZooParamError, ZooDependencyError):
        raise
    except Exception as exc:  # noqa: BLE001 - a config transformers accepts but cannot build
        raise ZooParamError(f"transformers cannot build {architecture} from config.json: {_one_line(exc)}") from None
    return (TokenLoss(model) if causal else Logits(model, use_cache=None)), inputs


def layers_of(config: Mapping[str, Any]) -> int | None:
    """The blocks the model of a ``config.json`` stacks (its ``num_hidden_layers``, whatever the
    file calls it: GPT-2's ``n_layer``), ``None`` where transformers reads none from it.

    >>> layers_of({"model_type": "gpt2", "n_layer": 12})
    12
    """
    tf = _transformers()
    fields = {k: v for k, v in config.items() if k not in ("architectures", "auto_map")}
    try:
        cfg = tf.AutoConfig.for_model(**fields)
    except Exception:  # noqa: BLE001 - from_config says what is wrong with the file when it builds the model
        return None
    n = getattr(cfg, "num_hidden_layers", None)
    return n if isinstance(n, int) and not isinstance(n, bool) else None


def _causal_classes() -> set[str]:
    return {name for names in _auto_classes("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES").values() for name in names}


ENTRIES = (
    ZooModel(
        name="gpt2",
        description="GPT-2 small (124M params) causal LM via transformers, 512 tokens",
        build=build_gpt2,
        tiny={"batch": 2, "seq_len": 8, "layers": 2, "hidden": 16, "heads": 2, "vocab": 64},
        source="Radford et al. 2019, GPT-2 small (12 layers, 768 hidden, 12 heads, 50257 vocab); "
               "seq 512 and batch 8 are the zoo's choice",
        requires="transformers",
    ),
    ZooModel(
        name="bert",
        description="BERT-base (110M params) masked LM via transformers, 128 tokens",
        build=build_bert,
        tiny={"batch": 2, "seq_len": 8, "layers": 2, "hidden": 16, "heads": 2, "vocab": 64},
        source="Devlin et al. 2019, BERT-base (12 layers, 768 hidden, 12 heads, 30522 vocab); "
               "seq 128 as BERT pre-training phase 1, batch 32",
        requires="transformers",
    ),
)
