"""Model parts and their assembly. Nothing here imports training code."""

from attnlab.model.generate import generate
from attnlab.model.output import ModelOutput
from attnlab.model.transformer import Transformer, build_model

__all__ = ["ModelOutput", "Transformer", "build_model", "generate"]
