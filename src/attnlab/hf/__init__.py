"""attnlab models in Hugging Face transformers: export, loading, and the reverse direction.

Importing this package registers :class:`AttnlabConfig` (``model_type = "attnlab"``) with
``AutoConfig`` and :class:`AttnlabForCausalLM` with ``AutoModelForCausalLM``, so that an exported
folder loads without ``trust_remote_code`` in a process that has imported attnlab::

    import attnlab.hf  # noqa: F401
    model = AutoModelForCausalLM.from_pretrained("exported/")

A model with plugin parts carries their code (``plugins/NAME.py``), which attnlab imports only with
``trust_remote_code=True`` (:mod:`attnlab.hf.export_plugins`). Without attnlab, the folder's own
copy of the code loads it (``trust_remote_code=True``).
``attnlab export`` writes the folder (:mod:`attnlab.hf.export`); ``attnlab train --init-from``
maps GPT-2, GPT-NeoX and Llama checkpoints into attnlab's parts (:mod:`attnlab.hf.init_from`).
"""

from __future__ import annotations

from attnlab.hf.configuration import AttnlabConfig
from attnlab.hf.modeling import AttnlabForCausalLM


def register() -> None:
    """Register the attnlab classes with transformers' Auto classes (idempotent)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    AutoConfig.register(AttnlabConfig.model_type, AttnlabConfig, exist_ok=True)
    AutoModelForCausalLM.register(AttnlabConfig, AttnlabForCausalLM, exist_ok=True)


register()

__all__ = ["AttnlabConfig", "AttnlabForCausalLM", "register"]
