"""``python -m attnlab.eval.lm_eval_cli ...``: the lm-evaluation-harness CLI with the
``attnlab`` model registered (lm-eval 0.4.13 does not discover models from other packages).

Every lm-eval argument works as usual, e.g.::

    python -m attnlab.eval.lm_eval_cli --model attnlab --model_args path=runs/tiny \\
        --tasks attnlab_hellaswag_local --include_path src/attnlab/eval/tasks --device cpu
"""

from __future__ import annotations

import sys


def main() -> None:
    from attnlab.base.errors import UserError
    from attnlab.base.extras import require

    try:
        require("eval", "lm_eval", what="attnlab-lm-eval")
    except UserError as e:
        sys.exit(f"attnlab-lm-eval: error: {e}")
    from lm_eval.__main__ import cli_evaluate

    import attnlab.eval.harness  # noqa: F401  (registers the "attnlab" model)

    cli_evaluate()


if __name__ == "__main__":
    main()
