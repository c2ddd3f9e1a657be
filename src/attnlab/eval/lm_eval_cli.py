"""``python -m attnlab.eval.lm_eval_cli ...``: the lm-evaluation-harness CLI with the
``attnlab`` model registered (lm-eval 0.4.13 does not discover models from other packages).

Every lm-eval argument works as usual, e.g.::

    python -m attnlab.eval.lm_eval_cli --model attnlab --model_args path=runs/tiny \\
        --tasks attnlab_hellaswag_local --include_path src/attnlab/eval/tasks --device cpu
"""

from __future__ import annotations

import sys


def main() -> None:
    """Bad input and a missing extra print one line and exit 2, as every attnlab command; the
    data files of attnlab's local tasks are validated item by item first
    (:mod:`attnlab.eval.lm_eval_files`)."""
    from attnlab.base.errors import UserError
    from attnlab.base.extras import require
    from attnlab.base.import_noise import drop_import_noise

    drop_import_noise()  # lm-eval's transformers imports torchao (base/import_noise.py)
    try:
        require("eval", "lm_eval", "datasets", what="attnlab-lm-eval")
        from lm_eval.__main__ import cli_evaluate

        from attnlab.eval.lm_eval_files import check_task_files

        check_task_files(sys.argv[1:])  # attnlab's local tasks: every item, before lm-eval

        import attnlab.eval.harness  # noqa: F401  (registers the "attnlab" model)

        cli_evaluate()
    except UserError as e:
        print(f"attnlab-lm-eval: error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)


if __name__ == "__main__":
    main()
