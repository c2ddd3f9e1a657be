"""attnlab: a PyTorch laboratory for transformer attention-block designs."""

from attnlab.config import Config, ConfigError, load_config

__all__ = ["Config", "ConfigError", "__version__", "load_config"]
__version__ = "0.1.0"
