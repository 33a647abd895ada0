"""What the chaos tests share: their scale and random choices, and where their figures go."""

import json
import os
import random
import time
from pathlib import Path

from tests.conftest import ROOT


def chaos_scale(scales):
    """(name, scale, seed, rng): the scale CHAOS_SCALE names ("ci" unless set) and a random
    generator seeded with CHAOS_SEED, or from the clock (the seed is in the figures, to replay a run)."""
    name = os.environ.get("CHAOS_SCALE", "ci")
    seed = int(os.environ.get("CHAOS_SEED") or time.time_ns() % 1_000_000)
    return name, scales[name], seed, random.Random(seed)


def publish(figures, name):
    """Print a run's figures and keep them in artifacts/NAME.json."""
    print(f"\n{name} figures: {json.dumps(figures, indent=2)}")
    artifacts = Path(ROOT) / "artifacts"
    artifacts.mkdir(exist_ok=True)
    (artifacts / f"{name}.json").write_text(json.dumps(figures, indent=2) + "\n")
