"""``python -m attnlab.eval.lm_eval_cli ...``: the lm-evaluation-harness CLI with the
``attnlab`` model registered (lm-eval 0.4.13 does not discover models from other packages).

Every lm-eval argument works as usual, e.g.::

    python -m attnlab.eval.lm_eval_cli --model attnlab --model_args path=runs/tiny \\
        --tasks attnlab_hellaswag_local --include_path src/attnlab/eval/tasks --device cpu
"""

from __future__ import annotations

import attnlab.eval.harness  # noqa: F401  (registers the "attnlab" model)


def main() -> None:
    from lm_eval.__main__ import cli_evaluate

    cli_evaluate()


if __name__ == "__main__":
    main()
