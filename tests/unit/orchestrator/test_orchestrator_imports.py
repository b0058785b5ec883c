"""The orchestrator is a light process: importing its loop loads neither the trainer nor its stack."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# Checked in a fresh interpreter: in the test process other tests may have imported anything.
PROBE = """
import json, sys
import lorarl.orchestrator.orchestrator
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in ("peft", "torch", "lorarl"))))
"""


@pytest.mark.slow
def test_importing_the_orchestrator_loads_no_trainer_peft_or_fsdp() -> None:
    result = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True)
    modules = json.loads(result.stdout)
    assert "lorarl.orchestrator.orchestrator" in modules  # the probe saw the import
    unwanted = [
        m for m in modules if m == "peft" or m.startswith(("peft.", "torch.distributed.fsdp", "lorarl.trainer"))
    ]
    assert not unwanted, unwanted
