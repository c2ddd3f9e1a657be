import sys

try:
    from attnlab.cli import main
except KeyboardInterrupt:  # Ctrl-C during the first imports: no traceback
    print("attnlab: interrupted", file=sys.stderr)
    sys.exit(130)

sys.exit(main())
