"""False-decision rates under continuous monitoring: a model with no effect (gain 1.0),
pinned in collaboration, the window read on every tick; how many runs ever cross
the old fixed rule (|z| >= 2) and the new anytime-valid interval (clear of 1).

    python docs/bench/learning-34/error_rates.py 100 3000 0.05
"""
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the checkout
from mlfs.config import parse_config
from mlfs.core.exchange import Exchange
from mlfs.core.modes import efficiency_interval
from tests.core.test_proxy_modes import Scripted, VirtualClock

runs, ticks, noise = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
old_up = old_down = new_up = new_down = 0
for seed in range(runs):
    with tempfile.TemporaryDirectory() as d:
        sub = Scripted(seed=seed); sub.gain = 1.0; sub.noise = noise
        ex = Exchange(parse_config("[modes]\nsilence_seconds = 1e9\n", "test"), Path(d), [sub], clock=VirtualClock())
        rt = ex.runtimes["test.modes"]
        p = rt.create_model("m"); p.start(); p.set_mode(b"collaboration\n"); p.recommend(b"x=1\n")
        ou = od = nu = nd = False
        for t in range(ticks):
            rt.tick()
            if t < 100: continue
            st = p.window.stats()
            iv = efficiency_interval(st)
            ou |= st.confidence >= 2; od |= st.confidence <= -2
            nu |= iv.known and iv.lower > 1; nd |= iv.known and iv.upper < 1
        rt.close()
    old_up += ou; old_down += od; new_up += nu; new_down += nd
print(f"{runs} runs x {ticks} ticks, gain 1.0, noise {noise}: fixed |z|>=2 ever crossed: up {old_up}, down {old_down}; anytime-valid interval ever clear of 1: above {new_up}, below {new_down}")
