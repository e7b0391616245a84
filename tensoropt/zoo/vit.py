"""Vision Transformer at the size people train it, built on the meta device.

``vit-h-14`` is ViT-Huge with 14 x 14 patches (Dosovitskiy et al. 2021, "An Image is Worth 16x16
Words", Table 1: hidden 1280, 32 layers, 16 heads, MLP 5120; 632M parameters) as Hugging Face's
``ViTForImageClassification``: a class token, learned position embeddings, pre-norm blocks and
one linear head on the class token (the paper's fine-tuning head; pre-training used an MLP with
one hidden layer).  ``forward(pixel_values)`` returns the logits.  Built on the meta device by
default (``meta=True``); ``?tiny=1`` is a small model with real weights.

Example::

    >>> model, (x,) = build_vit_h_14(layers=2)
    >>> x.shape, x.device.type
    (torch.Size([4096, 3, 224, 224]), 'meta')
"""

from __future__ import annotations

from ._base import ZooModel, check, images, on_meta
from .hf import Logits, _transformers


def build_vit_h_14(*, batch: int = 4096, image_size: int = 224, layers: int = 32, hidden: int = 1280,
                   heads: int = 16, mlp: int = 5120, patch: int = 14, num_classes: int = 1000, meta: bool = True):
    """ViT-H/14: ``(batch, 3, image_size, image_size)`` images to ``(batch, num_classes)`` logits."""
    check(hidden % heads == 0, f"hidden ({hidden}) must be divisible by heads ({heads})")
    check(image_size % patch == 0, f"image_size ({image_size}) must be a multiple of patch ({patch})")
    tf = _transformers()
    config = tf.ViTConfig(image_size=image_size, patch_size=patch, hidden_size=hidden, num_hidden_layers=layers,
                          num_attention_heads=heads, intermediate_size=mlp, num_labels=num_classes)
    with on_meta(meta):
        return Logits(tf.ViTForImageClassification(config), use_cache=None), images(batch, image_size)


ENTRIES = (
    ZooModel(
        name="vit-h-14",
        description="ViT-H/14 image classifier (632M params) via transformers, 4096 x 224x224, on meta",
        build=build_vit_h_14,
        tiny={"batch": 2, "image_size": 32, "layers": 2, "hidden": 32, "heads": 4, "mlp": 64, "patch": 8,
              "num_classes": 10, "meta": False},
        source="Dosovitskiy et al. 2021 (An Image is Worth 16x16 Words), ViT-H/14: hidden 1280, 32 layers, 16 heads, "
               "MLP 5120, patch 14; 224x224 and batch 4096 as the paper's pre-training; a 1000-class ImageNet "
               "(ILSVRC-2012) linear head (num_classes=21843 for ImageNet-21k)",
        requires="transformers",
    ),
)
