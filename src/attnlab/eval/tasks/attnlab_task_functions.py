"""The functions attnlab's task YAMLs name with ``!function attnlab_task_functions.NAME``.

lm-eval before 0.4.12 resolves ``!function MODULE.NAME`` only as the file ``MODULE.py`` beside
the YAML (0.4.12 also imports installed modules), so the YAMLs name this file, which
``write_task_yamls`` copies beside its copies; it takes the functions from installed attnlab.
"""

from attnlab.eval.multiple_choice import hellaswag_process_docs

__all__ = ["hellaswag_process_docs"]
