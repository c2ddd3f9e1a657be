"""The conformance check: one battery that proves a part, built-in or plugin, the way
transformers' ``ModelTesterMixin`` and timm's ``test_models.py`` prove every model they ship.

``check_part(slot, kind, **options)`` builds small float64 models around the part, one per
family, mask and position its options and the config validation accept, and checks
causality, KV-cache decoding, batch and padding invariance, the declared parameters and FLOPs,
the state dict and seeded init, ``gradcheck`` on its autograd Functions, ``torch.compile`` and a
bfloat16 forward, and the export loaded by transformers without attnlab. Each property comes
back as a :class:`Result` naming what was measured and, when it fails, the fix::

    from attnlab.testing import check_part
    import my_ideas  # registers the parts

    def test_softcap_conforms():
        check_part("score", "softcap", cap=30.0).assert_passed()

``attnlab check`` runs the same battery from the command line.
"""

from attnlab.testing.battery import PartRequest, check_part, check_parts
from attnlab.testing.result import PROPERTIES, PartReport, Result

__all__ = ["PROPERTIES", "PartReport", "PartRequest", "Result", "check_part", "check_parts"]
