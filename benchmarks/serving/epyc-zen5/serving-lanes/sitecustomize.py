"""On PYTHONPATH of a served checkout: SWI=seconds sets the GIL's switch interval (section 35's trial)."""

import os
import sys

if os.environ.get("SWI"):
    sys.setswitchinterval(float(os.environ["SWI"]))
